# Ref: issue 19 (a layered tree); docs/architecture.md.
"""The KBTP engine run in the NIC (LOAD, STORE, ALLOC_STORE) and its ring allocator.
Imports: hw.headers, hw.iface, hw.lib (and hw.rdma's interfaces).
"""
