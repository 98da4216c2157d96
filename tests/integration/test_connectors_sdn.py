"""Issue 32's headline: Redis stream in -> wordcount -> PostgreSQL table under
``exactly_once`` over sdn on 3 emulated hosts (Mininet, real OVS, Ryu with the fault
detector), with a SIGKILL of a count worker mid-run and then one of the source.

The job is ``topologies/redis_postgres_wordcount.yaml``: the sink appends every word's
running count ``(word, n)``, committed per global checkpoint (two-phase commit), so
the table is the reference exactly when every ``(w, 1..c_w)`` is there once: a replay
written twice or a committed epoch lost would show.  Each kill waits for a completed
global checkpoint newer than the last restore and for committed rows (the sink
commits mid-run, not only at the end), and the recoveries must have restored it.
"""

from __future__ import annotations

import copy
import os
import secrets
import signal
from collections import Counter
from pathlib import Path

import pytest
from dbservers import remove, start_postgres, start_redis
from harness import emulated_cluster, wait

from mininet_env.run import EmulatedCluster
from typhoon.checkpoint.store import open_store
from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report, read_worker_reports, restored_epochs
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = 12_000
RATE = 1_000  # sentences per second: a 12 s run


@pytest.fixture(scope="module")
def servers():
    redis_server, postgres_server = start_redis(), start_postgres()
    try:
        yield redis_server, postgres_server
    finally:
        remove(redis_server)
        remove(postgres_server)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = "metrics_interval = 0.25\n[fault_detector]\nheartbeat_timeout = 15.0\n"
    with emulated_cluster(
        tmp_path_factory.mktemp("connectors"), "k", apps=["apps/fault_detector.py"], config=config
    ) as c:
        yield c


def committed(postgres_server) -> int:
    with postgres_server.connect() as c:
        return c.execute("SELECT count(*) FROM word_counts").fetchone()[0]


def kill(c: EmulatedCluster, name: str, node: str, store, restored: list[int], pg) -> int:
    """After a global checkpoint newer than the last restore, with rows committed,
    SIGKILL the node's first worker; wait for its recovery, which must restore that
    checkpoint or a newer one (appended to ``restored``)."""
    physical = c.coordinator.get_physical(name)
    parts = {f"{w.node}-{w.index}" for w in physical.workers if w.active}
    after = max(restored, default=0)
    done = wait(
        lambda: (e := store.latest_complete(parts)) is not None and e > after and committed(pg)
        and e,
        30,
        f"a global checkpoint of {name} after epoch {after}, with rows committed",
    )  # fmt: skip
    victim = physical.active_of_node(node)[0].worker_id
    os.kill(c.coordinator.worker_statuses(name)[victim].pid, signal.SIGKILL)

    def recovered():
        incidents = {i["worker"]: i for i in c.rest("GET", "/faults")[1] if i["app"] == name}
        i = incidents.get(victim)
        return i if i is not None and i["state"] in ("rejoined", "failed") else None

    incident = wait(recovered, 60, f"the replacement of worker {victim} ({node}) to rejoin")
    assert incident["state"] == "rejoined", incident
    assert incident["restore_epoch"] is not None and incident["restore_epoch"] >= done, incident
    restored.append(incident["restore_epoch"])
    return victim


@pytest.mark.integration
@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_redis_to_postgres_over_sdn_survives_count_and_source_kills(
    cluster, servers, tmp_path, monkeypatch, guarantee
):
    """exactly_once: the table is the reference exactly; at_least_once: no row is short."""
    redis_server, postgres_server = servers
    client = redis_server.client()
    client.delete("sentences", "sentences_dead")
    pipe = client.pipeline(transaction=False)
    pipe.xadd("sentences", {b"line": b"\xff not utf-8"})  # counted and dead-lettered
    want: Counter = Counter()
    for s in generate_sentences(SENTENCES, seed=11, words=6, vocabulary_size=300):
        pipe.xadd("sentences", {"line": s})
        want.update(s.split())
    pipe.execute()
    with postgres_server.connect() as c:
        c.execute("DROP TABLE IF EXISTS word_counts")
        c.execute("CREATE TABLE word_counts (word text NOT NULL, n bigint NOT NULL)")

    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("PG_DSN", postgres_server.dsn)
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "redis_postgres_wordcount.yaml"))
    t.name = f"rpg{secrets.token_hex(2)}"
    t.nodes["source"].args["rate"] = RATE
    store_dir = tmp_path / "ckpt"
    t.config.update(
        guarantee=guarantee, checkpoint_interval_ms=500, checkpoint_store=str(store_dir)
    )
    cluster.submit(t)
    cluster.wait_active(t.name)
    store = open_store(str(store_dir), t.name)
    restored: list[int] = []
    killed = [kill(cluster, t.name, "count", store, restored, postgres_server)]
    killed.append(kill(cluster, t.name, "source", store, restored, postgres_server))
    clean = cluster.wait_finished(t.name)
    reports = read_worker_reports(cluster.report_dir(t.name))
    cluster.kill(t.name)
    report = build_report(t, reports, ok=clean, recovered=cluster.recovered, transport="sdn")
    assert set(killed) <= set(cluster.recovered), (killed, cluster.recovered)

    with postgres_server.connect() as c:
        rows = Counter(c.execute("SELECT word, n FROM word_counts").fetchall())
    expected = {(w, i) for w, n in want.items() for i in range(1, n + 1)}
    missing, extra = expected - set(rows), set(rows) - expected
    assert not missing, sorted(missing)[:5]
    assert not extra, sorted(extra)[:5]  # a replay writes the same (word, n) again, no other
    if guarantee == "exactly_once":
        assert report["ok"], report["problems"]
        dup = [r for r, k in rows.items() if k > 1]
        assert not dup, f"{len(dup)} rows written more than once, e.g. {dup[:5]}"
    assert report["results"]["source"]["dropped"] == {"not_utf8": 1}
    # every restore went to a checkpoint a recovery chose, none to the start
    epochs = [e for r in reports for e in restored_epochs(r["metrics"])]
    assert epochs and min(epochs) >= 1 and set(epochs) <= set(restored), (epochs, restored)
