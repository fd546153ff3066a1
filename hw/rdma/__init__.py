# Ref: issue 19 (a layered tree); docs/architecture.md.
"""The RoCEv2 RC transport: BTH and extended-header parse/build, QP and MR tables, the
responder, the requester, the TX path, the raw (QP1/CM) queues. Imports: hw.headers,
hw.iface, hw.lib, hw.net.
"""
