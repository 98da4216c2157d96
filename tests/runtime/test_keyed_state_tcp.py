"""Keyed state over the tcp transport: real worker processes, real sockets.

``topologies/running_max.yaml`` (a running count per word emitted on every
tuple, a sink keeping the largest per word) is not additive: its maxima equal
the word counts, computed here from the source's generator, only if every
word's count lived on one worker from start to end.  Under ``exactly_once`` a
SIGKILLed count worker is relaunched from the last global checkpoint with its
keyed state, and the maxima stay exact.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
from midrun_kill import first_workers, run_killing, sent_by

from typhoon.operators.sources import generate_sentences
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def reference(args: dict) -> dict[str, int]:
    words: Counter = Counter()
    for s in generate_sentences(args["count"], args["seed"], args["words"], args["vocabulary"]):
        words.update(s.split())
    return dict(words)


def run(tmp_path: Path, guarantee: str, victims: list[str]) -> tuple[dict, dict, TcpCluster]:
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "running_max.yaml"))
    t.name = f"keyed{guarantee[:2]}"
    args = t.nodes["source"].args
    args.update(count=12_000, rate=4_000)
    t.config.update(
        guarantee=guarantee, checkpoint_interval_ms=300, checkpoint_store=str(tmp_path / "ck")
    )
    cluster = TcpCluster(t, RunOptions(live=False, timeout=120), workdir=tmp_path / "run")
    try:
        cluster.start()
        cluster.activate()

        sent = sent_by(cluster)
        # mid-run by count (the source's METRIC_RESPs), not a sleep
        clean = run_killing(
            cluster, first_workers(cluster, victims), lambda: sent() >= args["count"] // 4
        )
        report = cluster.report(clean)
    finally:
        cluster.close()
    return report, args, cluster


@pytest.mark.parametrize(
    ("guarantee", "victims"), [("none", []), ("exactly_once", ["count"])], ids=["plain", "killed"]
)
def test_running_counts_are_exact_and_each_key_lives_on_one_worker(tmp_path, guarantee, victims):
    report, args, cluster = run(tmp_path, guarantee, victims)
    assert len(cluster.recovered) == len(victims), cluster.recovered
    assert report["ok"], report["problems"]
    want = reference(args)
    merged = report["results"]["max"]
    assert merged["max"] == want
    assert merged["keys_on_several_workers"] == 0
    # the count node's keys: every word on exactly one worker, all 64 groups owned once
    count = report["results"]["count"]
    assert sum(count["ownership"]) == len(want) == count["keys"]
    groups = [w["keyed"]["groups"] for w in report["workers"] if w["node"] == "count"]
    assert sum(groups) == 64 and len(groups) == 4
