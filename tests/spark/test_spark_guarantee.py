"""A spark node in the global checkpoint: SIGKILLed workers, exact running counts (tcp, real Spark).

source -> split -> spark ``running_counts`` (update mode, Spark state) -> collect,
under ``exactly_once`` with 500 ms checkpoints.  A worker is SIGKILLed once
Spark has published a few batches and a global checkpoint exists; the tcp
runner relaunches it from that checkpoint and rolls the job back, the spark
node's driver takes its query back to the batch of that checkpoint.  The last
row per word must be its exact count, and no update may reach the sink twice
(each key's counts only grow, so a repeated ``(word, count)`` is a duplicate).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyspark_bridge.outbox import out_dir
from typhoon.operators.sources import generate_sentences
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

pytestmark = pytest.mark.slow

SENTENCES, RATE, SEED, WORDS, VOCABULARY = 8000, 400, 11, 6, 200


def topology(tmp_path: Path, cut_batches: bool = False) -> Any:
    doc = {
        "name": "sparkeo",
        "config": {
            "guarantee": "exactly_once",
            "checkpoint_interval_ms": 500,
            "checkpoint_store": str(tmp_path / "ck"),
            "spark.master": "local[2]",
            "spark.sql.shuffle.partitions": 2,
        },
        "spouts": [
            {
                "id": "source",
                "operator": "sentence_source",
                "args": {
                    "count": SENTENCES,
                    "rate": RATE,
                    "seed": SEED,
                    "words": WORDS,
                    "vocabulary": VOCABULARY,
                },
            }
        ],
        "bolts": [
            {"id": "split", "operator": "split_words"},
            {
                "id": "counts",
                "engine": "spark",
                "operator": "pyspark_bridge.examples:running_counts",
                "parallelism": 2,
                "args": {
                    "output_mode": "update",
                    "trigger_ms": 100,
                    "params": {"key": "word"},
                    "cut_batches": cut_batches,
                },
            },
            {"id": "sink", "operator": "collect"},
        ],
        "streams": [
            {"from": "source", "to": "split", "grouping": "shuffle"},
            {"from": "split", "to": "counts", "grouping": "shuffle"},
            {"from": "counts", "to": "sink", "grouping": "global"},
        ],
    }
    path = tmp_path / "sparkeo.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_topology(path)


def reference() -> dict[str, int]:
    want: Counter[str] = Counter()
    for s in generate_sentences(SENTENCES, SEED, WORDS, VOCABULARY):
        want.update(s.split())
    return dict(want)


def final_counts(rows: list[list]) -> dict[str, int]:
    assert len({(w, n) for w, n in rows}) == len(rows), "an update reached the sink twice"
    final: dict[str, int] = {}
    for word, n in rows:
        final[word] = max(final.get(word, 0), n)
    return final


def newest_batch(outbox: Path) -> int:
    return max((int(m.stem) for m in outbox.glob("*.json") if m.stem.isdigit()), default=-1)


def run(tmp_path: Path, victim: str, cut_batches: bool) -> tuple[dict[str, Any], TcpCluster, float]:
    t = topology(tmp_path, cut_batches)
    cluster = TcpCluster(t, RunOptions(live=False, timeout=150), workdir=tmp_path / "run")
    t0 = time.monotonic()
    try:
        cluster.start()
        cluster.activate()
        outbox = out_dir(cluster.topology.nodes["counts"].args["dir"])
        deadline = time.monotonic() + 90
        # mid-run: Spark published a few batches, and a global checkpoint exists to go back to
        while newest_batch(outbox) < 1 or cluster.progress.global_epoch(cluster.physical) is None:
            assert time.monotonic() < deadline, (
                f"before the kill: batch {newest_batch(outbox)}, "
                f"epoch {cluster.progress.global_epoch(cluster.physical)}"
            )
            cluster.request_metrics()
            cluster.pump(0.2)
        wid = cluster.physical.of_node(victim)[0].worker_id
        cluster.procs[wid].send_signal(signal.SIGKILL)
        clean = cluster.wait()
        report = cluster.report(clean)
    finally:
        cluster.close()
    return report, cluster, time.monotonic() - t0


@pytest.mark.parametrize(
    ("victim", "cut_batches"),
    [
        # all `make test-long` (suite time): tests/integration/test_spark_guarantee_sdn.py
        # kills the spark node's worker of the same job in `make test`
        pytest.param("counts", False, marks=pytest.mark.long),
        pytest.param("split", False, marks=pytest.mark.long),
        pytest.param("counts", True, marks=pytest.mark.long),
    ],
    ids=["spark-worker", "upstream-worker", "spark-worker-cut-batches"],
)
def test_spark_node_survives_killed_workers_exactly_once(
    tmp_path: Path, victim: str, cut_batches: bool
) -> None:
    """``cut_batches``: every batch ends at a checkpoint's cut (anchors.cap)."""
    report, cluster, took = run(tmp_path, victim, cut_batches)
    assert len(cluster.recovered) == 1, cluster.recovered
    assert final_counts(report["results"]["sink"]["tuples"]) == reference()
    assert report["ok"], report["problems"]
    spark = report["results"]["counts"]
    assert spark["rollback_ms"], spark  # the spark workers went back with the job
    held = sorted(spark["anchor_ms"])
    print(
        f"victim {victim} cut_batches {cut_batches}: {took:.1f} s; "
        f"anchor held ms min {held[0]:.0f} "
        f"median {held[len(held) // 2]:.0f} max {held[-1]:.0f} ({len(held)} anchors); "
        f"rollback asked -> done ms {[round(x) for x in spark['rollback_ms']]}"
    )
