"""The example ``topologies/redis_minute_counts.yaml`` over tcp with real worker processes
and real servers (the fixtures start them on loopback ports of their own): events from
a Redis stream, counted per key per minute of event time by ``window_aggregate``,
upserted into PostgreSQL.  The table must equal the counts computed here from the events
written, once plainly and once with a window worker SIGKILLed mid-run under
``exactly_once`` (the windows come back from the checkpoint, the source replays, and
the upserts of a replay rewrite the same rows)."""

from __future__ import annotations

import copy
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from typhoon.checkpoint.store import open_store
from typhoon.live import data_tuples
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "redis_minute_counts.yaml"
MINUTE = 60_000
T0 = 1_764_201_600_000  # event time of the first event (ms)
BAD = [{b"key": b"k1", b"ts": b"soon"}, {b"key": b"\xff\xfe", b"ts": b"1"}]

pytestmark = pytest.mark.slow


def fill(redis_server, count: int, seed: int) -> Counter:
    """The stream ``events``: two bad entries, then ``count`` events 0-60 ms apart, each
    up to 3 s out of order (within the watermark's 5 s); the reference counts per
    (key, minute start)."""
    rng = random.Random(seed)
    client = redis_server.client()
    client.delete("events", "events_dead")
    pipe = client.pipeline(transaction=False)
    for values in BAD:
        pipe.xadd("events", values)
    want: Counter = Counter()
    t = T0
    for _ in range(count):
        t += rng.randint(0, 60)
        ts = max(T0, t - rng.randint(0, 3000))
        key = f"k{rng.randint(0, 11)}"
        pipe.xadd("events", {"key": key, "ts": str(ts)})
        want[(key, ts // MINUTE * MINUTE)] += 1
    pipe.execute()
    return want


def job(redis_server, postgres_server, name: str, store: Path, env):
    env.setenv("REDIS_URL", redis_server.url)  # the example file reads both
    env.setenv("PG_DSN", postgres_server.dsn)
    t = copy.deepcopy(load_topology(TOPOLOGY))
    t.name = name
    t.nodes["source"].args["until"] = "end"  # the stream as it is at the start
    t.config.update(checkpoint_interval_ms=300, checkpoint_store=str(store))
    with postgres_server.connect() as c:
        c.execute("DROP TABLE IF EXISTS minute_counts")
        c.execute(
            "CREATE TABLE minute_counts (key text NOT NULL, minute bigint NOT NULL,"
            " minute_end bigint NOT NULL, n bigint NOT NULL, PRIMARY KEY (key, minute))"
        )
    return t


def table_equals(postgres_server, want: Counter) -> None:
    with postgres_server.connect() as c:
        rows = c.execute("SELECT key, minute, minute_end, n FROM minute_counts").fetchall()
    assert all(end == minute + MINUTE for _, minute, end, _ in rows)
    got = {(k, m): n for k, m, _, n in rows}
    assert got == dict(want), sorted(set(got.items()) ^ set(want.items()))[:5]


def test_minute_counts_from_redis_equal_the_reference(
    redis_server, postgres_server, tmp_path, monkeypatch
):
    want = fill(redis_server, 8000, seed=4)
    t = job(redis_server, postgres_server, "rmcplain", tmp_path / "ck", monkeypatch)
    cluster = TcpCluster(t, RunOptions(live=False, timeout=120), workdir=tmp_path / "run")
    try:
        cluster.start()
        cluster.activate()
        report = cluster.report(cluster.wait())
    finally:
        cluster.close()
    assert report["ok"], report["problems"]
    table_equals(postgres_server, want)
    assert report["results"]["source"]["emitted"] == 8000
    assert report["results"]["source"]["dropped"] == {"bad_value": 1, "not_utf8": 1}
    window = report["results"]["window"]
    assert window["late"] == 0 and window["bad_time"] == 0
    assert window["fired"] == len(want)
    dead = redis_server.client().xrange("events_dead")
    assert sorted(d[b"_reason"] for _, d in dead) == [b"bad_value", b"not_utf8"]


@pytest.mark.long  # recovery of window_aggregate is tested elsewhere; this is the example's
def test_minute_counts_are_exact_after_a_window_worker_is_killed(
    redis_server, postgres_server, tmp_path, monkeypatch
):
    events = 12_000
    want = fill(redis_server, events, seed=8)
    store_dir = tmp_path / "ck"
    t = job(redis_server, postgres_server, "rmckill", store_dir, monkeypatch)
    t.nodes["source"].args["rate"] = 2000
    cluster = TcpCluster(t, RunOptions(live=False, timeout=180), workdir=tmp_path / "run")
    at_kill: list[int] = []
    try:
        cluster.start()
        cluster.activate()
        store = open_store(str(store_dir), t.name)
        parts = {f"{w.node}-{w.index}" for w in cluster.physical.workers}
        source_id = cluster.physical.of_node("source")[0].worker_id

        def sent() -> int:
            return data_tuples(cluster.metrics.get(source_id, {}).get("out", {}))

        def kill() -> None:
            deadline = time.monotonic() + 60
            while store.latest_complete(parts) is None or sent() < events // 3:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)
            at_kill.append(sent())
            wid = cluster.physical.of_node("window")[0].worker_id
            cluster.procs[wid].send_signal(signal.SIGKILL)

        killer = threading.Thread(target=kill)
        killer.start()
        clean = cluster.wait()
        killer.join()
        report = cluster.report(clean)
    finally:
        cluster.close()
    assert at_kill and at_kill[0] < events, at_kill  # the source was still sending
    assert len(cluster.recovered) == 1, cluster.recovered
    assert report["ok"], report["problems"]
    table_equals(postgres_server, want)
    epochs = [e for w in report["workers"] for e in w["restored_epochs"]]
    assert epochs and min(epochs) >= 1, epochs  # restored a checkpoint, not the start
