"""The tcp run coordinator's door: which connections become workers' control connections.

Every accepted connection gets a challenge (:mod:`typhoon.runtime.tcp_auth`) and
must answer with a hello that proves the run's secret for the worker id it
claims, and that id must be one the coordinator is waiting for.  A wrong
proof, an unexpected or duplicate id, malformed bytes, an oversize length or a
connection that closes is logged, counted in ``rejected`` (the run report's
``rejected_connections``) and closed; start-up goes on.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from typhoon.runtime import tcp_auth as auth
from typhoon.runtime.tcp_framing import MAX_BOOT, MAX_MESSAGE, MessageReader
from typhoon.wire import WireError

log = logging.getLogger(__name__)

MAX_PENDING = 128  # connections waiting to say hello; more are refused at once


@dataclass
class Hello:
    """An authenticated control connection of a worker."""

    worker_id: int
    sock: socket.socket
    reader: MessageReader
    host: str
    port: int


@dataclass
class _Pending:
    sock: socket.socket
    addr: str
    nonce: bytes
    reader: MessageReader = field(default_factory=lambda: MessageReader(MAX_BOOT))


class HelloGate:
    """Accepts and authenticates workers' control connections on ``server``."""

    def __init__(self, server: socket.socket, secret: str) -> None:
        self.server = server
        self.secret = secret
        self.rejected: dict[str, int] = {}

    def collect(
        self, want: set[int], deadline: float, check: Callable[[set[int]], None] = lambda _: None
    ) -> dict[int, Hello]:
        """Hellos of the workers in ``want``, until each said hello or ``deadline``
        (TimeoutError naming the missing).  ``check(arrived)`` runs every turn (it may
        raise, e.g. when a worker exited)."""
        got: dict[int, Hello] = {}
        sel = selectors.DefaultSelector()
        sel.register(self.server, selectors.EVENT_READ, None)
        try:
            while want - got.keys():
                if time.monotonic() > deadline:
                    missing = sorted(want - got.keys())
                    raise TimeoutError(f"workers {missing} did not say hello in time")
                check(set(got))
                for key, _ in sel.select(0.2):
                    if key.data is None:
                        self._accept(sel)
                        continue
                    hello = self._read(sel, key.data, want - got.keys())
                    if hello is not None:
                        got[hello.worker_id] = hello
        finally:
            for key in list(sel.get_map().values()):
                if key.data is not None:
                    self._reject(sel, key.data, "no_hello")
            sel.close()
        return got

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            sock, addr = self.server.accept()
        except OSError:
            return
        sock.settimeout(None)
        nonce, message = auth.challenge()
        p = _Pending(sock, str(addr[0]) if addr else "?", nonce)
        if len(sel.get_map()) > MAX_PENDING:
            self._count(p, "too_many_pending")
            sock.close()
            return
        try:
            sock.sendall(message)
        except OSError:
            self._count(p, "closed")
            sock.close()
            return
        sel.register(sock, selectors.EVENT_READ, p)

    def _read(self, sel: selectors.BaseSelector, p: _Pending, waiting: set[int]) -> Hello | None:
        try:
            data = p.sock.recv(4096)
            if not data:
                return self._reject(sel, p, "closed")
            messages = p.reader.feed(data)
            if not messages:
                return None
            body = auth.boot_body(messages[0])
            wid, host, port = auth.hello_claims(body)
        except WireError:
            return self._reject(sel, p, "malformed")
        except OSError:
            return self._reject(sel, p, "closed")
        if not auth.verify(self.secret, body.get("proof"), auth.HELLO, p.nonce, wid, host, port):
            return self._reject(sel, p, "bad_proof")
        if wid not in waiting:
            return self._reject(sel, p, "unexpected_id")
        sel.unregister(p.sock)
        p.reader.limit = MAX_MESSAGE
        return Hello(wid, p.sock, p.reader, host, port)

    def _count(self, p: _Pending, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        log.warning("tcp coordinator: refused a connection from %s: %s", p.addr, reason)

    def _reject(self, sel: selectors.BaseSelector, p: _Pending, reason: str) -> None:
        self._count(p, reason)
        sel.unregister(p.sock)
        p.sock.close()
