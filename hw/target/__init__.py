# Ref: issue 19 (a layered tree); docs/architecture.md.
"""The whole target: transport + engine + host queues behind GMII or MAC streams, the host
register bank, the UART host link. Imports anything of hw.
"""
