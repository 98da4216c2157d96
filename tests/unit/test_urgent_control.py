"""Urgent control tuples overtake queued data; order-sensitive ones keep their place.

A real :class:`SdnTransport` (and, in the second half, a real :class:`Framework`)
whose port is one end of a SOCK_SEQPACKET socket pair; the test writes on the
other end what the switch would deliver: data frames of one upstream worker and
control frames from the controller's address.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from socketport import Port

from typhoon import wire
from typhoon.operators.base import Bolt
from typhoon.runtime import sdn_receive
from typhoon.runtime.framework import SLICE_S, Framework
from typhoon.runtime.sdn import SdnTransport
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import EOS_STREAM, Inbound
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import Control, ControlTuple, Kind

PAIR = """
name: pair
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: sink
    operator: sequence_check
streams:
  - {from: source, to: sink, grouping: shuffle}
"""


class Switch:
    """The far end of the port: writes frames as an upstream worker and the controller."""

    def __init__(self, app: int, me: int, src: int, stream: int) -> None:
        inside, self.end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.end.setblocking(False)
        self.port = Port(inside)
        self.app, self.stream = app, stream
        self.me, self.src = wire.worker_mac(app, me), wire.worker_mac(app, src)
        self.seq = 0

    def data(self, rows: list[list]) -> None:
        frame = wire.pack_frames(
            self.me, self.src, Kind.DATA, self.stream, self.seq, [wire.encode_rows(rows)], 64000
        )[0]
        self.seq += 1
        self.end.send(frame)

    def control(self, ct: ControlTuple) -> None:
        frame = wire.pack_frames(
            self.me, wire.controller_mac(self.app), Kind.CONTROL, 0, 0, [wire.encode_control(ct)]
        )[0]
        self.end.send(frame)

    def replies(self) -> list[ControlTuple]:
        """Control tuples the worker sent to the controller so far."""
        out = []
        while True:
            try:
                raw = self.end.recv(65536)
            except BlockingIOError:
                return out
            f = wire.decode_frame(raw, mtu=64000)
            if f.dst == wire.controller_mac(self.app):
                out += [wire.decode_control(p) for p in f.payloads]


@pytest.fixture
def pair():
    """(spec, switch, transport builder) for the sink of PAIR."""
    topo = load_topology_text(PAIR)
    phys = schedule(topo, ["h1"], 7, first_port=100)
    src = phys.of_node("source")[0].worker_id
    me = phys.of_node("sink")[0].worker_id
    stream = topo.inputs_of("sink")[0].id
    sw = Switch(phys.app_id, me, src, stream)
    made: list[SdnTransport] = []

    def transport(priority: bool = True) -> SdnTransport:
        io = SdnTransport(
            phys.app_id, me, mtu=64000, port_budget=0, device=sw.port, control_priority=priority
        )
        made.append(io)
        return io

    yield WorkerSpec(topo, phys, me, batch_size=100), sw, transport
    for io in made:
        io.close()
    sw.end.close()


def kinds(items: list[Inbound | ControlTuple]) -> list[Any]:
    """Each item as its control type, or the first row value of a data item."""
    return [
        it.type if isinstance(it, ControlTuple) else wire.decode_rows(it.payloads[0])[0][0]
        for it in items
    ]


def drain(io: SdnTransport) -> list[Inbound | ControlTuple]:
    out: list[Inbound | ControlTuple] = []
    for _ in range(100):
        got = io.poll(0)
        if not got and not io.pending:
            return out
        out += got
    raise AssertionError("the transport never ran dry")


def write_mixed(sw: Switch) -> None:
    """Data 0..9, SIGNAL, data 10..19, METRIC_REQ, UPSTREAM, FLOW_CONTROL, data 20..29."""
    for i in range(10):
        sw.data([[i]])
    sw.control(ControlTuple(Control.SIGNAL, {"version": 1}))
    for i in range(10, 20):
        sw.data([[i]])
    sw.control(ControlTuple(Control.METRIC_REQ, {"request_id": 5}))
    sw.control(ControlTuple(Control.UPSTREAM, {"add": [], "remove": [], "version": 2}))
    sw.control(ControlTuple(Control.FLOW_CONTROL, {"budget": 123456}))
    for i in range(20, 30):
        sw.data([[i]])


def test_urgent_control_overtakes_data_and_ordered_control_keeps_its_place(pair):
    _, sw, transport = pair
    io = transport()
    write_mixed(sw)
    got = kinds(drain(io))
    urgent = [Control.METRIC_REQ, Control.FLOW_CONTROL]
    ordered = [*range(10), Control.SIGNAL, *range(10, 20), Control.UPSTREAM, *range(20, 30)]
    assert got == urgent + ordered
    assert io.pending_bytes == 0 and io.ctrl_pending == 0


def test_without_priority_every_control_tuple_keeps_its_place(pair):
    _, sw, transport = pair
    io = transport(priority=False)
    write_mixed(sw)
    assert kinds(drain(io)) == [
        *range(10), Control.SIGNAL, *range(10, 20),
        Control.METRIC_REQ, Control.UPSTREAM, Control.FLOW_CONTROL, *range(20, 30),
    ]  # fmt: skip


def test_urgent_control_read_after_a_poll_goes_ahead_of_what_is_still_queued(pair, monkeypatch):
    _, sw, transport = pair
    io = transport()
    monkeypatch.setattr(sdn_receive, "HAND_OUT_FRAMES", 8)  # a bound on what one poll hands out
    for i in range(20):
        sw.data([[i]])
    assert kinds(io.poll(0)) == list(range(8))
    assert len(io.pending) == 12  # not consumed yet: no credit went back for them
    sw.control(ControlTuple(Control.METRIC_REQ, {"request_id": 1}))
    sw.data([[20]])
    assert kinds(io.poll(0)) == [Control.METRIC_REQ, *range(8, 16)]
    monkeypatch.setattr(sdn_receive, "HAND_OUT_FRAMES", None)
    assert kinds(io.poll(0)) == list(range(16, 21))


def test_a_segmented_or_mixed_control_frame_keeps_its_place(pair):
    _, sw, transport = pair
    io = transport()
    sw.data([[0]])
    frame = wire.pack_frames(
        sw.me, wire.controller_mac(sw.app), Kind.CONTROL, 0, 0,
        [wire.encode_control(ControlTuple(Control.METRIC_REQ, {"request_id": 1})),
         wire.encode_control(ControlTuple(Control.SIGNAL, {"version": 3}))],
    )[0]  # fmt: skip
    sw.end.send(frame)
    assert kinds(drain(io)) == [0, Control.METRIC_REQ, Control.SIGNAL]


class Slow(Bolt):
    """1 ms per tuple; writes a METRIC_REQ to the port (as the controller would) at
    row ``at``; records what happened in order."""

    def __init__(self, sw: Switch, at: int) -> None:
        super().__init__()
        self.sw, self.at = sw, at
        self.events: list[Any] = []

    def process(self, values: list, emit: Any) -> None:
        time.sleep(0.001)
        self.events.append(values[0])
        if values[0] == self.at:
            self.sw.control(ControlTuple(Control.METRIC_REQ, {"request_id": 9}))


def run_backlog(pair, priority: bool) -> tuple[list[Any], list[ControlTuple]]:
    """200 rows in 4 frames queued at a slow sink; a METRIC_REQ arrives at row 70."""
    spec, sw, transport = pair
    io = transport(priority)
    op = Slow(sw, at=70)
    fw = Framework(spec, op, io)
    real_reply = io.reply

    def reply(ct: ControlTuple) -> None:
        op.events.append(("reply", ct.body["metrics"]["in"]))
        real_reply(ct)

    io.reply = reply  # type: ignore[method-assign]
    for f in range(4):
        sw.data([[f * 50 + i] for i in range(50)])
    deadline = time.monotonic() + 10
    while sum(fw.tuples_in.values()) < 200:
        assert time.monotonic() < deadline
        items = io.poll(0.01)
        fw.start_slice()
        for item in items:
            if isinstance(item, ControlTuple):
                fw.control(item)
            else:
                fw.deliver(item)
    for ct in io.poll(0.01):  # a METRIC_REQ still queued (no priority) is answered now
        assert isinstance(ct, ControlTuple)
        fw.control(ct)
    return op.events, sw.replies()


def test_a_slow_operator_answers_metric_req_between_slices_of_a_queued_batch(pair):
    events, replies = run_backlog(pair, priority=True)
    (at,) = [i for i, e in enumerate(events) if isinstance(e, tuple)]
    # served within a slice and a half (15 ms: ~15 rows of 1 ms) of its arrival at row 70,
    # in the middle of the second frame's 50 rows, long before the 200 queued rows are done
    assert 70 < at <= 70 + int(1.5 * SLICE_S / 0.001) + 2, at
    assert events[:at] == list(range(at)) and events[at + 1 :] == list(range(at, 200))
    assert [ct.body["request_id"] for ct in replies] == [9]
    assert replies[0].body["metrics"]["in"] == events[at][1]


def test_without_priority_metric_req_waits_for_the_queued_data(pair):
    events, replies = run_backlog(pair, priority=False)
    (at,) = [i for i, e in enumerate(events) if isinstance(e, tuple)]
    assert at == 200  # behind every row queued before it
    assert [ct.body["request_id"] for ct in replies] == [9]


def test_end_of_stream_asks_for_a_grant_at_once(pair):
    """A receiver that finishes on the end of stream confirms it while it still runs."""
    _, sw, transport = pair
    io = transport()
    src = wire.parse_mac(sw.src).value
    io.send(src, 5, [wire.encode_rows([[1]])])
    io.send(src, EOS_STREAM, [b"\x91\x91\xa3eos"])
    flags = []
    while True:
        try:
            f = wire.decode_frame(sw.end.recv(65536), mtu=64000)
        except BlockingIOError:
            break
        if f.kind == Kind.DATA:  # (the link's base SYNC goes first)
            flags.append(f.flags)
    assert [bool(f & wire.ACK_REQ) for f in flags] == [False, True]


def test_settling_for_a_silent_receiver_still_answers_metric_req(pair):
    """End of stream waits until receivers hold our frames; one that never confirms (dead)
    keeps that wait going until its timeout, and the controller's METRIC_REQs must be
    answered meanwhile, or the heartbeat declares the settling worker dead."""
    _, sw, transport = pair
    io = transport()
    served: list[ControlTuple] = []
    io.on_urgent = served.append
    src = wire.parse_mac(sw.src).value
    io.send(src, 5, [wire.encode_rows([[1]])])  # never confirmed: the far end grants nothing
    sw.control(ControlTuple(Control.METRIC_REQ, {"request_id": 3}))
    assert io.settle([src], timeout=0.5) == [src]
    assert [(ct.type, ct.body["request_id"]) for ct in served] == [(Control.METRIC_REQ, 3)]
