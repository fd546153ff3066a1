# Ref: docs/architecture.md (the layers); tests/test_layers.py.
"""Tools built on the simulation harnesses: the benchmark (``python -m tools.bench``), the soak
(``tools.soak``), the fuzzer (``tools.fuzz``), the demos (``tools.demo``, ``tools.serve_demo``),
the kbtp-perf runner (``tools.perf_run``), the target-time report (``tools.target_time``), and
the Wireshark dissector with its generator (``tools/wireshark``). Nothing below imports them.
"""
