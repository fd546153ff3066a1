# Ref: issue 24 (kbtp-perf in the soft-RoCE guest); host/perf.py.
"""Guest script: ``kbtp-perf`` (:mod:`host.perf`) with the runner's arguments."""
import sys

from host.perf import main

sys.exit(main(sys.argv[1:]))
