"""Which fabric frames go to the control band, and the tc commands that put them there."""

from __future__ import annotations

import pytest

from controller import control_queue as cq
from typhoon import wire
from typhoon.runtime import lb_credits as lb
from typhoon.runtime import links as lk
from typhoon.wire import Control, ControlTuple, Kind

A, B = wire.worker_mac(7, 1), wire.worker_mac(7, 2)


def credit(kind: int) -> bytes:
    return wire.pack_frames(B, A, Kind.CREDIT, kind, 3, [wire.encode_credit(v) for v in (0, 5, 6)])[
        0
    ]


@pytest.mark.parametrize("kind", [lk.GRANT, lk.NACK, lk.RESYNC, lb.LB_GRANT])
def test_what_a_receiver_says_about_arrived_frames_goes_first(kind):
    assert cq.is_urgent_frame(credit(kind))


@pytest.mark.parametrize("kind", [lk.SYNC, lb.LB_SYNC])
def test_a_senders_sync_stays_behind_the_data_it_names(kind):
    assert not cq.is_urgent_frame(credit(kind))


def test_data_punctuation_and_other_ethertypes_keep_their_place():
    data = wire.pack_frames(B, A, Kind.DATA, 0, 0, [b"\x91\x91\xa3eos"])[0]  # EOS on stream 0
    ctl = wire.pack_frames(
        B, wire.controller_mac(7), Kind.CONTROL, 0, 0,
        [wire.encode_control(ControlTuple(Control.METRIC_REQ, {"request_id": 1}))],
    )[0]  # fmt: skip
    grant_other_ethertype = credit(lk.GRANT)[:12] + b"\x88\xb6" + credit(lk.GRANT)[14:]
    assert not any(map(cq.is_urgent_frame, [data, ctl, grant_other_ethertype, b"\0" * 10]))


def test_tc_commands_put_the_priority_under_the_links_shaping():
    root = cq.tc_commands(cq.LinkQueueing("s1-eth1"))
    shaped = cq.tc_commands(cq.LinkQueueing("s1-eth1", cq.mininet_parent(True, False)))
    assert root[0][5:7] == ["root", "handle"] and shaped[0][5:8] == ["parent", "5:1", "handle"]
    assert cq.mininet_parent(True, True) == "10:1" and cq.mininet_parent(False, False) is None
    filters = root[1:]
    assert len(filters) == len(cq.URGENT_CREDIT_KINDS)
    for f, kind in zip(filters, cq.URGENT_CREDIT_KINDS, strict=True):
        ematch = f[f.index("match") + 1]
        # the same offsets is_urgent_frame reads
        assert f"u16 at 12 layer link mask 0xffff eq {wire.ETHERTYPE}" in ematch
        assert f"u8 at 15 layer link mask 0xff eq {int(Kind.CREDIT)}" in ematch
        assert f"u16 at 18 layer link mask 0xffff eq {kind}" in ematch
        assert f[-2:] == ["flowid", "7:1"]
