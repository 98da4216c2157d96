"""A relaunched receiver's new address before anything of its generation is sent to it.

Under a guarantee a worker that is relaunched (tcp: a new process, a new listening
address) makes its region roll back to a new generation.  The coordinator tells every
worker the new address (``peers``, on the control connection), but a mark of the new
generation can reach a sender first (a data connection), and what the sender then sends
would go to the dead process: refused (``no_peer``), or written into its old connection,
which the kernel may take and no one reads.  The relaunched receiver then never learns
the sender's generation and waits for its end of stream forever (docs/performance.md,
"Start-up: workers forked from a zygote").

Here: the tcp transport on real loopback sockets (a fake coordinator and fake receivers)
reads the peers of a generation before it is allowed on, closes a link to a relaunched
receiver even when the new process listens on the old address, and counts a wait that
ran out; and the framework waits for the generation's peers before each mark and replay.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from typhoon import wire
from typhoon.operators import BUILTINS
from typhoon.runtime import checkpoints as ck
from typhoon.runtime import tcp_auth as auth
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.tcp import TcpTransport
from typhoon.runtime.tcp_framing import (
    MAX_BOOT,
    MessageReader,
    encode_boot,
    encode_control_message,
)
from typhoon.runtime.transport import EOS_STREAM, Inbound, Transport
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import Control, ControlTuple

APP = 3
SECRET = auth.new_secret()


class Coordinator:
    """The run coordinator's end of one worker's control connection."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.conn: socket.socket | None = None
        self.thread = threading.Thread(target=self._accept)
        self.thread.start()

    def _accept(self) -> None:
        self.conn, _ = self.server.accept()
        self.conn.sendall(auth.challenge()[1])

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.getsockname()
        return host, port

    def send(self, data: bytes) -> None:
        self.thread.join(10)
        assert self.conn is not None
        self.conn.sendall(data)

    def peers(self, generation: int, peers: dict[int, tuple[int, int]]) -> None:
        """``peers``: worker -> (port, launch)."""
        body = {str(w): ["127.0.0.1", port, launch] for w, (port, launch) in peers.items()}
        self.send(encode_boot({"peers": body, "generation": generation}))

    def close(self) -> None:
        self.thread.join(10)
        if self.conn is not None:
            self.conn.close()
        self.server.close()


class Receiver:
    """One launch of worker 2: takes one data connection and keeps what comes on it."""

    def __init__(self, port: int = 0) -> None:
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", port))
        self.server.listen(4)
        self.port = self.server.getsockname()[1]
        self.frames: list[wire.Frame] = []
        self.got = threading.Event()
        self.conn: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:
            return  # closed without a connection
        self.conn = conn
        conn.sendall(auth.challenge()[1])
        reader = MessageReader(MAX_BOOT)
        booted = False
        while True:
            try:
                data = conn.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            for m in reader.feed(data):
                if not booted:  # the sender's proof
                    booted = True
                    reader.limit = 1 << 26
                    continue
                self.frames.append(wire.decode_frame(m))
                self.got.set()

    def payloads(self) -> list[bytes]:
        return [p for f in self.frames for p in f.payloads]

    def die(self) -> None:
        """The process is gone: its listener and its connections close."""
        for sock in (self.server, self.conn):
            if sock is not None:
                try:  # wakes the thread's accept or recv
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def coordinator():
    c = Coordinator()
    yield c
    c.close()


def sender(coordinator: Coordinator) -> TcpTransport:
    t = TcpTransport(1, APP, coordinator.address, secret=SECRET)
    coordinator.thread.join(10)
    return t


def linked(coordinator: Coordinator, t: TcpTransport, old: Receiver) -> None:
    """Generation 0: ``t`` (worker 1) sends to ``old`` (worker 2) on a live connection."""
    coordinator.peers(0, {2: (old.port, 1)})
    t.send(2, 5, [b"before"])
    assert old.got.wait(10) and old.payloads() == [b"before"]


@pytest.mark.parametrize("same_address", [False, True])
def test_a_mark_after_the_generations_peers_reaches_the_relaunched_receiver(
    coordinator: Coordinator, same_address: bool
) -> None:
    """Worker 2 dies and comes back (on a new port, or on its old one); the coordinator's
    peers of generation 1 and a ROLLBACK wait unread on the control connection while the
    sender is told of generation 1 (a mark on a data connection).  Having waited for the
    peers, its mark goes to the new process: the old connection was closed (written to,
    it would have taken the mark and lost it), nothing was dropped, and the ROLLBACK
    read meanwhile is what the next poll returns."""
    t = sender(coordinator)
    old = Receiver()
    try:
        linked(coordinator, t, old)
        old.die()
        new = Receiver(old.port if same_address else 0)
        assert (new.port == old.port) is same_address
        coordinator.peers(1, {1: (1, 1), 2: (new.port, 2)})
        rollback = ControlTuple(Control.ROLLBACK, {"generation": 1, "epoch": 7})
        coordinator.send(encode_control_message(rollback))

        t.await_generation(1)
        assert t.peers_generation == 1 and t.peers[2] == ("127.0.0.1", new.port)
        mark = ck.mark_payload(1, 7)
        t.send(2, EOS_STREAM, [mark])
        assert new.got.wait(10), "the mark went to the dead process"
        assert new.payloads() == [mark]
        assert t.stats.drops == {}
        assert t.poll(0) == [rollback]
        new.die()
    finally:
        t.close()


def test_peers_of_an_older_generation_do_not_end_the_wait_and_late_ones_are_counted(
    coordinator: Coordinator,
) -> None:
    t = sender(coordinator)
    try:
        coordinator.peers(2, {1: (1, 1)})
        coordinator.peers(1, {1: (1, 1)})  # out of order: the newest generation stays
        t.await_generation(2, timeout=10)
        assert t.peers_generation == 2 and t.stats.drops == {}
        t.await_generation(3, timeout=0.3)  # the coordinator never sends them
        assert t.peers_generation == 2
        assert t.stats.drops == {"peers_late": 1}
    finally:
        t.close()


def test_malformed_peers_are_counted_and_change_nothing(coordinator: Coordinator) -> None:
    t = sender(coordinator)
    try:
        coordinator.peers(1, {2: (4000, 1)})
        coordinator.send(encode_boot({"peers": {"2": ["127.0.0.1", 4001, 2]}, "generation": "x"}))
        coordinator.send(encode_boot({"peers": {"2": ["127.0.0.1", "p", 2]}, "generation": 5}))
        coordinator.peers(2, {2: (4002, 2)})
        t.await_generation(2, timeout=10)
        assert t.peers == {2: ("127.0.0.1", 4002)} and t.launches == {2: 2}
        assert t.peers_generation == 2
        assert t.stats.drops == {"malformed_control": 2}
    finally:
        t.close()


# ----- the framework: nothing of a generation before its peers -----------------------------

JOB = """
name: gens
config: {{guarantee: exactly_once, checkpoint_interval_ms: 50, checkpoint_store: {store},
         partial_rollback: true}}
spouts:
  - {{id: src, operator: sequence_source, args: {{count: 10}}}}
bolts:
  - {{id: mid, operator: identity}}
  - {{id: sink, operator: collect}}
streams:
  - {{from: src, to: mid, grouping: shuffle}}
  - {{from: mid, to: sink, grouping: shuffle}}
"""


class Recording(Transport):
    """Every send and every wait for a generation's peers, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[Any, ...]] = []

    def poll(self, timeout: float) -> list[Any]:
        return []

    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        for p in payloads:
            kind = ck.punctuation(p)[:2] if stream == EOS_STREAM else ("data", 0)
            self.events.append(("send", dst, *kind))

    def reply(self, ct: ControlTuple) -> None:
        pass

    def await_generation(self, generation: int) -> None:
        self.events.append(("await", generation))

    def marks(self) -> list[tuple[Any, ...]]:
        """The waits and the marks sent, in order."""
        return [e for e in self.events if e[0] == "await" or e[2] == "mark"]


def mid_worker(tmp_path: Path, generation: int = 0) -> tuple[Framework, Recording, int, int]:
    """The framework of ``mid`` (started, in ``generation``), its transport, its sender
    and its receiver."""
    topo = load_topology_text(JOB.format(store=tmp_path / "ck"))
    phys = schedule(topo, ["h1"], APP, first_port=10)
    if generation:
        phys = dataclasses.replace(phys, generation=generation, restore_epoch=None)
    (src,), (mid,), (sink,) = (phys.of_node(n) for n in ("src", "mid", "sink"))
    node = topo.nodes["mid"]
    io = Recording()
    spec = WorkerSpec(topo, phys, mid.worker_id, batch_size=4, max_delay_ms=0.0)
    fw = Framework(spec, BUILTINS[node.operator](**node.args), io)
    fw.start()
    return fw, io, src.worker_id, sink.worker_id


def test_a_relaunched_worker_waits_for_its_generations_peers_before_its_mark(
    tmp_path: Path,
) -> None:
    _, io, _, sink = mid_worker(tmp_path, generation=2)
    assert io.marks() == [("await", 2), ("send", sink, "mark", 2)]


def test_a_rollback_by_mark_or_by_control_waits_for_the_generations_peers_first(
    tmp_path: Path,
) -> None:
    fw, io, src, sink = mid_worker(tmp_path)
    assert io.events == []  # generation 0 from the start: nothing to wait for
    fw.deliver(Inbound(src, EOS_STREAM, [ck.mark_payload(1, None)]))  # a data connection
    fw.control(ControlTuple(Control.ROLLBACK, {"generation": 2, "epoch": -1}))
    fw.control(ControlTuple(Control.ROLLBACK, {"generation": 2, "epoch": -1}))  # had it
    assert io.marks() == [
        ("await", 1),
        ("send", sink, "mark", 1),
        ("await", 2),
        ("send", sink, "mark", 2),
    ]


def test_an_upstream_backup_replay_waits_for_the_generations_peers_first(
    tmp_path: Path,
) -> None:
    fw, io, _, sink = mid_worker(tmp_path)
    fw.control(ControlTuple(Control.ROLLBACK, {"generation": 4, "epoch": -1, "replay": [sink]}))
    assert io.marks() == [("await", 4), ("send", sink, "mark", 4)]
    assert fw.replayed_gen == {sink: 4}
