# Ref: issue 19 (a layered tree); docs/architecture.md.
"""A Python RoCEv2 RC endpoint with the InfiniBand CM over RoCEv2 (the peer of the simulations
and the target-side CM's frame codec). Imports: hw.headers only.
"""
