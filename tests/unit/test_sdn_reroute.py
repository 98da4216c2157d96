"""A sender blocked on a hung receiver's credit and the ROUTING that routes around it.

The sender is a real :class:`Framework` over a real :class:`SdnTransport` whose
port is one end of a SOCK_SEQPACKET socket pair; a thread on the other end plays
the switch, the controller and the two receivers of the source's shuffle stream:
``A`` consumes every frame at once and grants it, ``B`` is hung (answers nothing,
as a SIGSTOPped worker), busy (answers each SYNC with a grant but consumes
nothing) or resumes at a given time.  The credit timeout is 10 s, so a wait that
ends early was ended by the ROUTING, not by the timeout.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field

import pytest
from socketport import Port

from typhoon import wire
from typhoon.operators import resolve_operator
from typhoon.runtime import links as lk
from typhoon.runtime.framework import Framework
from typhoon.runtime.sdn import SdnTransport
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import EOS_STREAM
from typhoon.topology import load_topology_text, schedule
from typhoon.topology.routing import routes_for
from typhoon.wire import Control, ControlTuple, Kind

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
WINDOW = 4
CREDIT_TIMEOUT_S = 10.0
SILENCE_S = 0.3
ROUTING_AT_S = 0.6  # after the start of sending


@dataclass
class Receiver:
    mode: str  # "consume" | "hung" (answers nothing) | "busy" (answers SYNCs, consumes nothing)
    resume_at: float | None = None  # monotonic time at which it starts consuming
    got: list[int] = field(default_factory=list)  # tuple values of the frames it received
    consumed: int = 0
    syncs: list[float] = field(default_factory=list)  # when each SYNC probe reached it


class Net(threading.Thread):
    """The far side of the sender's port: switch, controller and receivers in one."""

    def __init__(self, app: int, sender: int, receivers: dict[int, Receiver]) -> None:
        super().__init__(daemon=True)
        inside, self.end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.port = Port(inside)
        self.app, self.sender, self.rx = app, sender, receivers
        self.mac = wire.worker_mac(app, sender)
        self.controls: list[ControlTuple] = []
        self.seq = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def _to_sender(self, src: bytes, kind: Kind, stream: int, payloads: list[bytes]) -> None:
        frame = wire.pack_frames(self.mac, src, kind, stream, self.seq, payloads)[0]
        self.seq += 1
        with self.lock:
            self.end.send(frame)

    def grant(self, wid: int) -> None:
        """GRANT [link 0, consumed, received]: the sender's window over the unicast link."""
        r = self.rx[wid]
        values = [0, r.consumed & lk.MASK, len(r.got) & lk.MASK]
        self._to_sender(wire.worker_mac(self.app, wid), Kind.CREDIT, lk.GRANT,
                        [wire.encode_credit(v) for v in values])  # fmt: skip

    def control(self, ct: ControlTuple) -> None:
        """The controller writes a control tuple to the sender (a PacketOut)."""
        self._to_sender(wire.controller_mac(self.app), Kind.CONTROL, 0, [wire.encode_control(ct)])

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            for wid, r in self.rx.items():
                if r.resume_at is not None and now >= r.resume_at and r.mode != "consume":
                    r.mode = "consume"
                    r.consumed = len(r.got)
                    self.grant(wid)
            if not select.select([self.end], [], [], 0.005)[0]:
                continue
            f = wire.decode_frame(self.end.recv(65536))
            if f.dst == wire.controller_mac(self.app):
                self.controls += [wire.decode_control(p) for p in f.payloads]
                continue
            wid = wire.parse_mac(f.dst).value
            r = self.rx[wid]
            if f.kind == Kind.DATA and f.stream != EOS_STREAM:
                r.got += [row[0] for p in f.payloads for row in wire.decode_rows(p)]
                if r.mode == "consume":
                    r.consumed = len(r.got)
                    self.grant(wid)
            elif f.kind == Kind.CREDIT and f.stream == lk.SYNC:
                r.syncs.append(now)
                if r.mode != "hung":
                    self.grant(wid)  # busy: the same grant again, no new room


@pytest.fixture
def source():
    """(framework, transport, net, ROUTING body, A, B): the source of PIPE, B as asked."""
    made = []

    def build(b: Receiver):
        topo = load_topology_text(PIPE)
        phys = schedule(topo, ["h1"], 7, first_port=100)
        src = phys.of_node("source")[0].worker_id
        a, b_id = (w.worker_id for w in phys.of_node("mid"))
        net = Net(phys.app_id, src, {a: Receiver("consume"), b_id: b})
        io = SdnTransport(
            phys.app_id, src, window=WINDOW, port_budget=0, device=net.port,
            credit_timeout_s=CREDIT_TIMEOUT_S, reroute_silence_s=SILENCE_S,
        )  # fmt: skip
        spec = WorkerSpec(topo, phys, src, batch_size=1)
        fw = Framework(spec, resolve_operator("sequence_source")(), io)
        (route,) = routes_for(topo, phys, src)
        assert sorted(route.next_hops) == sorted([a, b_id])
        net.start()
        made.append((net, io))
        return fw, io, net, route.to_body(), a, b_id

    yield build
    for net, io in made:
        net.stop.set()
        net.join(2)
        io.close()
        net.end.close()


def emit(fw: Framework, values: range) -> float:
    """Emit one tuple per value (one frame each: a turn of the event loop per tuple);
    seconds it took."""
    t0 = time.monotonic()
    for i in values:
        fw.emit([i])
        fw.push()
    return time.monotonic() - t0


def apply_control(fw: Framework, io: SdnTransport) -> list[ControlTuple]:
    """One turn of the worker's event loop: what poll() hands out goes to the framework."""
    got = [item for item in io.poll(0.05) if isinstance(item, ControlTuple)]
    for ct in got:
        fw.control(ct)
    return got


def acked(net: Net, version: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ct in list(net.controls):
            m = ct.body.get("metrics", {})
            if m.get("ack") == "ROUTING" and m.get("version") == version:
                return True
        time.sleep(0.01)
    return False


def routing_later(net: Net, body: dict, hops: list[int], version: int) -> threading.Timer:
    ct = ControlTuple(Control.ROUTING, {**body, "next_hops": hops, "version": version})
    timer = threading.Timer(ROUTING_AT_S, net.control, (ct,))
    timer.start()
    return timer


def test_routing_around_a_hung_receiver_ends_the_credit_wait_at_once(source):
    fw, io, net, body, a, b = source(Receiver("hung"))
    routing_later(net, body, [a], version=7)
    blocked = emit(fw, range(40))  # B's window is full after 8 tuples: blocked on B
    # ended by the ROUTING (+ at most one wait slice), not by the 10 s credit timeout
    assert ROUTING_AT_S - 0.05 <= blocked < ROUTING_AT_S + 1.5, blocked
    assert io.tx.is_dead(b) and not io.tx.is_dead(a)
    held = len(net.rx[b].got)
    assert held == WINDOW  # what the hung worker holds: lost with it

    got = apply_control(fw, io)  # the framework applies the ROUTING and acks it
    assert [ct.type for ct in got] == [Control.ROUTING]
    assert fw.routers[body["stream"]].hops == [a]
    assert acked(net, 7)
    assert emit(fw, range(40, 80)) < 1.0  # every later tuple goes to A, without waiting
    wait_for(lambda: len(net.rx[a].got) + held + io.stats.drops["credit_timeout"] == 80)
    assert len(net.rx[b].got) == held
    assert list(range(40, 80)) == net.rx[a].got[-40:]
    # every tuple is at A, held by B, or counted as dropped: the frame in hand and
    # those the old route still sent B before the framework got the ROUTING
    assert len(net.rx[a].got) + held + io.stats.drops["credit_timeout"] == 80
    assert io.stats.drops["credit_timeout"] == 20 - WINDOW
    assert net.rx[a].got == sorted(net.rx[a].got)


def test_a_routing_that_keeps_the_hung_receiver_does_not_end_the_wait(source):
    fw, io, net, body, a, b = source(Receiver("hung", resume_at=time.monotonic() + 1.5))
    routing_later(net, body, [a, b], version=8)  # e.g. a policy change: B stays
    blocked = emit(fw, range(40))
    assert blocked >= 1.2, blocked  # waited for B to resume
    assert not io.tx.is_dead(b) and "credit_timeout" not in io.stats.drops
    assert [ct.type for ct in apply_control(fw, io)] == [Control.ROUTING]
    assert acked(net, 8)
    wait_for(lambda: len(net.rx[a].got) + len(net.rx[b].got) == 40)
    assert sorted(net.rx[a].got + net.rx[b].got) == list(range(40))  # nothing lost


def test_a_busy_receiver_taken_out_of_the_routing_still_gets_every_frame(source):
    """A scale-down takes out a live worker: it answers SYNCs, so it is waited for."""
    fw, io, net, body, a, b = source(Receiver("busy", resume_at=time.monotonic() + 1.5))
    routing_later(net, body, [a], version=9)
    blocked = emit(fw, range(40))
    assert blocked >= 1.2, blocked
    assert not io.tx.is_dead(b) and "credit_timeout" not in io.stats.drops
    assert [ct.type for ct in apply_control(fw, io)] == [Control.ROUTING]
    assert acked(net, 9)
    emit(fw, range(40, 60))
    wait_for(lambda: len(net.rx[a].got) + len(net.rx[b].got) == 60)
    assert sorted(net.rx[a].got + net.rx[b].got) == list(range(60))
    assert all(v < 40 for v in net.rx[b].got)  # after the ROUTING only A


def test_a_dead_receiver_routed_around_is_probed_no_more(source):
    """No credit wait: the hung receiver holds fewer frames than its window, and the
    sender probes it for them.  Once the applied ROUTING leaves it out and it stayed
    silent for the reroute silence, its frames are written off and the probes stop
    (before: every PROBE_S until the 10 s credit timeout, frames that met the drop
    rule toward the dead worker's address)."""
    fw, io, net, body, a, b = source(Receiver("hung"))
    emit(fw, range(4))  # shuffle: 2 to each, under the window of 4: nothing blocks
    # the worker's event loop turns (housekeeping probes B for its unconfirmed frames)
    wait_for(lambda: apply_control(fw, io) == [] and len(net.rx[b].syncs) >= 2)
    assert len(net.rx[b].got) == 2
    net.control(ControlTuple(Control.ROUTING, {**body, "next_hops": [a], "version": 5}))
    deadline = time.monotonic() + 5.0
    while not io.tx.is_dead(b):
        assert time.monotonic() < deadline, "still probing the routed-around receiver"
        apply_control(fw, io)
    assert acked(net, 5) and not io.tx.is_dead(a)
    assert io.tx.lost() == {b: 2}  # what it held is written off (replayed under a guarantee)
    probes = len(net.rx[b].syncs)
    quiet_until = time.monotonic() + 0.5
    while time.monotonic() < quiet_until:
        apply_control(fw, io)  # housekeeping: no probe for B any more
    assert len(net.rx[b].syncs) == probes
    emit(fw, range(4, 8))
    wait_for(lambda: net.rx[a].got[-4:] == [4, 5, 6, 7])


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
