"""The tcp transport sending to a receiver in its own process (a live-unchained edge of a
chain, typhoon/runtime/chain.py): one thread runs both, so the sender must let the
receiver read while the connection's handshake or a full socket buffer waits
(``on_wait``), and both count the link's frames, which chaining again waits to match.

Real loopback sockets; fake coordinators (tests/unit/test_tcp_peers_generation.py)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from test_tcp_peers_generation import APP, SECRET, Coordinator

from typhoon.runtime.tcp import TcpTransport
from typhoon.runtime.transport import Inbound

STREAM = 5


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A sender waiting for itself would wait forever: a failure after 20 s instead."""

    def late(*_: object) -> None:
        raise TimeoutError("the sender waited for its own process's receiver")

    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_a_receiver_in_the_same_thread_gets_more_than_the_socket_buffers_hold(
    no_hang: None,
) -> None:
    """16 MB in one send (more than loopback's buffers take): without serving the
    receiver meanwhile the sender would wait for itself forever."""
    c1, c2 = Coordinator(), Coordinator()
    tx = TcpTransport(1, APP, c1.address, secret=SECRET)
    rx = TcpTransport(2, APP, c2.address, secret=SECRET)
    got: list[Inbound] = []
    calls = []

    def serve() -> None:
        calls.append(1)
        got.extend(i for i in rx.poll(0) if isinstance(i, Inbound))

    try:
        c1.peers(0, {2: (rx.listener.getsockname()[1], 1)})
        tx.on_wait = serve
        payloads = [i.to_bytes(4, "big") * 250 for i in range(16_000)]
        tx.send(2, STREAM, payloads)
        sent = tx.frames_sent(2)
        assert sent is not None and sent > 0 and calls, "the receiver was never served"
        while rx.frames_delivered(1) != sent:
            serve()
        assert [p for i in got for p in i.payloads] == payloads  # all, in order
        assert {(i.src, i.stream) for i in got} == {(1, STREAM)}
        assert tx.frames_confirmed(2) == sent == tx.stats.frames_out == rx.stats.frames_in
        assert tx.stats.drops == rx.stats.drops == {}
        assert tx.frames_sent(3) == 0 and rx.frames_delivered(3) == 0
    finally:
        tx.close()
        rx.close()
        c1.close()
        c2.close()
