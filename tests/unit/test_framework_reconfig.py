"""What the framework layer does for a stable update: release, UPSTREAM, draining routes."""

from __future__ import annotations

from typhoon.operators import resolve_operator
from typhoon.reconfig import Scale, plan
from typhoon.runtime.framework import EOS_PAYLOAD, Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import EOS_STREAM, Inbound, Transport
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import Control, ControlTuple, decode_control, encode_control, encode_rows

PIPE = """
name: pipe
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: mid
    operator: identity
    parallelism: 2
  - id: sink
    operator: sequence_check
streams:
  - {from: source, to: mid, grouping: shuffle}
  - {from: mid, to: sink, grouping: shuffle}
"""


class Recorder(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[int, int, list[bytes]]] = []
        self.replies: list[ControlTuple] = []

    def poll(self, timeout):
        return []

    def send(self, dst, stream, payloads):
        self.sent.append((dst, stream, list(payloads)))

    def send_group(self, group, dsts, payloads, stream=None):
        raise AssertionError("no multicast here")

    def reply(self, ct):
        self.replies.append(ct)


def worker(topo, phys, wid):
    n = topo.nodes[phys.by_id(wid).node]
    io = Recorder()
    fw = Framework(WorkerSpec(topo, phys, wid, batch_size=1), resolve_operator(n.operator)(), io)
    return fw, io


def deployed():
    t = load_topology_text(PIPE)
    return t, schedule(t, ["h1"], 7, first_port=100)


def ctl(fw, ctype, body):
    # through the wire schema, as a worker gets it
    fw.control(decode_control(encode_control(ControlTuple(ctype, body))))


def test_release_sends_end_of_stream_after_the_last_tuple_and_forgets_the_receiver():
    t, phys = deployed()
    p = plan(Scale("mid", 1), t, phys, ["h1"], 100)
    src = phys.of_node("source")[0].worker_id
    fw, io = worker(t, phys, src)
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    removed = p.removed[0]
    body = [s for s in p.steps if s.control == "ROUTING"][-1].bodies[0][1]
    fw.batch_size = 1000  # keep tuples batched until the route changes
    fw.emit([src, 0, 0.0, b""])
    fw.emit([src, 1, 0.0, b""])
    ctl(fw, Control.ROUTING, {**body, "version": 5})
    data = [(d, s) for d, s, _ in io.sent]
    # the batch for the removed worker went out before its end of stream, which came once
    assert data.index((removed, 1)) < data.index((removed, EOS_STREAM))
    assert data.count((removed, EOS_STREAM)) == 1
    assert io.replies[-1].body["metrics"] == {"ack": "ROUTING", "version": 5}
    io.sent.clear()
    fw.emit([src, 2, 0.0, b""])
    fw.finish()
    assert all(d != removed for d, _, _ in io.sent)  # no tuple and no second EOS for it


def test_release_never_ends_a_stream_that_a_route_still_uses():
    t, phys = deployed()
    src = phys.of_node("source")[0].worker_id
    fw, io = worker(t, phys, src)
    mids = [w.worker_id for w in phys.of_node("mid")]
    ctl(fw, Control.ROUTING, {"stream": 1, "policy": "shuffle", "next_hops": mids,
                              "version": 1, "release": [mids[0], 999]})  # fmt: skip
    assert [x for x in io.sent if x[1] == EOS_STREAM] == []


def test_upstream_makes_a_worker_wait_for_new_senders_and_forget_finished_ones():
    t, phys = deployed()
    sink = phys.of_node("sink")[0].worker_id
    mids = [w.worker_id for w in phys.of_node("mid")]
    fw, io = worker(t, phys, sink)
    ctl(fw, Control.UPSTREAM, {"add": [77], "version": 9})
    assert io.replies[-1].body["metrics"] == {"ack": "UPSTREAM", "version": 9}
    for m in mids:
        fw.deliver(Inbound(m, EOS_STREAM, [EOS_PAYLOAD]))
    assert not fw.done  # still waiting for 77
    fw.deliver(Inbound(77, 2, [encode_rows([[1, 0, 0.0, b""]])]))
    ctl(fw, Control.UPSTREAM, {"remove": [77], "version": 10})
    assert fw.done  # 77 left without end of stream: input is over


def test_upstream_brings_back_a_sender_that_released_the_worker_earlier():
    """Insert a node before the sink, then remove it: the source sends to the sink again."""
    t, phys = deployed()
    sink = phys.of_node("sink")[0].worker_id
    mids = [w.worker_id for w in phys.of_node("mid")]
    fw, _ = worker(t, phys, sink)
    fw.deliver(Inbound(mids[0], EOS_STREAM, [EOS_PAYLOAD]))
    ctl(fw, Control.UPSTREAM, {"add": [mids[0]], "version": 1})
    fw.deliver(Inbound(mids[1], EOS_STREAM, [EOS_PAYLOAD]))
    assert not fw.done  # mids[0] routes to us again: wait for its new end of stream
    fw.deliver(Inbound(mids[0], EOS_STREAM, [EOS_PAYLOAD]))
    assert fw.done


def test_upstream_without_reopen_tells_a_replacement_its_senders():
    """A replacement started from an older physical topology waits for a dead sender
    (several failures at once); the rejoin's UPSTREAM swaps it for the live one without
    waiting again for a sender whose end of stream already came."""
    t, phys = deployed()
    sink = phys.of_node("sink")[0].worker_id
    mids = [w.worker_id for w in phys.of_node("mid")]
    fw, io = worker(t, phys, sink)
    fw.deliver(Inbound(mids[1], EOS_STREAM, [EOS_PAYLOAD]))
    ctl(fw, Control.UPSTREAM, {"add": [77, mids[1]], "remove": [mids[0]], "version": 3,
                               "reopen": False})  # fmt: skip
    assert io.replies[-1].body["metrics"] == {"ack": "UPSTREAM", "version": 3}
    assert not fw.done  # waits for 77 only
    fw.deliver(Inbound(77, EOS_STREAM, [EOS_PAYLOAD]))
    assert fw.done


def test_drain_of_a_worker_that_every_sender_released_is_acked_at_once():
    """A scale-down's removed worker often finished already, its senders having released
    it.  Under a guarantee it does not exit (it waits for COMPLETE), so the DRAIN that
    follows must be acked by the finished worker itself, or the update times out."""
    from test_guaranteed_migration import Store

    t, phys = deployed()
    t.config.update(guarantee="exactly_once")
    mid = phys.of_node("mid")[1].worker_id
    src = phys.of_node("source")[0].worker_id
    io = Recorder()
    spec = WorkerSpec(t, phys, mid, batch_size=1)
    fw = Framework(spec, resolve_operator("identity")(), io, store=Store())
    fw.deliver(Inbound(src, EOS_STREAM, [EOS_PAYLOAD]))
    fw.tick()
    assert fw.done and not fw.may_exit  # finished, staying to roll back if asked
    ctl(fw, Control.DRAIN, {"version": 12})
    assert io.replies[-1].body["metrics"] == {"ack": "DRAIN", "version": 12}


def test_routes_skip_draining_workers_and_new_workers_do_not_wait_for_them():
    t, phys = deployed()
    p = plan(Scale("mid", 1), t, phys, ["h1"], 100)
    src = phys.of_node("source")[0].worker_id
    fw, _ = worker(p.topology, p.physical, src)
    assert fw.routers[1].hops == [w.worker_id for w in p.physical.active_of_node("mid")]
    assert fw.context.parallelism == 1
    sink = p.physical.of_node("sink")[0].worker_id
    fw2, _ = worker(p.topology, p.physical, sink)
    assert fw2.pending_upstream == {w.worker_id for w in p.physical.active_of_node("mid")}
