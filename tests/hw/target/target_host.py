# Ref: host/port.py (the one host interface); hw/target/regbank.py, hw/rdma/qp.py, hw/iface.py.
"""Test-side name of the host interface: a thin re-export of :mod:`host.port`.

The cocotb bench (tests/hw/target/cocotb_target.py) and tests/hw/target/test_target_regbank.py import from here.
"""

from host.port import (HostError, TargetHost, TargetPort, ip_value, mac_value, pack_record,
                       record_words, unpack_record)

__all__ = ["TargetHost", "TargetPort", "pack_record", "unpack_record", "record_words",
           "HostError", "ip_value", "mac_value"]
