"""The sdn transport's load-balanced path, between real SdnTransports and a fake switch.

Each worker's port is one end of a SOCK_SEQPACKET socket pair (frame boundaries
kept, pollable like a TAP); a thread plays the switch: frames to a worker address
go to that worker, frames to the node's load-balancer slots go to a worker
chosen by weight with the destination rewritten, as the select group does.
Receivers poll in their own threads, so the sender really waits for credit.
"""

from __future__ import annotations

import random
import selectors
import socket
import struct
import threading
import time

import pytest
from socketport import Port

from typhoon import wire
from typhoon.runtime.sdn import SdnTransport
from typhoon.runtime.transport import Inbound

APP, SENDER, NODE, STREAM = 0x77, 1, 1, 1
RECEIVERS = (2, 3, 4)
WINDOW = 8


class Switch(threading.Thread):
    """Forwards by destination address; slot addresses by weight (one worker per slot)."""

    def __init__(self, weights: dict[int, int]) -> None:
        super().__init__(daemon=True)
        self.ends: dict[bytes, socket.socket] = {}
        self.sel = selectors.DefaultSelector()
        rng = random.Random(5)
        choices = [w for w, n in weights.items() for _ in range(n)]
        self.slot_to = [rng.choice(choices) for _ in range(wire.LB_SLOTS)]
        self.to_worker: dict[int, int] = dict.fromkeys(weights, 0)
        self.dropped = 0
        self.stop = threading.Event()

    def port(self, wid: int) -> Port:
        inside, outside = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        outside.setblocking(False)
        self.ends[wire.worker_mac(APP, wid)] = outside
        self.sel.register(outside, selectors.EVENT_READ)
        return Port(inside)

    def run(self) -> None:
        while not self.stop.is_set():
            for key, _ in self.sel.select(0.05):
                frame = key.fileobj.recv(65536)
                dst = frame[:6]
                addr = wire.parse_mac(dst)
                if addr.cls == wire.AddrClass.LOAD_BALANCER:
                    wid = self.slot_to[addr.value & 0xFF]
                    self.to_worker[wid] += 1
                    dst = wire.worker_mac(APP, wid)
                    frame = dst + frame[6:]
                out = self.ends.get(dst)
                if out is not None:
                    try:
                        out.send(frame)
                    except BlockingIOError:  # a full port: a switch drops, like OVS does
                        self.dropped += 1


@pytest.fixture
def net():
    def build(weights, stall=(), window=WINDOW, **kw):
        # a reading receiver must not be written off when a loaded machine delays its
        # thread: only the test with a silent receiver waits for the short timeout
        switch = Switch(weights)
        tx = SdnTransport(APP, SENDER, window=window, port_budget=0, device=switch.port(SENDER),
                          credit_timeout_s=1.0 if stall else 10.0, **kw)  # fmt: skip
        rxs = {w: SdnTransport(APP, w, window=window, port_budget=0, device=switch.port(w), **kw)
               for w in RECEIVERS}  # fmt: skip
        got: dict[int, list[int]] = {w: [] for w in RECEIVERS}
        stop = threading.Event()

        def receive(w: int) -> None:
            while not stop.is_set():
                if w in stall:  # a receiver that never reads: dead for the sender
                    time.sleep(0.05)
                    continue
                for item in rxs[w].poll(0.01):
                    if isinstance(item, Inbound) and item.stream == STREAM:
                        got[w].extend(struct.unpack(">I", p[:4])[0] for p in item.payloads)
                time.sleep(0.001 * (1 + RECEIVERS.index(w)))  # unequal speeds

        threads = [threading.Thread(target=receive, args=(w,), daemon=True) for w in RECEIVERS]
        switch.start()
        for t in threads:
            t.start()
        built.append((switch, stop, tx, rxs))
        return switch, tx, got

    built: list = []
    yield build
    for switch, stop, tx, rxs in built:
        stop.set()
        switch.stop.set()
        switch.join(2)
        for t in [tx, *rxs.values()]:
            t.close()


def send_all(tx: SdnTransport, n: int, batch: int = 10, pad: int = 0) -> None:
    tx.set_balanced(STREAM, list(RECEIVERS))
    rng = random.Random(1)
    for start in range(0, n, batch):
        payloads = [struct.pack(">I", i) + bytes(pad) for i in range(start, min(n, start + batch))]
        tx.send_balanced(STREAM, NODE, rng.randrange(wire.LB_SLOTS), payloads)


def test_every_tuple_arrives_once_through_a_skewed_switch(net):
    switch, tx, got = net({2: 6, 3: 3, 4: 1})
    send_all(tx, 3000)
    tx.drain_balanced()
    group = tx.lb_tx[STREAM]
    assert group.inflight() == 0 and group.lost == 0
    # consumed means handed out by the receiver's poll(); its thread appends them just after
    deadline = time.monotonic() + 2.0
    while sum(map(len, got.values())) < 3000 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sorted(i for ids in got.values() for i in ids) == list(range(3000))
    assert not tx.stats.drops
    # each receiver got exactly the tuples of the frames the switch handed it (10 a frame),
    # and the skewed slot table shows in the split: the most weighted worker got the most
    assert {w: len(got[w]) for w in RECEIVERS} == {w: 10 * n for w, n in switch.to_worker.items()}
    assert all(len(set(got[w])) == len(got[w]) for w in RECEIVERS)
    assert len(got[2]) > len(got[3]) > len(got[4]) > 0
    assert tx.stats.credit_stalls > 0  # the window really held the sender back
    assert tx.balanced_stats() == {"1": {"sent": group.sent, "inflight": 0, "lost": 0}}


def test_a_receiver_that_never_reads_is_written_off_and_the_rest_go_on(net):
    switch, tx, got = net({2: 1, 3: 1, 4: 1}, stall=(4,))
    send_all(tx, 600)
    tx.drain_balanced()
    group = tx.lb_tx[STREAM]
    assert group.known[4].dead and group.inflight() == 0
    # the readers' tuples: no duplicate, each exactly what the switch handed it; with what
    # the silent one was handed, every tuple is accounted for exactly once
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(
        len(got[w]) < 10 * switch.to_worker[w] for w in (2, 3)
    ):
        time.sleep(0.005)
    delivered = got[2] + got[3]
    assert len(set(delivered)) == len(delivered)
    assert {w: len(got[w]) for w in (2, 3)} == {w: 10 * switch.to_worker[w] for w in (2, 3)}
    assert not got[4] and switch.to_worker[4] > 0
    assert len(delivered) + 10 * switch.to_worker[4] == 600
    # what the silent worker holds is counted as lost (frames), not silently missing
    assert group.lost == switch.to_worker[4]


@pytest.mark.parametrize("window_bytes", [25_000, 5_000])
def test_the_group_window_counts_bytes_and_a_larger_frame_still_goes(net, window_bytes):
    """Frames of up to ~8 KB: a 25,000-byte window holds a few of them in flight, a
    5,000-byte one a larger frame only alone (fully open); the 128 frames never bind."""
    switch, tx, got = net({2: 2, 3: 2, 4: 1}, window=128, window_bytes=window_bytes)
    seen: list[tuple[int, int]] = []  # (frames, bytes) in flight after every send
    tx.set_balanced(STREAM, list(RECEIVERS))
    group = tx.lb_tx[STREAM]
    on_send = group.on_send

    def record(cost: int = 0, size: int = 0) -> None:
        on_send(cost, size)
        seen.append((group.inflight(), group.wire_bytes))

    group.on_send = record  # type: ignore[method-assign]
    send_all(tx, 600, pad=1000)
    tx.drain_balanced()
    assert group.inflight() == 0 and group.lost == 0 and group.wire_bytes == 0
    deadline = time.monotonic() + 2.0
    while sum(map(len, got.values())) < 600 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sorted(i for ids in got.values() for i in ids) == list(range(600))
    assert not tx.stats.drops and tx.stats.credit_stalls > 0
    assert len(seen) >= 60  # 10 payloads of 1,004 bytes: one or two frames of the MTU
    assert all(b <= window_bytes or n == 1 for n, b in seen), seen
    if window_bytes == 25_000:
        assert max(n for n, _ in seen) >= 2  # the window held several frames
    else:
        assert any(b > window_bytes for _, b in seen)  # frames larger than it went
