# Ref: issue 19 (a layered tree); docs/architecture.md.
"""General gateware blocks: streams and register slices, width converters and packet
FIFOs, the target-memory bus with its arbiter and RAM, the masked FetchAdd unit.
Imports: hw.headers, hw.iface and nothing else of the project.
"""
