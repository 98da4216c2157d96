"""The ``sdn`` grouping in the framework layer: worker addresses until the load-balancer app
switches a stream (ROUTING ``balanced``), then one load-balancer send per batch."""

from __future__ import annotations

import pytest

from typhoon import wire
from typhoon.operators import resolve_operator
from typhoon.runtime.framework import EOS_PAYLOAD, Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import EOS_STREAM, Transport
from typhoon.topology import load_topology_text, schedule
from typhoon.topology.routing import Route, routes_for
from typhoon.wire import Control, ControlTuple

TOPOLOGY = """
name: lb
spouts:
  - id: source
    operator: sequence_source
    args: {count: 500}
bolts:
  - id: work
    operator: busy
    parallelism: 3
    args: {cost_us: 0}
streams:
  - from: source
    to: work
    grouping: sdn
"""


def _rows(payloads: list[bytes]) -> int:
    return sum(len(wire.decode_rows(p)) for p in payloads)


class Balancing(Transport):
    """Records what the framework hands the I/O layer, as a switch-balancing transport."""

    switch_balancing = True

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple] = []
        self.members: dict[int, list[int]] = {}

    def poll(self, timeout):
        return []

    def send(self, dst, stream, payloads):
        self.log.append(("send", dst, stream, _rows(payloads)))

    def send_balanced(self, stream, lb_node, slot, payloads):
        assert 0 <= slot < wire.LB_SLOTS
        self.log.append(("balanced", lb_node, stream, _rows(payloads)))

    def set_balanced(self, stream, members):
        self.members[stream] = list(members)

    def drain_balanced(self):
        self.log.append(("drain",))

    def reply(self, ct):
        self.log.append(("reply", ct.body["metrics"]))


def make(batch: int = 10):
    topo = load_topology_text(TOPOLOGY, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    wid = phys.of_node("source")[0].worker_id
    n = topo.nodes["source"]
    io = Balancing()
    fw = Framework(
        WorkerSpec(topo, phys, wid, batch_size=batch), resolve_operator(n.operator)(**n.args), io
    )
    return fw, io, topo, phys, wid


def routing(topo, phys, wid, **changes) -> ControlTuple:
    [route] = routes_for(topo, phys, wid)
    for k, v in changes.items():
        setattr(route, k, v)
    return ControlTuple(Control.ROUTING, route.to_body())


def sends(io, kind):
    return [e for e in io.log if e[0] == kind]


def test_without_the_app_sdn_goes_to_worker_addresses_like_shuffle():
    fw, io, _, phys, _ = make()
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.step_spout()
    fw.push()
    assert not sends(io, "balanced") and io.members == {}
    dsts = {e[1] for e in sends(io, "send") if e[2] == 1}
    assert dsts == {w.worker_id for w in phys.of_node("work")}


def test_balanced_routing_sends_each_batch_to_the_node_address_once():
    fw, io, topo, phys, wid = make(batch=10)
    fw.control(routing(topo, phys, wid, balanced=True))
    work = [w.worker_id for w in phys.of_node("work")]
    assert io.members == {1: work}
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.step_spout()  # 256 tuples: 25 full batches of 10, 6 wait for the max delay
    fw.push()  # end of the event-loop turn: the full batches go out
    data = sends(io, "balanced")
    assert data and all(e[1:3] == (1, 1) for e in data)  # node index 1 ("work"), stream 1
    assert sum(e[3] for e in data) == 250 and fw.serializations == 256
    assert fw.metrics()["balanced"] == {"1": 1}


def test_a_routing_update_without_the_flag_keeps_the_mode_and_updates_the_members():
    fw, io, topo, phys, wid = make()
    fw.control(routing(topo, phys, wid, balanced=True))
    work = [w.worker_id for w in phys.of_node("work")]
    # e.g. a reconfiguration takes one worker out: its ROUTING says nothing about balancing
    fw.control(routing(topo, phys, wid, next_hops=work[:2]))
    assert io.members[1] == work[:2]
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.step_spout()
    fw.push()
    assert sends(io, "balanced") and not [e for e in sends(io, "send") if e[2] == 1]
    # the app switches it back
    fw.control(routing(topo, phys, wid, balanced=False))
    io.log.clear()
    fw.step_spout()
    fw.push()
    assert not sends(io, "balanced") and sends(io, "send")
    assert fw.metrics()["balanced"] == {}


def test_end_of_stream_waits_for_balanced_frames_then_goes_to_every_worker():
    fw, io, topo, phys, wid = make()
    fw.control(routing(topo, phys, wid, balanced=True))
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    while not fw.done:
        fw.step_spout()
    kinds = [e[0] for e in io.log if e[0] != "reply"]
    drain = kinds.index("drain")
    assert "balanced" not in kinds[drain:]  # everything was sent before the drain
    eos = [e for e in io.log[drain:] if e[0] == "send" and e[2] == EOS_STREAM]
    assert sorted(e[1] for e in eos) == sorted(w.worker_id for w in phys.of_node("work"))
    assert sum(e[3] for e in sends(io, "balanced")) == 500


def test_routing_body_balanced_is_optional_and_boolean():
    route = Route(1, "sdn", [2, 3], lb_node=1)
    assert "balanced" not in route.to_body()
    ct = wire.decode_control(wire.encode_control(ControlTuple(Control.ROUTING, route.to_body())))
    assert Route.from_body(ct.body).balanced is None
    route.balanced = True
    ct = wire.decode_control(wire.encode_control(ControlTuple(Control.ROUTING, route.to_body())))
    assert Route.from_body(ct.body).balanced is True
    with pytest.raises(ValueError):
        wire.encode_control(ControlTuple(Control.ROUTING, {**route.to_body(), "balanced": 1}))


def test_lb_flag_survives_framing_and_segmentation():
    dst, src = wire.lb_mac(7, 1, 9), wire.worker_mac(7, 1)
    small = wire.pack_frames(dst, src, wire.Kind.DATA, 1, 0, [b"a", b"b"], flags=wire.LB)
    big = wire.pack_frames(dst, src, wire.Kind.DATA, 1, 0, [b"x" * 20000], 9000, flags=wire.LB)
    for f in small + big:
        assert wire.decode_frame(f).flags & wire.LB
    r = wire.Reassembler()
    out = [p for f in big for p in r.feed(wire.decode_frame(f))]
    assert out == [b"x" * 20000]
    with pytest.raises(ValueError):
        wire.pack_frames(dst, src, wire.Kind.DATA, 1, 0, [b"a"], flags=wire.SEG)
    assert wire.decode_rows(EOS_PAYLOAD) == [["eos"]]


def test_a_spout_flat_out_holds_no_rows_for_a_balanced_node():
    """Rows short of a frame wait for the next turn on links, never on a balanced stream:
    the switch splits it by frames and the load balancer weighs workers by frames."""
    fw, io, topo, phys, wid = make(batch=10)
    fw.control(routing(topo, phys, wid, balanced=True))
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.rows_per_entry = 1000  # as if learnt: a frame would hold far more than one turn's rows
    fw.step_spout()
    assert fw.flat_out
    fw.flush()
    assert sum(e[3] for e in sends(io, "balanced")) == 250 and not fw.ready
