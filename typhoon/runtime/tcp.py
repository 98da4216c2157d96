"""The ``tcp`` I/O layer: one TCP connection per next hop, like Storm's Netty transport.

Frames are the same wire frames the ``sdn`` transport puts on a TAP port,
each preceded by a u32 length.  A stream has no path MTU: ``mtu`` is only the unit
tuples are batched into and the bound a receiver decodes by (a larger frame is a
counted ``malformed_frame``); a run gives every worker the same
(``typhoon.worker_specs.tcp_mtu``: the sdn workers' 64,000 bytes unless the topology
asks).  There is no multicast, so the framework layer
serializes a broadcast tuple once per receiver: the baseline the paper
compares against.  Control tuples come from the run coordinator on a
separate control connection, with the same encoding as over the switch.

Control connection messages are ``u32 length, u8 type, body``: type 0 is a
wire-encoded control tuple, type 1 a msgpack map used only for bootstrap
(``hello`` from the worker, ``peers`` from the coordinator).

``peers`` names, for every worker, its address and which launch of it that is,
and the run generation it is of.  Under a guarantee a worker sends nothing of a
generation (its mark, a replay) before it read the peers of that generation
(:meth:`TcpTransport.await_generation`): a relaunched receiver's new address
comes on the control connection, but a newer generation's mark can come first
on a data connection, and sent on without it the mark would go to the dead
process (docs/performance.md, "Start-up: workers forked from a zygote").
"""

from __future__ import annotations

import fcntl
import logging
import select
import selectors
import socket
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from typhoon import wire
from typhoon.runtime import tcp_auth as auth
from typhoon.runtime.tcp_framing import (
    MAX_BOOT,
    MAX_MESSAGE,
    MSG_BOOT,
    MSG_CONTROL,
    READ_CHUNK,
    U32,
    MessageReader,
    encode_boot,
    encode_control_message,
    encode_message,
)
from typhoon.runtime.transport import Inbound, Transport
from typhoon.wire import ControlTuple, Kind, WireError

__all__ = [
    "MAX_MESSAGE",
    "MSG_BOOT",
    "MSG_CONTROL",
    "TCP_MTU",
    "MessageReader",
    "TcpTransport",
    "encode_boot",
    "encode_control_message",
    "encode_message",
]

log = logging.getLogger(__name__)

PEERS_TIMEOUT_S = 30.0  # how long a worker waits for the coordinator's peers
SERVE_WAIT_S = 0.005  # longest wait for a socket between turns of a chain's other workers
MASK = 0xFFFFFFFF
# the frame sizes a tcp worker takes (``config: {tcp: {mtu}}``'s schema says the same): a
# frame's entries are at most 65,535 bytes (u16 lengths), so larger frames would only
# batch more of them; below 64 bytes a frame is mostly header
MIN_MTU = 64
MAX_MTU = 0xFFFF
# the frame size of a tcp worker whose spec names none, and of a run whose topology asks
# for none (``typhoon.worker_specs.tcp_mtu``): the sdn workers' size, so that the tcp
# baseline is measured with the same frames
TCP_MTU = 64000


@dataclass
class _Conn:
    sock: socket.socket
    reader: MessageReader = field(default_factory=MessageReader)
    nonce: bytes = b""  # the challenge this (inbound) connection must answer
    peer: int = 0  # the sending worker it proved to be; 0: not yet


class TcpTransport(Transport):
    """Worker-side I/O over TCP."""

    def __init__(
        self,
        worker_id: int,
        app_id: int,
        control: tuple[str, int],
        bind_host: str = "127.0.0.1",
        mtu: int = TCP_MTU,
        *,
        secret: str,
    ) -> None:
        if not MIN_MTU <= mtu <= MAX_MTU:
            raise ValueError(f"tcp frames of {mtu} bytes: must be {MIN_MTU}..{MAX_MTU}")
        super().__init__()
        self.secret = secret
        self.worker_id = worker_id
        self.app_id = app_id
        self.mac = wire.worker_mac(app_id, worker_id)
        self.mtu = mtu
        self.sel = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((bind_host, 0))
        self.listener.listen(64)
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.control = socket.create_connection(control, timeout=30)
        reader = MessageReader(MAX_BOOT)
        nonce, rest = auth.read_challenge(self.control, reader, auth.AUTH_TIMEOUT_S)
        reader.limit = MAX_MESSAGE
        self.control.settimeout(None)
        self.control_conn = _Conn(self.control, reader)
        self.sel.register(self.control, selectors.EVENT_READ, self.control_conn)
        self.inbound: list[_Conn] = []
        self.peers: dict[int, tuple[str, int]] = {}
        self.launches: dict[int, int] = {}  # worker -> which launch of it ``peers`` names
        self.peers_generation = -1  # the run generation of the newest peers; -1: none yet
        self.early: list[Inbound | ControlTuple] = []  # control read while awaiting peers
        self.out: dict[int, socket.socket] = {}
        self.seq_out: dict[tuple[int, int], int] = {}
        # frames written to each receiver and read from each sender (all streams, mod
        # 2**32): chaining a live-unchained edge again waits until they match
        self.sent_to: dict[int, int] = {}
        self.read_from: dict[int, int] = {}
        self.seq_in: dict[tuple[bytes, int], int] = {}
        self.reassembly: dict[tuple[bytes, int], wire.Reassembler] = {}
        port = self.listener.getsockname()[1]
        proof = auth.proof(secret, auth.HELLO, nonce, worker_id, bind_host, port)
        self.control.sendall(
            encode_boot({"hello": worker_id, "host": bind_host, "port": port, "proof": proof})
        )
        if rest:
            self._control_messages(rest, self.early)

    # ----- receiving -----------------------------------------------------------------------

    def waitable(self) -> int | None:
        return None if self.early else self.sel.fileno()

    def poll(self, timeout: float) -> list[Inbound | ControlTuple]:
        out: list[Inbound | ControlTuple] = self.early
        self.early = []
        for key, _ in self.sel.select(0 if out else timeout):
            if key.data == "listen":
                self._accept()
                continue
            conn = key.data
            try:
                data = conn.sock.recv(READ_CHUNK)
            except ConnectionError:
                data = b""
            if not data:
                self._closed(conn)
                continue
            try:
                messages = conn.reader.feed(data)
            except WireError:
                self.stats.drop("malformed_stream")
                self._closed(conn)
                continue
            if conn is self.control_conn:
                self._control_messages(messages, out)
                continue
            if not conn.peer and messages:
                messages = self._authenticate(conn, messages)
            if messages:
                self._data_messages(conn, messages, out)
        return out

    def _accept(self) -> None:
        """A sender connects: challenge it; nothing it sends counts until it answers."""
        try:
            sock, _addr = self.listener.accept()
        except OSError:
            return
        nonce, challenge = auth.challenge()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(challenge)
        except OSError:
            sock.close()
            return
        conn = _Conn(sock, MessageReader(MAX_BOOT), nonce)
        self.inbound.append(conn)
        self.sel.register(sock, selectors.EVENT_READ, conn)

    def _authenticate(self, conn: _Conn, messages: list[bytes]) -> list[bytes]:
        """The first message of a data connection must prove the run's secret for the
        sender it names; otherwise the connection is counted and closed."""
        peer: int | None = None  # the sender, once it proved the secret
        try:
            body = auth.boot_body(messages[0])
            claim = body.get("peer")
            if (
                type(claim) is int
                and 1 <= claim <= 0xFFFE
                and auth.verify(
                    self.secret, body.get("proof"), auth.PEER, conn.nonce, claim, self.worker_id
                )
            ):
                peer = claim
        except WireError:
            pass
        if peer is None:
            log.warning("worker %d: refused an unauthenticated data connection", self.worker_id)
            self.stats.drop("unauthenticated")
            self._closed(conn)
            return []
        conn.peer = peer
        conn.reader.limit = MAX_MESSAGE
        return messages[1:]

    def _closed(self, conn: _Conn) -> None:
        self.sel.unregister(conn.sock)
        conn.sock.close()
        if conn is self.control_conn:
            # the coordinator went away: nothing will control this worker any more
            raise ConnectionError("control connection closed")
        self.inbound.remove(conn)

    def _control_messages(self, messages: list[bytes], out: list[Any]) -> None:
        for m in messages:
            if not m:
                self.stats.drop("malformed_control")
                continue
            if m[0] == MSG_BOOT:
                try:
                    self._peers(auth.boot_body(m))
                except Exception:
                    self.stats.drop("malformed_control")
                continue
            try:
                out.append(wire.decode_control(m[1:]))
            except WireError:
                self.stats.drop("malformed_control")

    def _peers(self, body: dict[str, Any]) -> None:
        """The coordinator's ``peers``: ``{worker: [host, port, launch]}`` of run generation
        ``generation``.  The link to a worker launched again since (a new address, or the
        same one reused by the new process) is closed: the next send connects anew, where
        a write to the old connection could be taken by the kernel and never arrive."""
        gen = body.get("generation", 0)
        if type(gen) is not int:
            raise ValueError(f"peers of generation {gen!r}")
        peers = {
            int(k): ((str(v[0]), int(v[1])), int(v[2]) if len(v) > 2 else 0)
            for k, v in body["peers"].items()
        }
        for wid, (addr, launch) in peers.items():
            known = (self.peers.get(wid, addr), self.launches.get(wid, launch))
            if known != (addr, launch):  # a relaunched peer
                old = self.out.pop(wid, None)
                if old is not None:
                    log.info("worker %d: worker %d was relaunched: link closed",
                             self.worker_id, wid)  # fmt: skip
                    old.close()
            self.peers[wid] = addr
            self.launches[wid] = launch
        self.peers_generation = max(self.peers_generation, gen)

    def _data_messages(self, conn: _Conn, messages: list[bytes], out: list[Any]) -> None:
        st = self.stats
        # every frame of the connection counts as handed over (one dropped too): the
        # caller delivers all that poll returns before it asks again
        self.read_from[conn.peer] = (self.read_from.get(conn.peer, 0) + len(messages)) & MASK
        for m in messages:
            st.frames_in += 1
            st.bytes_in += len(m)
            try:
                frame = wire.decode_frame(m, mtu=self.mtu)
                src = wire.parse_mac(frame.src)
            except WireError:
                st.drop("malformed_frame")
                continue
            if frame.kind != Kind.DATA or src.cls != wire.AddrClass.WORKER:
                st.drop("unexpected_frame")
                continue
            if src.value != conn.peer or src.app_id != self.app_id or frame.dst != self.mac:
                st.drop("spoofed_frame")  # not what the authenticated sender may send us
                continue
            key = (frame.src, frame.stream)
            expect = self.seq_in.get(key)
            if expect is not None and frame.seq != expect:
                st.seq_gaps += (frame.seq - expect) & 0xFFFFFFFF
            self.seq_in[key] = (frame.seq + 1) & 0xFFFFFFFF
            payloads = frame.payloads
            if frame.flags & wire.SEG:
                r = self.reassembly.setdefault(key, wire.Reassembler())
                try:
                    payloads = r.feed(frame)
                except WireError:
                    st.drop("bad_segment")
                    continue
                if not payloads:
                    continue
            out.append(Inbound(src.value, frame.stream, payloads))

    # ----- sending -------------------------------------------------------------------------

    def await_generation(self, generation: int, timeout: float = PEERS_TIMEOUT_S) -> None:
        """Before this worker sends anything of run generation ``generation`` (a mark, a
        replay): read the control connection until the coordinator's peers of that
        generation came, which name every worker relaunched for it (module docstring).
        Control tuples read meanwhile wait for :meth:`poll`.  Not in time (the coordinator
        is gone): logged and counted (``peers_late``), and sent as known."""
        if self.peers_generation >= generation:
            return
        self._read_control_until(lambda: self.peers_generation >= generation, timeout)
        if self.peers_generation < generation:
            log.error("worker %d: no peers of generation %d in %.0f s (newest: %d)",
                      self.worker_id, generation, timeout, self.peers_generation)  # fmt: skip
            self.stats.drop("peers_late")

    def _await_peers(self, timeout: float = PEERS_TIMEOUT_S) -> None:
        """A worker may send before the coordinator told it its peers: read the control
        connection until it has."""
        self._read_control_until(lambda: bool(self.peers), timeout)

    def _read_control_until(self, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            if not select.select([self.control], [], [], 0.1)[0]:
                continue
            data = self.control.recv(READ_CHUNK)
            if not data:
                raise ConnectionError("control connection closed")
            self._control_messages(self.control_conn.reader.feed(data), self.early)

    def _read_control_now(self) -> None:
        """What the coordinator sent and we have not read yet (peers now, the rest later)."""
        while select.select([self.control], [], [], 0)[0]:
            data = self.control.recv(READ_CHUNK)
            if not data:
                return  # closed: poll() sees it
            self._control_messages(self.control_conn.reader.feed(data), self.early)

    def _link(self, dst: int) -> socket.socket | None:
        sock = self.out.get(dst)
        if sock is None:
            if not self.peers:
                self._await_peers()
            addr = self.peers.get(dst)
            if addr is None:
                return None
            try:
                sock = socket.create_connection(addr, timeout=30)
            except OSError:
                # a relaunched receiver: its new address may be in our control buffer
                # still (a newer generation's mark can overtake the coordinator's peers)
                self._read_control_now()
                if self.peers.get(dst, addr) == addr:
                    raise
                return self._link(dst)
            try:  # prove to the receiver that we are a worker of this run
                self._serve_until_readable(sock, auth.AUTH_TIMEOUT_S)
                nonce, _ = auth.read_challenge(sock, MessageReader(MAX_BOOT), auth.AUTH_TIMEOUT_S)
                proof = auth.proof(self.secret, auth.PEER, nonce, self.worker_id, dst)
                sock.sendall(encode_boot({"peer": self.worker_id, "proof": proof}))
            except (OSError, WireError):
                sock.close()
                raise ConnectionError(f"worker {dst} did not take our connection") from None
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.out[dst] = sock
        return sock

    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        try:
            sock = self._link(dst)
        except OSError:  # refused, or the challenge never came
            sock = None
        if sock is None:
            self.stats.drop("no_peer", len(payloads))
            return
        seq = self.seq_out.get((dst, stream), 0)
        frames = wire.pack_frames(
            wire.worker_mac(self.app_id, dst), self.mac, Kind.DATA, stream, seq, payloads, self.mtu
        )
        self.seq_out[(dst, stream)] = (seq + len(frames)) & 0xFFFFFFFF
        data = b"".join([U32.pack(len(f)) + f for f in frames])
        try:
            self._write(sock, data)
        except OSError:
            # the receiver died: what it would have got is counted, never silent (under a
            # guarantee the job rolls back; without one the run fails on the dead worker)
            self.out.pop(dst, None)
            sock.close()
            self.stats.drop("peer_lost", len(frames))
            return
        self.sent_to[dst] = (self.sent_to.get(dst, 0) + len(frames)) & MASK
        self.stats.frames_out += len(frames)
        self.stats.bytes_out += len(data)

    # ----- a receiver in this process (a live-unchained edge: typhoon.runtime.chain) ------

    def _write(self, sock: socket.socket, data: bytes) -> None:
        """All of ``data``.  In a chain's process the receiver may be a worker of the same
        process, which reads only when this thread lets it: a full socket buffer is
        waited out serving the process's other workers (``on_wait``), never blocked on."""
        if self.on_wait is None:
            sock.sendall(data)
            return
        view = memoryview(data)
        while view:
            try:
                view = view[sock.send(view, socket.MSG_DONTWAIT) :]
            except (BlockingIOError, InterruptedError):
                pass
            if view:
                self.on_wait()
                select.select([], [sock], [], SERVE_WAIT_S)

    def _serve_until_readable(self, sock: socket.socket, timeout: float) -> None:
        """In a chain's process: serve its other workers until ``sock`` has something
        (a receiver of this process accepts our connection only in its own poll)."""
        if self.on_wait is None:
            return
        deadline = time.monotonic() + timeout
        while not select.select([sock], [], [], 0)[0] and time.monotonic() < deadline:
            self.on_wait()
            select.select([sock], [], [], SERVE_WAIT_S)

    def frames_sent(self, dst: int) -> int | None:
        return self.sent_to.get(dst, 0)

    def frames_delivered(self, src: int) -> int | None:
        return self.read_from.get(src, 0)

    def frames_confirmed(self, dst: int) -> int | None:
        """Everything written: a tcp connection is ordered and loses nothing while both
        ends live, and there are no rules that must wait for a confirmation."""
        return self.frames_sent(dst)

    def reply(self, ct: ControlTuple) -> None:
        self.control.sendall(encode_control_message(ct))

    def queue_bytes(self) -> int:
        total = 0
        buf = bytearray(4)
        for conn in self.inbound:
            try:
                fcntl.ioctl(conn.sock.fileno(), termios.FIONREAD, buf)
            except OSError:
                continue
            total += int.from_bytes(buf, "little") + len(conn.reader.buf)
        return total

    def close(self) -> None:
        for sock in self.out.values():
            sock.close()
        for conn in self.inbound:
            conn.sock.close()
        self.listener.close()
        self.control.close()
        self.sel.close()
