"""Redis stream in -> wordcount -> ``redis_stream_sink`` over tcp with real worker processes
and a real ``redis-server`` (started by the fixture on a loopback port of its own).

The sink adds every word's running count as an entry ``{word, n}`` to the stream
``counts``, so the reference is every ``(w, 1..c_w)`` exactly once: under
``exactly_once``, with a count and a sink worker SIGKILLed mid-run after entries were
committed, an entry added twice (a replay) or never shows; under ``at_least_once`` none
may be missing.  Redis down at submit stops ``typhoon run`` with one sentence, exit 2.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from typhoon.checkpoint.store import open_store
from typhoon.live import data_tuples
from typhoon.operators.sources import generate_sentences
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

JOB = """\
name: {name}
config:
  guarantee: {guarantee}
  checkpoint_interval_ms: 300
spouts:
  - id: source
    operator: redis_stream_source
    args: {{url: "{url}", stream: lines, fields: [line], until: end, rate: {rate}}}
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: count
    operator: running_count
    parallelism: 2
  - id: sink
    operator: redis_stream_sink
    args: {{url: "{sink_url}", stream: counts, fields: [word, n], dead_letter: counts_dead}}
    parallelism: 2
streams:
  - {{from: source, to: split, grouping: shuffle}}
  - {{from: split, to: count, grouping: {{type: fields, fields: [word]}}}}
  - {{from: count, to: sink, grouping: {{type: fields, fields: [key]}}}}
"""


def write_job(
    tmp_path: Path, url: str, guarantee: str, rate: int = 0, sink_url: str | None = None
) -> Path:
    path = tmp_path / "redis_to_redis.yaml"
    name = f"rrs{guarantee.replace('_', '')[:6]}"
    text = JOB.format(name=name, guarantee=guarantee, url=url, rate=rate, sink_url=sink_url or url)
    path.write_text(text)
    return path


def fill(redis_server, count: int, seed: int) -> Counter:
    client = redis_server.client()
    client.delete("lines", "counts", "counts_dead")
    pipe = client.pipeline(transaction=False)
    want: Counter = Counter()
    for s in generate_sentences(count, seed=seed, words=6, vocabulary_size=300):
        pipe.xadd("lines", {"line": s})
        want.update(s.split())
    pipe.execute()
    return want


def added(redis_server) -> Counter:
    """The entries of ``counts`` as (word, n), with how often each is there."""
    entries = redis_server.client().xrange("counts")
    return Counter((v[b"word"].decode(), int(v[b"n"])) for _, v in entries)


@pytest.mark.parametrize(
    "guarantee", ["exactly_once", pytest.param("at_least_once", marks=pytest.mark.long)]
)  # at_least_once: `make test-long` (suite time)
def test_redis_to_redis_survives_sigkills_of_a_count_and_a_sink_worker(
    redis_server, tmp_path, guarantee
):
    sentences = 8000
    want = fill(redis_server, sentences, seed=6)
    store_dir = tmp_path / "ck"
    t = load_topology(write_job(tmp_path, redis_server.url, guarantee, rate=1500))
    t.config["checkpoint_store"] = str(store_dir)
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
            while (
                store.latest_complete(parts) is None
                or sent() < sentences // 4
                or not redis_server.client().xlen("counts")
            ):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)
            at_kill.append(redis_server.client().xlen("counts"))
            at_kill.append(sent())
            for node in ("count", "sink"):
                wid = cluster.physical.of_node(node)[0].worker_id
                cluster.procs[wid].send_signal(signal.SIGKILL)

        killer = threading.Thread(target=kill)
        killer.start()
        clean = cluster.wait()
        killer.join()
        report = cluster.report(clean)
    finally:
        cluster.close()
    assert at_kill and at_kill[0] > 0, "no entries committed mid-run before the kill"
    assert at_kill[1] < sentences, at_kill  # the source was still sending
    assert len(cluster.recovered) == 2, cluster.recovered
    expected = {(w, i) for w, n in want.items() for i in range(1, n + 1)}
    got = added(redis_server)
    assert not expected - set(got), sorted(expected - set(got))[:5]  # nothing missing
    assert not set(got) - expected, sorted(set(got) - expected)[:5]
    if guarantee == "exactly_once":
        assert report["ok"], report["problems"]
        twice = [e for e, k in got.items() if k > 1]
        assert not twice, f"{len(twice)} entries added more than once, e.g. {twice[:5]}"
    epochs = [e for w in report["workers"] for e in w["restored_epochs"]]
    assert epochs and min(epochs) >= 1, epochs  # restored a checkpoint, not the start
    assert redis_server.client().xlen("counts_dead") == 0


def test_redis_down_at_submit_is_one_sentence_and_exit_2(redis_server, tmp_path):
    """The source's server answers, the sink's does not: the sink's sentence."""
    path = write_job(tmp_path, redis_server.url, "exactly_once", sink_url="redis://127.0.0.1:1/0")
    p = subprocess.run(
        [sys.executable, "-m", "typhoon_cli", "run", str(path), "--transport", "tcp", "-q"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=dict(os.environ),
    )  # fmt: skip
    assert p.returncode == 2, (p.returncode, p.stderr)
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(
        "error: node 'sink': redis_stream_sink: the Redis server at redis://127.0.0.1:1/0"
        " does not answer"
    ), line
