# Ref: issue 7 item 3 (fuzzing); roce-layouts.md §1, §5 (IPv4 checksum, ICRC).
#      draft KBTP §Messages, §Status Codes; tools/fuzz.py.
"""The fuzzer's parts against independent oracles (scapy's checksums and ICRC, the draft's
rules written out by hand), the corpus format, then on the Verilated target: the corpus replayed
and a short fuzz run (a few thousand frames) with every oracle of tools/fuzz.py armed."""

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scapy.layers.inet import IP                                       # noqa: E402
from scapy.layers.l2 import Ether                                      # noqa: E402

from tools import fuzz as F                                              # noqa: E402
from sim.scapy_roce import icrc_of, pcap_roce_frames                 # noqa: E402


def _mutator(seed=1):
    return F.Mutator(random.Random(seed), victim_qpns=[F.T_QPN[i] for i in F.VICTIM_QPS],
                     protected_qpns=[F.T_QPN[F.ROLE_KBTP], F.T_QPN[F.ROLE_PROBE]])


def _consistent(f):
    """An IPv4 (IHL 5) RoCE frame whose IPv4 Total Length matches its size: scapy and the
    draft then agree on what the ICRC covers."""
    return (F.is_roce(f) and f[14] == 0x45 and int.from_bytes(f[16:18], "big") == len(f) - 14
            and len(f) >= 62 and f[23] == 17 and not int.from_bytes(f[20:22], "big") & 0x3FFF)


def test_ip_checksum_and_icrc_against_scapy():
    m = _mutator(2)
    frames = pcap_roce_frames()
    assert frames
    n = 0
    for cls in list(F.RAW_MIX) * 40:
        f = m.mutate(cls, m.readdress(random.Random(n).choice(frames)))
        n += 1
        if not _consistent(f):
            continue
        ip = Ether(f)[IP]
        want = ip.chksum
        del ip.chksum
        if F.fix_ip(f) == f:        # our checksum is right iff scapy's recomputation agrees
            assert IP(bytes(ip)).chksum == want
        assert F.icrc_ok(F.fix_icrc(f))
        assert icrc_of(F.fix_icrc(f)) == F.fix_icrc(f)[-4:]
    assert n > 300


def test_mutations_stay_off_the_clean_qps():
    m = _mutator(3)
    frames = pcap_roce_frames()
    rng = random.Random(5)
    protected = {F.T_QPN[F.ROLE_KBTP], F.T_QPN[F.ROLE_PROBE]}
    hello = 0
    for k in range(3000):
        cls = rng.choice(list(F.RAW_MIX))
        f = m.mutate(cls, m.readdress(rng.choice(frames)))
        if f[0:6] == F._mac(F.T_MAC):
            assert F.dest_qpn(f) not in protected, (cls, f.hex())
        if F.is_roce(f) and f[42] in (0x00, 0x04):
            at = 54 + 1
            if len(f) > at:
                hello += f[at] == 1
    assert hello == 0


def test_icrc_bad_frames_are_otherwise_valid():
    m = _mutator(4)
    for f0 in pcap_roce_frames():
        f = m.icrc_bad(f0)
        assert not F.icrc_ok(f)
        e = Ether(f)
        assert e.dst == F.T_MAC and e[IP].dst == F.T_IP and e[IP].proto == 17
        assert f[36:38] == (4791).to_bytes(2, "big")
        ip = e[IP]
        want = ip.chksum
        del ip.chksum
        assert IP(bytes(ip)).chksum == want                 # IPv4 header still valid
        assert F.dest_qpn(f) in [F.T_QPN[i] for i in F.VICTIM_QPS]


def _hdr(version=1, opcode=0x10, flags=0, rid=7, handle=0x4000, gen=0, status=0):
    """A common header written from the draft's table (not from hw.headers)."""
    return (bytes([version, opcode]) + flags.to_bytes(2, "big") + rid.to_bytes(8, "big")
            + handle.to_bytes(8, "big") + gen.to_bytes(2, "big") + status.to_bytes(2, "big"))


def _dd(stag=0x1234, to=0, length=64):
    return stag.to_bytes(4, "big") + to.to_bytes(8, "big") + length.to_bytes(4, "big")


def test_expected_status_follows_the_draft():
    from sim.serve import large_config as model_config
    cfg = model_config()
    from hw.headers import Status
    MAL, BIG = Status.MALFORMED.value, Status.TOO_LARGE.value
    load = _hdr(opcode=0x10) + _dd()
    assert F.expected_status(load, cfg) is None                      # a valid LOAD
    assert F.expected_status(load[:23], cfg) == MAL                  # truncated header
    assert F.expected_status(load[:30], cfg) == MAL                  # truncated descriptor
    assert F.expected_status(_hdr(version=2) + _dd(), cfg) == MAL     # Version != 1
    assert F.expected_status(_hdr(opcode=0xEE) + _dd(), cfg) == MAL   # unknown opcode
    assert F.expected_status(_hdr(status=1) + _dd(), cfg) == MAL      # status in a request
    assert F.expected_status(load + b"\0", cfg) == MAL               # trailing octet
    inline = _hdr(opcode=0x11, flags=0x0001) + _dd(stag=0, length=cfg.max_inline + 4)
    # INLINE store longer than Max Inline -> TOO_LARGE (the draft's status for it)
    assert F.expected_status(inline + bytes(cfg.max_inline + 4), cfg) == BIG
    # inline length differs from the descriptor Length -> MALFORMED
    assert F.expected_status(_hdr(opcode=0x11, flags=0x0001) + _dd(stag=0, length=8)
                             + bytes(4), cfg) == MAL


def test_kbtp_mutations_mostly_malformed_never_hello():
    from sim.serve import large_config as model_config
    cfg = model_config()
    rng = random.Random(9)
    base = _hdr(opcode=0x10) + _dd()
    verdicts = {}
    for _ in range(2000):
        raw = F.kbtp_mutate(rng, base)
        assert len(raw) < 2 or raw[1] not in (0x01, 0x30)       # HELLO, GOODBYE
        v = F.expected_status(raw, cfg)
        verdicts[v] = verdicts.get(v, 0) + 1
    assert verdicts.get(None, 0) > 50                          # some still decode
    assert sum(n for v, n in verdicts.items() if v is not None) > 1000


def test_corpus_format(tmp_path):
    entries = F.load_corpus()
    assert entries, "tests/fuzz_corpus holds no entries"
    names = set()
    for e in entries:
        assert {"name", "class", "kind", "hex", "fcs_ok", "why"} <= set(e), e
        assert e["kind"] in ("frame", "kbtp")
        assert e["name"] not in names
        names.add(e["name"])
        raw = bytes.fromhex(e["hex"])
        if e["kind"] == "frame" and raw[0:6] == F._mac(F.T_MAC):
            assert F.dest_qpn(raw) not in (F.T_QPN[F.ROLE_KBTP], F.T_QPN[F.ROLE_PROBE])
    F.save_corpus(tmp_path / "c.json", entries[:3])
    assert F.load_corpus(tmp_path / "c.json") == entries[:3]
    assert json.loads((tmp_path / "c.json").read_text())["version"] == 1


# ---- on the gateware ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fz():
    F._init_reg()
    f = F.Fuzzer(seed=11, log=print, mem_every=4)
    f.setup()
    yield f
    f.close()


def test_replay_corpus(fz):
    """Every corpus frame again: no hang, no write outside authorized areas, the kbtp entries'
    status, exact MAC accounting."""
    fz.first_counters = fz.counters()
    fz._frames_at_snap, fz.snap_counters = fz.frames_to_target, fz.first_counters
    entries = [e for e in F.load_corpus() if not e.get("known_bug")]
    fails = fz.replay(entries)
    assert not fails, fails[:3]
    assert fz.hangs == 0 and fz.unauthorized == 0
    assert fz.probes_ok >= len(entries)


def test_short_fuzz(fz):
    """A few thousand mutated frames with every oracle; the figures are printed."""
    fz.findings.clear()
    fz.avoid = list(F.KNOWN_BUGS.values())
    sent0, ok0 = fz.probes_sent, fz.probes_ok
    fz.run(2500, batch=500, kbtp_share=0.04, exact_every=3)
    s = fz.summary()
    print(json.dumps(s, indent=1, default=str))
    assert s["hangs"] == 0
    assert s["unauthorized_writes"] == 0
    assert not fz.findings, fz.findings[:3]
    # A probe after every batch (at least 2500 / 500 of them; how many batches the exact ICRC /
    # FCS batches add depends on timing), and every one answered as the model says.
    assert s["probes_ok"] - ok0 == s["probes_sent"] - sent0 >= 5
    moved = s["counters_moved"]
    assert moved.get("icrc.cnt_bad", 0) >= s["frames_by_class"]["icrc_bad"]
    assert moved.get("mac.rx_fcs_errors", 0) >= s["frames_by_class"]["fcs_bad"]
    st = s["completions_by_status"]
    assert st.get("kbtp:MALFORMED", 0) > 20, st


def test_driver_and_peer_errors_fail_the_run(fz, monkeypatch):
    """Oracle 5: an exception of the host driver or of a peer endpoint (neither under fuzz)
    fails the run, naming the error; the run's figures are still complete."""
    real_poll, real_tick = fz.driver.poll, fz.victim.tick
    calls = {"poll": 0, "tick": 0}

    async def poll(now_ms):
        calls["poll"] += 1
        if calls["poll"] == 3:
            raise RuntimeError("injected driver fault")
        return await real_poll(now_ms)

    def tick(now):
        calls["tick"] += 1
        if calls["tick"] == 5:
            raise ValueError("injected peer fault")
        return real_tick(now)

    monkeypatch.setattr(fz.driver, "poll", poll)
    monkeypatch.setattr(fz.victim, "tick", tick)
    fz.findings.clear()
    with pytest.raises(F.Failure, match="injected driver fault") as exc:
        fz.run(40, batch=40)
    assert "injected peer fault" in str(exc.value)
    s = fz.summary()
    assert s["host_errors"] == 1 and s["peer_errors"] == 1, s
    assert s["frames"] >= 40 and s["hangs"] == 0
    fz.errors.clear()                       # the fixture's target carries on
    fz.host_errors = fz.peer_errors = 0


def test_known_bugs(fz):
    """The corpus frames of the bugs the fuzzer found (fixed since): each must leave the target
    working. Runs last (a hang restarts the target)."""
    entries = [e for e in F.load_corpus() if e.get("known_bug")]
    assert entries
    fz.findings.clear()
    fz.restart_on_hang = False              # the first hang is the answer; no restart
    F.PROBE_CYCLES = 200_000                # the healthy probe needs a few thousand cycles
    fails = fz.replay(entries)
    assert not fails, [(n, [f["why"][:200] for f in fs]) for n, fs in fails]
    # Some bugs stop the receive path only a request or two later (truncated_forged_icrc: the
    # second probe after it): the target must keep serving.
    for _ in range(3):
        assert fz.probe(), fz.findings[-1]["why"][:300]
