# Ref: issue 19 (a layered tree); docs/architecture.md.
"""Ethernet and IP: the GMII MAC, RGMII, the MAC clock crossing, ARP, IPv4/UDP receive and
transmit, the RoCEv2 ICRC. Imports: hw.headers, hw.iface, hw.lib.
"""
