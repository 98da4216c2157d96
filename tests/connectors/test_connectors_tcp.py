"""Redis stream in -> wordcount -> PostgreSQL table, over tcp with real worker processes
and real servers (started by the fixtures on loopback ports of their own).

The job is ``topologies/redis_postgres_wordcount.yaml``: the sink appends every word's
running count as a row ``(word, n)``, so the reference table is every ``(w, 1..c_w)``
exactly once: a row written twice (a replay after a SIGKILL) or never shows.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from midrun_kill import run_killing_after_commits

from typhoon.checkpoint.store import open_store
from typhoon.live import data_tuples
from typhoon.operators.sources import generate_sentences
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "redis_postgres_wordcount.yaml"
BAD = [{b"line": b"\xff\xfe not utf-8"}, {b"line": b"two", b"extra": b"fields"}]

pytestmark = pytest.mark.slow


def fill(redis_server, stream: str, count: int, seed: int) -> Counter:
    """The stream: two bad entries, then ``count`` sentences; the reference word counts."""
    client = redis_server.client()
    client.delete(stream, f"{stream}_dead")
    pipe = client.pipeline(transaction=False)
    for values in BAD:
        pipe.xadd(stream, values)
    want: Counter = Counter()
    for s in generate_sentences(count, seed=seed, words=6, vocabulary_size=300):
        pipe.xadd(stream, {"line": s})
        want.update(s.split())
    pipe.execute()
    return want


def table(postgres_server, name: str, ddl: str) -> None:
    with postgres_server.connect() as c:
        c.execute(f"DROP TABLE IF EXISTS {name}")
        c.execute(f"CREATE TABLE {name} ({ddl})")


def job(redis_server, postgres_server, name: str, guarantee: str, store: Path, env):
    env.setenv("REDIS_URL", redis_server.url)  # the example file reads both
    env.setenv("PG_DSN", postgres_server.dsn)
    t = copy.deepcopy(load_topology(TOPOLOGY))
    t.name = name
    t.config.update(guarantee=guarantee, checkpoint_interval_ms=300, checkpoint_store=str(store))
    return t


def appended_rows_exact(postgres_server, want: Counter) -> None:
    with postgres_server.connect() as c:
        rows = c.execute("SELECT word, n FROM word_counts").fetchall()
    got = Counter(rows)
    dup = [r for r, k in got.items() if k > 1]
    assert not dup, f"{len(dup)} rows written more than once, e.g. {dup[:5]}"
    expected = {(w, i) for w, n in want.items() for i in range(1, n + 1)}
    missing = expected - set(got)
    extra = set(got) - expected
    assert not missing and not extra, (sorted(missing)[:5], sorted(extra)[:5])


def test_redis_to_postgres_upsert_without_a_guarantee(
    redis_server, postgres_server, tmp_path, monkeypatch
):
    want = fill(redis_server, "sentences", 3000, seed=3)
    table(postgres_server, "word_counts", "word text PRIMARY KEY, n bigint NOT NULL")
    t = job(redis_server, postgres_server, "rpgnone", "none", tmp_path / "ck", monkeypatch)
    sink = t.nodes["sink"].args
    del sink["append"]
    sink["key"] = ["word"]  # upsert: the last running count of each word stays
    cluster = TcpCluster(t, RunOptions(live=False, timeout=120), workdir=tmp_path / "run")
    try:
        cluster.start()
        cluster.activate()
        report = cluster.report(cluster.wait())
    finally:
        cluster.close()
    assert report["ok"], report["problems"]
    with postgres_server.connect() as c:
        got = dict(c.execute("SELECT word, n FROM word_counts").fetchall())
    assert got == dict(want)
    assert report["results"]["source"]["emitted"] == 3000
    assert report["results"]["source"]["dropped"] == {"not_utf8": 1, "wrong_fields": 1}
    assert report["results"]["sink"]["written"] == sum(want.values())
    dead = redis_server.client().xrange("sentences_dead")
    assert sorted(d[b"_reason"] for _, d in dead) == [b"not_utf8", b"wrong_fields"]
    assert dead[0][1][b"f:line"] == BAD[0][b"line"]  # the raw bytes, for a later look


@pytest.mark.parametrize(
    "guarantee,victims",
    [
        ("exactly_once", ["count"]),
        ("exactly_once", ["count", "sink"]),
        ("at_least_once", ["count", "sink"]),
    ],
)
def test_redis_to_postgres_survives_sigkills(
    redis_server, postgres_server, tmp_path, guarantee, victims, monkeypatch
):
    """A count worker (then also a sink worker) is SIGKILLed mid-run after a completed
    global checkpoint, with rows already committed: under exactly_once the table is the
    reference exactly, under at_least_once no row is missing."""
    sentences = 8000
    want = fill(redis_server, "sentences", sentences, seed=5)
    table(postgres_server, "word_counts", "word text NOT NULL, n bigint NOT NULL")
    store_dir = tmp_path / "ck"
    t = job(redis_server, postgres_server, "rpgeo", guarantee, store_dir, monkeypatch)
    t.nodes["source"].args["rate"] = 1500
    cluster = TcpCluster(t, RunOptions(live=False, timeout=180), workdir=tmp_path / "run")
    at_kill: list[int] = []
    try:
        cluster.start()
        cluster.activate()

        def committed() -> int:
            with postgres_server.connect() as c:
                return c.execute("SELECT count(*) FROM word_counts").fetchone()[0]

        store = open_store(str(store_dir), t.name)
        clean = run_killing_after_commits(
            cluster, store, victims, sentences // 4, committed, at_kill
        )
        report = cluster.report(clean)
    finally:
        cluster.close()
    assert at_kill and at_kill[0] > 0, "no rows committed mid-run before the kill"
    assert at_kill[1] < sentences, at_kill  # the source was still sending
    assert len(cluster.recovered) == len(victims), cluster.recovered
    if guarantee == "exactly_once":
        assert report["ok"], report["problems"]
        appended_rows_exact(postgres_server, want)
    else:  # replays may write rows again (the run report counts the duplicates too)
        with postgres_server.connect() as c:
            got = set(c.execute("SELECT word, n FROM word_counts").fetchall())
        expected = {(w, i) for w, n in want.items() for i in range(1, n + 1)}
        assert not expected - got, sorted(expected - got)[:5]
    assert report["results"]["source"]["dropped"] == {"not_utf8": 1, "wrong_fields": 1}
    epochs = [e for w in report["workers"] for e in w["restored_epochs"]]
    assert epochs and min(epochs) >= 1, epochs  # restored a checkpoint, not the start


def submit(redis_url: str, dsn: str) -> str:
    """``typhoon run`` of the example; exit 2 with one line on stderr, which is returned."""
    env = {**os.environ, "REDIS_URL": redis_url, "PG_DSN": dsn}
    p = subprocess.run(
        [sys.executable, "-m", "typhoon_cli", "run", str(TOPOLOGY), "--transport", "tcp", "-q"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip
    assert p.returncode == 2, (p.returncode, p.stderr)
    (line,) = p.stderr.strip().splitlines()
    return line


def test_a_server_down_at_submit_is_one_sentence_and_exit_2(redis_server, postgres_server):
    table(postgres_server, "word_counts", "word text NOT NULL, n bigint NOT NULL")
    line = submit("redis://127.0.0.1:1/0", postgres_server.dsn)
    assert line.startswith(
        "error: node 'source': redis_stream_source: the Redis server at redis://127.0.0.1:1/0"
        " does not answer"
    ), line
    line = submit(redis_server.url, "postgresql://postgres@127.0.0.1:1/postgres")
    assert line.startswith(
        "error: node 'sink': postgres_sink: the PostgreSQL server at 127.0.0.1:1/postgres"
        " cannot be used (connection failed"
    ), line
    with postgres_server.connect() as c:
        c.execute("DROP TABLE word_counts")
    line = submit(redis_server.url, postgres_server.dsn)
    assert line == (
        f"error: node 'sink': postgres_sink: there is no table 'word_counts' at "
        f"127.0.0.1:{postgres_server.port}/postgres"
    ), line


def test_a_postgres_restart_mid_run_costs_nothing(
    redis_server, postgres_server, tmp_path, monkeypatch
):
    """PostgreSQL is stopped and started again mid-run (after rows were committed): the
    sinks retry on new connections and the table is the reference exactly."""
    sentences = 6000
    want = fill(redis_server, "sentences", sentences, seed=9)
    table(postgres_server, "word_counts", "word text NOT NULL, n bigint NOT NULL")
    t = job(redis_server, postgres_server, "rpgre", "exactly_once", tmp_path / "ck", monkeypatch)
    t.nodes["source"].args["rate"] = 1500
    cluster = TcpCluster(t, RunOptions(live=False, timeout=180), workdir=tmp_path / "run")
    restarted: list[int] = []
    try:
        cluster.start()
        cluster.activate()
        source_id = cluster.physical.of_node("source")[0].worker_id

        def sent() -> int:
            return data_tuples(cluster.metrics.get(source_id, {}).get("out", {}))

        def restart() -> None:
            deadline = time.monotonic() + 60
            while sent() < sentences // 4:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)
            postgres_server.stop()
            restarted.append(sent())
            postgres_server.start()

        restarter = threading.Thread(target=restart)
        restarter.start()
        clean = cluster.wait()
        restarter.join()
        report = cluster.report(clean)
    finally:
        cluster.close()
    assert restarted and restarted[0] < sentences, restarted  # mid-run
    assert report["ok"], report["problems"]
    assert not cluster.recovered  # the sinks waited; nothing had to be recovered
    logs = "".join(p.read_text() for p in (tmp_path / "run").glob("worker-*.log"))
    assert "on 127.0.0.1" in logs and "retrying in" in logs  # a sink met the restart
    appended_rows_exact(postgres_server, want)
