"""The core's pure parts: the rule composer, switch sync (returns messages) and the
control channel, each without Ryu's event loop or a switch."""

from __future__ import annotations

import pytest

from controller.control_channel import ControlChannel
from controller.framework.ryu_compat import ofproto_v1_3, ofproto_v1_3_parser
from controller.rules.composer import DEFAULT_RULES, RuleComposer, Source
from controller.rules.cookies import RuleKind, make_cookie
from controller.rules.flows import RuleSpec, match, meter, output
from controller.rules.groups import Bucket, GroupSpec, lb_group_id
from controller.rules.meters import sampling_meter
from controller.rules.view import ClusterView
from controller.switch_sync import SwitchSync
from typhoon import wire
from typhoon.cluster import Cluster, HostInfo
from typhoon.wire import Control, ControlTuple, Kind

APP = 7


def rule(in_port: int, out: int, kind: RuleKind = RuleKind.LOCAL, prio: int = 100) -> RuleSpec:
    return RuleSpec(prio, match(in_port=in_port), (output(out),), make_cookie(APP, kind, in_port))


def view() -> ClusterView:
    return ClusterView(Cluster({"h1": HostInfo("h1", "br1", 1)}), {})


# ----- composer ----------------------------------------------------------------------------


def test_every_source_combines_through_one_door():
    c = RuleComposer()
    extra, kept, shadowed = rule(1, 2), rule(3, 4), rule(1, 9)
    group = GroupSpec(lb_group_id(APP, 0), (Bucket(1, (output(5),)),))
    c.set(Source.EXTRA, "a", {"h1": frozenset({extra})})
    c.set(Source.KEPT, "exec", {"h1": frozenset({kept, shadowed})})
    c.set(Source.GROUPS, "lb", lambda v: ({"h1": frozenset({group})}, {}))
    c.set(Source.OVERLAY, "dbg", lambda host, rules: rules | {rule(8, 8)})
    rules, groups = c.compose(view())
    # kept rules yield to a current rule with their match; the overlay sees everything
    assert rules["h1"] == DEFAULT_RULES | {extra, kept, rule(8, 8)}
    assert groups == {"h1": frozenset({group})}
    assert c.clear(Source.OVERLAY, "dbg") and not c.clear(Source.OVERLAY, "dbg")
    assert rule(8, 8) not in c.compose(view())[0]["h1"]


def test_a_failing_contribution_is_skipped_not_fatal():
    c = RuleComposer()

    def broken(*_):
        raise RuntimeError("bug")

    c.set(Source.GROUPS, "lb", broken)
    c.set(Source.OVERLAY, "dbg", broken)
    c.set(Source.EXTRA, "a", {"h1": frozenset({rule(1, 2)})})
    rules, groups = c.compose(view())
    assert rules["h1"] == DEFAULT_RULES | {rule(1, 2)} and groups == {}


# ----- switch sync -------------------------------------------------------------------------


class FakeDatapath:
    ofproto = ofproto_v1_3
    ofproto_parser = ofproto_v1_3_parser

    def __init__(self, dpid: int = 1) -> None:
        self.id = dpid
        self.xid = 0

    def set_xid(self, msg) -> int:
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid


def kinds(msgs) -> list[str]:
    out = []
    for m in msgs:
        name = type(m).__name__
        if name == "OFPFlowMod":
            name += {0: ":add", 1: ":modify", 2: ":modify", 3: ":delete", 4: ":delete"}[m.command]
        elif name == "OFPMeterMod":
            name += {0: ":add", 1: ":modify", 2: ":delete"}[m.command]
        elif name == "OFPGroupMod":
            name += {0: ":add", 1: ":modify", 2: ":delete"}[m.command]
        out.append(name)
    return out


def test_sync_returns_messages_and_waits_for_what_the_switch_holds():
    sync, dp = SwitchSync(), FakeDatapath()
    asks = sync.connected(dp)
    assert kinds(asks) == [
        "OFPGroupDescStatsRequest",
        "OFPMeterConfigStatsRequest",
        "OFPFlowStatsRequest",
    ]
    desired = DEFAULT_RULES | {rule(1, 2)}
    group = GroupSpec(lb_group_id(APP, 0), (Bucket(1, (output(5),)),))
    assert sync.reconcile(dp, "h1", desired, frozenset({group})) == []  # nothing read yet
    assert not sync.flow_stats(dp, [], more=True)
    assert sync.flow_stats(dp, [], more=False)
    assert sync.reconcile(dp, "h1", desired, frozenset({group})) == []  # groups not read yet
    assert sync.group_descs(dp, [], more=False)
    assert sync.reconcile(dp, "h1", desired, frozenset({group})) == []  # meters not read yet
    assert sync.meter_configs(dp, [], more=False)
    msgs = sync.reconcile(dp, "h1", desired, frozenset({group}))
    # a group exists before any rule could point at it; one barrier closes the batch
    assert kinds(msgs) == ["OFPGroupMod:add", *["OFPFlowMod:add"] * 2, "OFPBarrierRequest"]
    assert not sync.synced()
    sync.barrier_reply(dp.id, msgs[-1].xid)
    assert sync.synced()
    assert sync.reconcile(dp, "h1", desired, frozenset({group})) == []  # nothing moved
    msgs = sync.reconcile(dp, "h1", DEFAULT_RULES, frozenset())
    assert kinds(msgs) == ["OFPFlowMod:delete", "OFPGroupMod:delete", "OFPBarrierRequest"]


def test_meters_come_before_the_rules_that_use_them_and_go_after():
    sync, dp = SwitchSync(), FakeDatapath()
    sync.connected(dp)
    sync.flow_stats(dp, [], more=False)
    sync.group_descs(dp, [], more=False)
    sync.meter_configs(dp, [], more=False)
    m = sampling_meter(65000, 100)
    copy = RuleSpec(
        100, match(in_port=1), (meter(m.meter_id), output(65000)), rule(1, 2).cookie, table_id=1
    )
    msgs = sync.reconcile(dp, "h1", DEFAULT_RULES | {copy}, frozenset(), frozenset({m}))
    assert kinds(msgs) == ["OFPMeterMod:add", *["OFPFlowMod:add"] * 2, "OFPBarrierRequest"]
    assert sync.installed_meters[dp.id] == {m}
    msgs = sync.reconcile(dp, "h1", DEFAULT_RULES, frozenset(), frozenset())
    assert kinds(msgs) == ["OFPFlowMod:delete", "OFPMeterMod:delete", "OFPBarrierRequest"]
    assert sync.installed_meters[dp.id] == set()


def test_a_switch_that_refuses_the_meter_read_is_reconciled_without_meters():
    sync, dp = SwitchSync(), FakeDatapath()
    flows_req = sync.connected(dp)[2]
    meter_req = sync.connected(dp)[1]
    for req in (flows_req, meter_req):
        dp.set_xid(req)
        req.serialize()
    sync.flow_stats(dp, [], more=False)
    sync.group_descs(dp, [], more=False)
    # an error about another request changes nothing: the meter reply may still come
    assert not sync.request_failed(dp, bytes(flows_req.buf))
    assert sync.reconcile(dp, "h1", DEFAULT_RULES | {rule(1, 2)}, frozenset()) == []
    # the switch refused the meter read: it holds none, and its rules get reconciled
    assert sync.request_failed(dp, bytes(meter_req.buf[:64]))
    assert sync.installed_meters[dp.id] == set()
    msgs = sync.reconcile(dp, "h1", DEFAULT_RULES | {rule(1, 2)}, frozenset())
    assert kinds(msgs) == [*["OFPFlowMod:add"] * 2, "OFPBarrierRequest"]
    assert not sync.request_failed(dp, bytes(meter_req.buf))  # only once per connect
    assert not sync.request_failed(dp, b"\x04")  # too short to be anything


def test_a_disconnect_forgets_the_switch_only_if_it_is_the_one_known():
    sync, dp = SwitchSync(), FakeDatapath()
    sync.connected(dp)
    assert not sync.disconnected(FakeDatapath())  # another connection with the same id
    assert sync.disconnected(dp) and sync.datapaths == {}
    assert sync.port_changed(1, 5, False) and not sync.port_changed(1, 5, False)


# ----- control channel ---------------------------------------------------------------------


def test_frames_to_a_worker_are_numbered_on():
    ch = ControlChannel()
    ct = ControlTuple(Control.ACTIVATE, {})
    first = ch.frames(APP, 3, ct)
    second = ch.frames(APP, 3, ct)
    assert [wire.decode_frame(f).seq for f in first + second] == [0, 1]
    assert wire.decode_frame(ch.frames(APP, 4, ct)[0]).seq == 0  # per worker


def reply(worker: int, metrics: dict, src_worker: int | None = None) -> bytes:
    ct = ControlTuple(Control.METRIC_RESP, {"worker": worker, "metrics": metrics, "request_id": 9})
    src = wire.worker_mac(APP, worker if src_worker is None else src_worker)
    return wire.pack_frames(
        wire.controller_mac(APP), src, Kind.CONTROL, 0, 0, [wire.encode_control(ct)]
    )[0]


def test_replies_are_checked_and_what_they_leave_behind_is_kept():
    ch = ControlChannel()
    apps = {APP: "wc"}
    assert ch.receive(b"junk", apps.get) == [] and ch.drops == {"malformed_frame": 1}
    assert ch.receive(reply(3, {}, src_worker=4), apps.get) == []  # claims another worker
    assert ch.drops["unexpected_control"] == 1
    assert ch.receive(reply(3, {}), {}.get) == [] and ch.drops["unknown_sender"] == 1
    (r,) = ch.receive(reply(3, {"time": 10.0, "in": {"1": 100}, "out": {"2": 50}}), apps.get)
    assert (r.app, r.worker, r.request_id) == ("wc", 3, 9)
    ch.record_metrics(r)
    (r,) = ch.receive(reply(3, {"time": 12.0, "in": {"1": 300}, "out": {"2": 150}}), apps.get)
    assert ch.record_metrics(r)["request_id"] == 9
    assert ch.rates == {"wc": {3: {"in": 100.0, "out": 50.0}}}
    assert ch.responses[9][3]["time"] == 12.0 and ch.worker_metrics["wc"][3]["time"] == 12.0
    ch.record_ack("wc", 3, "ROUTING", 41)
    assert ch.acked("wc", "ROUTING", 41) == {3} and ch.acked("wc", "ROUTING", 42) == set()


def test_the_answer_to_a_metric_req_carries_its_round_trip():
    ch = ControlChannel()
    apps = {APP: "wc"}
    ch.frames(APP, 3, ControlTuple(Control.METRIC_REQ, {"request_id": 9}))
    (r,) = ch.receive(reply(3, {"time": 1.0}), apps.get)
    first = ch.record_metrics(r)
    assert 0 <= first["rtt_ms"] < 1000
    # a second answer to the same request (or one nobody timed) has no round trip
    assert "rtt_ms" not in ch.record_metrics(r)


@pytest.mark.parametrize("n", [1, 3])
def test_request_ids_stay_positive_31_bit(n):
    ch = ControlChannel()
    ids = [ch.next_request_id() for _ in range(n)]
    assert ids == list(range(1, n + 1))
