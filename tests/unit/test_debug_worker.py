"""The debug worker process loop and its shipper, with a socket standing in for the TAP."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from socketport import Port

from typhoon import wire
from typhoon.debug import worker as dw
from typhoon.debug.spec import DebugSpec
from typhoon.wire import Kind, encode_rows, worker_mac

APP = 9


def spec(**kw) -> DebugSpec:
    base = dict(
        session="abc123",
        app="wc",
        app_id=APP,
        worker=2,
        direction="out",
        host="h1",
        port=65000,
        tap="tdbgabc123",
        report_url="http://unused",
        key="k",
        filter="word!=skip",
        workers={2: ("split", 0), 4: ("count", 0)},
        fields={"split": ["word"]},
    )
    return DebugSpec(**{**base, **kw})


def frame(words: list[str], seq: int) -> bytes:
    payloads = [encode_rows([[w]]) for w in words]
    [f] = wire.pack_frames(worker_mac(APP, 4), worker_mac(APP, 2), Kind.DATA, 2, seq, payloads)
    return f


def run_worker(worker, theirs, frames: list[bytes], done, timeout: float = 5):  # noqa: ANN001, ANN201
    """Run ``worker`` in a thread, send ``frames`` on its port's other end, wait until
    ``done()`` (at most ``timeout``), then stop it and close that end; the thread,
    joined (for 5 s at most), is returned."""
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        for f in frames:
            theirs.send(f)
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        worker.stop()
        thread.join(timeout=5)
        theirs.close()
    return thread


def test_frames_in_records_out_then_final_statistics():
    posted: list[dict] = []
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker = dw.DebugWorker(spec(), Port(ours), posted.append)
    frames = [frame(["a", "skip", "b"], 0), frame(["c"], 1)]
    run_worker(worker, theirs, frames, lambda: sum(len(b["records"]) for b in posted) >= 3)
    records = [r for b in posted for r in b["records"]]
    assert [r["fields"]["word"] for r in records] == ["a", "b", "c"]
    final = posted[-1]
    assert final["final"] and final["stats"]["tuples"] == 4 and final["stats"]["shipped"] == 3
    assert final["stats"]["matched"] == 3 and final["stats"]["seq_gaps"] == 0


def test_the_ring_drops_the_oldest_frames_and_counts_them():
    ring = dw.FrameRing(3)
    for i in range(5):
        ring.put(bytes([i]))
    assert ring.dropped == 2 and ring.ready.is_set()
    assert ring.take(2) == [b"\x02", b"\x03"] and ring.ready.is_set()
    assert ring.take(10) == [b"\x04"] and not ring.ready.is_set()
    assert ring.take(10) == [] and ring.dropped == 2


def test_a_slow_decoder_loses_copies_in_the_ring_not_in_the_switch():
    """Frames keep being read off the device while decoding lags; the ring's drops are
    counted apart from the sequence gaps they cause."""
    posted: list[dict] = []
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker = dw.DebugWorker(spec(filter=""), Port(ours), posted.append, ring_frames=4)
    feed = worker.decoder.feed

    def slow_feed(data, now):
        time.sleep(0.05)
        return feed(data, now)

    worker.decoder.feed = slow_feed

    def all_seen() -> bool:
        st = worker._stats()
        return st["frames"] + st["ring_dropped"] == 40

    run_worker(worker, theirs, [frame(["w"], seq) for seq in range(40)], all_seen, timeout=10)
    final = posted[-1]["stats"]
    assert final["ring_dropped"] > 0 and final["frames"] + final["ring_dropped"] == 40, final
    assert final["tuples"] == final["frames"]
    # the newest frame always survives: every drop after the first decoded frame is a gap
    seqs = [r["seq"] for b in posted for r in b["records"]]
    assert seqs == sorted(seqs) and seqs[-1] == 39 and len(seqs) == final["frames"]
    assert final["seq_gaps"] == final["ring_dropped"] - seqs[0], (final, seqs)


def test_shipper_rate_backlog_retry_and_gone():
    bodies: list[dict] = []
    fail = {"n": 1}

    def post(body):
        if fail["n"]:
            fail["n"] -= 1
            raise OSError("connection refused")
        bodies.append(body)

    s = dw.Shipper(post, lambda: {"frames": 1}, max_rate=10)
    s.add([{"i": i} for i in range(15)])
    assert (len(s.backlog), s.throttled) == (10, 5)  # one second's worth, the rest counted
    s.ship_once()  # fails: the records wait for the next round
    assert len(s.backlog) == 10 and s.shipped == 0
    s.ship_once()
    assert [r["i"] for r in bodies[0]["records"]] == list(range(10))
    stats = bodies[0]["stats"]
    assert stats.pop("cpu_s") >= 0
    assert stats == {"frames": 1, "shipped": 10, "throttled": 5, "overflow": 0}
    s.ship_once()  # nothing new and the heartbeat is not due: no request
    assert len(bodies) == 1

    def gone(body):
        raise dw.SessionGone("410")

    s.post = gone
    s.ship_once(final=True)
    assert s.gone.is_set()


@pytest.mark.parametrize("bad", [{"direction": "up"}, {"sample": 0}])
def test_spec_is_checked(bad):
    with pytest.raises(ValueError):
        spec(**bad)
