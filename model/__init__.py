# Ref: issue 19 (a layered tree); docs/architecture.md.
"""The golden model of a KBTP target (model.target) and of the free-block ring (model.ring).
Imports: hw.headers, host (codec, config).
"""
