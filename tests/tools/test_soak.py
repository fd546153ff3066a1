# Ref: issue 7 item 2: the soak, short version; tools/soak.py; sim/system.py.
"""A short soak on the one-clock width-8 unit target (the shipped core's: tests/system/test_shipped.py):
a few hundred mixed KBTP operations (4 initiators, one in direct modes)
through 1 % loss, 1 % duplication and 0.1 % corruption both ways, every round matched to the
golden model, final image, counters and block census checked (tools/soak.py)."""

from tools.soak import report, soak
from sim.vltarget import HW_DEFAULT


def test_soak_short():
    f = soak(ops=300, loss=0.01, dup=0.01, corrupt=0.001, seed=7, params=HW_DEFAULT)
    report(f)
    assert f["ops"] >= 300
    assert f["census"]["lost"] == 0 and f["census"]["duplicated"] == 0
    assert f["census"]["in_rings"] + f["census"]["in_table"] + f["census"]["pending"] \
        == f["census"]["blocks"]
    # the link really impaired traffic and both ends really recovered from it
    assert f["link"]["lost"] > 0 and f["link"]["duplicated"] > 0
    assert f["peer"]["retransmissions"] + f["target_requester"]["cnt_retransmits"] > 0
    kinds = f["kinds"]
    for k in ("ALLOC_STORE_inline", "ALLOC_STORE_read", "STORE_inline", "LOAD", "FREE",
              "DIRECT_LOAD", "DIRECT_ALLOC+BIND"):
        assert kinds.get(k, 0) > 0, (k, kinds)


def test_block_census_finds_lost_and_duplicated_blocks():
    """The census itself: a fresh model image has every block in its ring; a block copied into
    a valid table entry is duplicated; a slot marked consumed with no owner loses a block."""
    from host import codec
    from model.target import TargetModel
    from sim.system import block_census, model_config
    m = TargetModel(model_config(direct_partitions=1, direct_quota=4, masked=False))
    img = bytearray(m.mem[0:len(m.mem)])

    def census():
        c = block_census(m, lambda a, n: bytes(img[a:a + n]))
        return c["in_rings"], c["in_table"], c["lost"], c["duplicated"]

    assert census() == (12, 0, 0, 0)
    lay, cfg = m.lay, m.cfg
    e = lay["table"] + 16 * 5
    img[e:e + 16] = codec.encode_entry(1, 1, 10, cfg.block_offset(3))      # VALID
    assert census() == (12, 1, 0, 1)
    img[e:e + 16] = bytes(m.mem[e:e + 16])
    s = lay["ring"] + 16 * 2
    seq, _ = codec.decode_slot(bytes(img[s:s + 16]))
    img[s:s + 16] = codec.encode_slot(seq, (1 << 64) - 1)
    assert census() == (11, 0, 1, 0)
