# KBTP target: one Makefile for set-up, tests and the demo.
# Ref: README.md (the two set-up commands), .ci/run (CI runs `make install` then `make test`).

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
# Debian packages the project needs on a fresh Debian 12 machine.
APT_PKGS ?= build-essential make git python3-venv iverilog qemu-system-x86 debootstrap cpio debian-archive-keyring openfpgaloader tshark

export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install apt venv test test-fast test-wide demo demo-model serve serve-model clean

install: apt venv install-dissector litedram

# KBTP dissector for Wireshark/tshark (tools/wireshark/kbtp.lua) into the personal Lua plugin
# folder, where Wireshark and tshark load it at start; harmless where tshark is absent.
WIRESHARK_PLUGINS ?= $(HOME)/.local/lib/wireshark/plugins
.PHONY: install-dissector
install-dissector:
	@mkdir -p $(WIRESHARK_PLUGINS) && cp tools/wireshark/kbtp.lua $(WIRESHARK_PLUGINS)/kbtp.lua && \
	  echo "dissector: tools/wireshark/kbtp.lua -> $(WIRESHARK_PLUGINS)/kbtp.lua" \
	  "$$(command -v tshark >/dev/null || echo '(tshark not installed: used once it is)')"

apt:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "apt: all of $(APT_PKGS) present"; fi; \
	else echo "apt: not root or no apt-get; install by hand: $(APT_PKGS)"; fi

$(VENV)/.installed: requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps -e .
	touch $@

venv: $(VENV)/.installed

test: install
	$(PY) -m pytest -q --durations=40 tests

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" tests

# Runs kept out of `make test` for their time (CI runs the suite on 2 cores in 90 minutes); each
# stop's closing note quotes them. `make timing`: the ECPIX-5 place and route of the shipped
# core at the board's seed (~40 min of one core); when every clock meets its constraint it
# writes boards/timing_records/ecpix5.json, the record `make test` checks the tree's netlist
# against (boards/timing.py): commit it with any change of the gateware. `make test-scale`: the DDR3
# system bench at issue 22's pool scale, 65,536 handles (~18 min; the suite: 16,384).
.PHONY: timing seeds test-scale
timing: install
	$(PY) -m boards timing --board ecpix5

# `make seeds SEEDS=4-9 JOBS=2`: one synthesis, then place and route at each seed, JOBS at once
# (build/seeds/s<N>/ecpix5), a line of clocks per seed (boards/seeds.py); a seed that met every
# clock is recorded with `python -m boards timing --from-build build/seeds/s<N>` once
# boards/ecpix5.py's nextpnr_seed is N. Default: the board's seed and the next two.
SEEDS ?=
JOBS  ?= 2
seeds: install
	$(PY) -m boards seeds --board ecpix5 $(if $(SEEDS),--seeds $(SEEDS)) --jobs $(JOBS)

test-scale: install
	KBTP_POOL_HANDLES=65536 $(PY) -m pytest -q -n 0 -s tests/system/test_ddr3.py

# The transport's system bench at both datapath widths (8 and 64; width 64 builds for ~10 min).
test-wide: $(VENV)/.installed
	KBTP_TARGET_WIDTHS=8,64 $(PY) -m pytest -q tests/hw/target/test_target_cocotb.py

# The end-to-end demo: kbtp-sim serve (the Verilated gateware + host driver + CM) and the
# soft-RoCE guest running tests/e2e/demo.py (builds the guest image and the simulator first if
# needed; `python -m tools.serve_demo --backend model` serves the golden model instead). The
# golden model alone on the draft's example flows: `make demo-model`.
demo: install
	$(PY) -m tools.serve_demo

demo-model: install
	$(PY) -m tools.demo

# Serve the Verilated gateware (KbtpTarget + host driver + CM) on Ethernet-frames-in-UDP (QEMU
# -netdev dgram) at the default ports; `make serve-model` serves the golden model instead.
SERVE_ARGS ?=
serve: $(VENV)/.installed
	$(PY) -m sim.serve serve $(SERVE_ARGS)

serve-model: $(VENV)/.installed
	$(PY) -m sim.serve serve --model $(SERVE_ARGS)

clean:
	rm -rf $(VENV) $(LD_VENV) build sim_build .pytest_cache

# Soft-RoCE guest image (Linux rdma_rxe + pyverbs under QEMU TCG), cached in build/guest
# (KBTP_GUEST_DIR overrides); rebuilt only when its inputs change. See sim/guest/build.py.
.PHONY: guest
guest: install
	$(PY) -m sim.guest.build

# ECP5 board flow (boards/): YoWASP yosys + nextpnr-ecp5 + ecppack, report in build/<board>/.
# `make bitstream BOARD=versa`, `make program` (openFPGALoader), `make synth-check` (CI: ECPIX-5
# synthesis + place and route; fails when a clock misses its constraint). CORE= picks the core
# (the ECPIX-5's default kbtp holds its memory in the DDR3 through LiteDRAM, built first by
# `make litedram`; CORE=kbtp-bram in block RAM; the Versa's kbtp core holds it in its 128 MB of
# DDR3, `make litedram-versa`, which `make bitstream BOARD=versa` runs first), SEED= the nextpnr
# placement seed (default: BoardSpec.nextpnr_seed, 1 on the ECPIX-5).
BOARD ?= ecpix5
CORE  ?=
SEED  ?=
.PHONY: bitstream program synth-check
bitstream: $(VENV)/.installed $(if $(filter ecpix5,$(BOARD)),litedram) \
           $(if $(filter versa,$(BOARD)),litedram-versa)
	$(PY) -m boards build --board $(BOARD) $(if $(CORE),--core $(CORE)) $(if $(SEED),--seed $(SEED))

program:
	$(PY) -m boards program --board $(BOARD)

synth-check: $(VENV)/.installed litedram
	$(PY) -m boards synth-check --board ecpix5 $(if $(CORE),--core $(CORE)) $(if $(SEED),--seed $(SEED))

# Fmax and area of the 10 Gb/s configuration (KbtpTarget behind the XGMII MAC, width 64, one
# 156.25 MHz clock; 128 KiB of block RAM) on the ECPIX-5's ECP5, for comparison: no 10G board
# here, its ports on a shift register (boards/xgmii10g.py). build/ecpix5-10g/report.json.
.PHONY: fmax-10g
fmax-10g: $(VENV)/.installed
	$(PY) -m boards.xgmii10g $(if $(SEED),--seed $(SEED))

# ECP5 cells (LUT4, FF, carry, LUT RAM, EBR) of each block of a configuration's target, each
# synthesised alone (tools/area.py): where the area goes, ~15 min at depth 2 for the shipped
# core. AREA_ARGS="--config 10g --depth 1 --only eng,req --out F.json".
AREA_ARGS ?= --config ecpix5 --depth 2
.PHONY: area
area: $(VENV)/.installed
	$(PY) -m tools.area $(AREA_ARGS)

# Logic depth of every core-clock register input of the last build's netlist, worst first
# (tools/depth.py): the paths to pipeline for a faster core clock, found in one pass rather
# than one place-and-route each. Needs build/$(BOARD)/top.json (`make bitstream`, or
# `python -m boards build --pack-only`). DEPTH_ARGS="--clock core --top 40 --path 5".
DEPTH_ARGS ?=
.PHONY: depth
depth: $(VENV)/.installed
	$(PY) -m tools.depth build/$(BOARD)/top.json $(DEPTH_ARGS)

# LiteDRAM DDR3 controller of the ECPIX-5 as Verilog (boards/litedram_gen.py, issue 22), in its
# own venv (migen/LiteX/LiteDRAM pinned in boards/litedram-requirements.txt): build/litedram/
# (ECP5DDRPHY core) and build/litedram_sim/ (the same controller on SDRAMPHYModel).
# `make litedram-timing` measures its native port in migen simulation (~6 min).
LD_VENV ?= .venv-litedram
.PHONY: litedram litedram-timing
$(LD_VENV)/.installed: boards/litedram-requirements.txt
	python3 -m venv $(LD_VENV)
	$(LD_VENV)/bin/pip install -q -r boards/litedram-requirements.txt
	touch $@
LD_CORES = build/litedram/init_program.json build/litedram_sim/init_program.json
litedram: $(LD_CORES)
build/litedram/init_program.json: boards/litedram_gen.py $(LD_VENV)/.installed
	$(LD_VENV)/bin/python boards/litedram_gen.py --out build/litedram
build/litedram_sim/init_program.json: boards/litedram_gen.py $(LD_VENV)/.installed
	$(LD_VENV)/bin/python boards/litedram_gen.py --out build/litedram_sim --sim
litedram-timing: $(LD_VENV)/.installed
	$(LD_VENV)/bin/python -m tools.litedram_timing

# The Versa ECP5's controller (MT41K64M16, 128 MiB; boards/litedram_gen.py --board versa):
# build/litedram_versa/. Only `make bitstream BOARD=versa` needs it (not install, not test).
.PHONY: litedram-versa
litedram-versa: build/litedram_versa/init_program.json
build/litedram_versa/init_program.json: boards/litedram_gen.py $(LD_VENV)/.installed
	$(LD_VENV)/bin/python boards/litedram_gen.py --out build/litedram_versa --board versa

# Cycle-exact goodput / op rate / latency / resources (tools/bench.py; Verilated target via
# sim/vltarget.py): build/bench/bench.json, bench.csv, goodput_w<width>.png.
# BENCH_ARGS="--quick" for two sizes; "--configs 8" for one configuration; "--configs 10g" for
# the 10 Gb/s configuration (XGMII at 156.25 MHz, width 64; not in the default set).
BENCH_ARGS ?=
.PHONY: bench
bench: $(VENV)/.installed
	$(PY) -m tools.bench --out build/bench $(BENCH_ARGS)

# Soak (tools/soak.py): 10 000 mixed KBTP ops from 4 initiators over a lossy link, against the
# golden model, on the Verilated target (sim/vltarget.py). SOAK_ARGS="--loss 0.05 --dup 0.05".
SOAK_ARGS ?=
.PHONY: soak
soak: $(VENV)/.installed
	$(PY) -m tools.soak --ops 10000 --loss 0.01 --dup 0.01 --corrupt 0.001 --seed 1 $(SOAK_ARGS)

# FREE rate over the UDP host link (issue 23; tools/free_rate.py): the driver on the shipped
# core (Verilated, udp_link in), FREE bursts and ALLOC_STORE+FREE cycles of 4 KiB blocks, per-FREE
# link figures and the UART equivalent; build/free_rate.json. FREE_RATE_ARGS="--turnaround-ns 0".
FREE_RATE_ARGS ?=
.PHONY: free-rate
free-rate: $(VENV)/.installed
	$(PY) -m tools.free_rate --json build/free_rate.json $(FREE_RATE_ARGS)

# Pool-scale set-up time (issue 22 item 4; tools/init_time.py): the driver writes a table of
# 65,536 handles and a ring of 65,536 slots into the shipped core's DDR3 over the UDP host link,
# simulated at the board's clocks. INIT_TIME_ARGS="--link bus" for the direct host bus.
INIT_TIME_ARGS ?=
.PHONY: init-time
init-time: $(VENV)/.installed
	@mkdir -p build
	$(PY) -m tools.init_time --json build/init_time.json $(INIT_TIME_ARGS)

# Fuzz the whole Verilated target (issue 7 item 3): FUZZ_FRAMES mutated and random frames,
# oracles in tools/fuzz.py; the summary also goes to build/fuzz.json.
FUZZ_FRAMES ?= 100000
FUZZ_SEED   ?= 1
.PHONY: fuzz
fuzz: $(VENV)/.installed
	@mkdir -p build
	$(PY) -m tools.fuzz --frames $(FUZZ_FRAMES) --seed $(FUZZ_SEED) --json build/fuzz.json
