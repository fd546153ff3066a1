# Ref: issue 22 item 4; tools/init_time.py; sim/vllink.py.
"""``make init-time`` at a small scale: the driver's set-up over the UDP host link of the shipped
core. The full scale (65,536 handles and ring slots) is ``make init-time``."""

from tools.init_time import init_time


def test_init_time_small_over_udp():
    out = init_time(handles=1024, blocks=1024, block_size=1024, link="udp")
    # Table and ring: 16 octets per handle and per slot, at least.
    assert out["octets"] >= 16 * (1024 + out["ring_slots"]) and out["ring_slots"] == 1024
    link = out["udplink"]
    assert link["retransmits"] == 0 and link["bad"] == 0, link
    # The wire carries one octet per GMII cycle: the set-up cannot take fewer cycles than the
    # link's frames to the target (and it must have carried every octet written).
    assert link["frame_octets_out"] >= out["octets"]
    assert out["gmii_cycles"] >= link["frame_octets_out"], out
