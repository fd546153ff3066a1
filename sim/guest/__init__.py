# Ref: docs/softroce-vm.md
"""A Linux soft-RoCE (rdma_rxe + pyverbs) guest under QEMU TCG: the real RoCEv2 initiator for tests.

- :mod:`sim.guest.build` builds and caches the image (``python -m sim.guest.build``);
- :mod:`sim.guest.run` boots it with a script and returns the script's exit status and output.
"""
