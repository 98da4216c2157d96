"""Which fabric frames go to the control band, and the tc commands that put them there."""

from __future__ import annotations

import pytest

from typhoon import control_queue as cq
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


def test_tc_commands_split_the_links_rate_class_and_classify_every_frame():
    cmds = cq.tc_commands(cq.LinkQueueing("s1-eth1", 400))
    control, data = cq.classes(cq.LinkQueueing("s1-eth1", 400))
    assert (control, data) == ("5:10", "5:20")
    ctl_class, data_class = cmds[0], cmds[1]
    assert ctl_class[ctl_class.index("parent") + 1] == "5:1"
    assert ctl_class[ctl_class.index("prio") + 1] == "0" and data_class[-1] == "1"
    assert ctl_class[ctl_class.index("ceil") + 1] == "400mbit" == data_class[-3]
    filters = cmds[2:]
    assert len(filters) == len(cq.URGENT_CREDIT_KINDS) + 1
    for f, kind in zip(filters, cq.URGENT_CREDIT_KINDS, strict=False):
        text = " ".join(f)
        # the offsets is_urgent_frame reads, counted from the end of the Ethernet header
        assert f"match u16 {wire.ETHERTYPE:#06x} 0xffff at -2" in text
        assert f"match u8 {int(Kind.CREDIT)} 0xff at 1" in text
        assert f"match u16 {kind} 0xffff at 4" in text
        assert f[-2:] == ["flowid", control]
    assert filters[-1][-6:] == ["match", "u32", "0", "0", "flowid", data]  # the rest: data


def test_a_control_queue_needs_a_rate_and_no_delay():
    from mininet_env.fabric import FabricPlan

    FabricPlan(hosts=2, bw_mbit=100, control_queue=True)
    for bad in ({}, {"bw_mbit": 100, "delay": "1ms"}):
        with pytest.raises(ValueError, match="control queue"):
            FabricPlan(hosts=2, control_queue=True, **bad)
