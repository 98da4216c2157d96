"""Operator chaining over tcp: a chained wordcount against the same job unchained and
against the reference, and a chain process killed under exactly-once.

topologies/wordcount_chained.yaml runs source[i] and split[i] in one process
(docs/topology.md, "Chaining"); with ``config: {chaining: false}`` the same job runs
every worker in its own process with the forward edge over tcp.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
from midrun_kill import kill_once_checkpointed

from typhoon.operators.sources import generate_sentences
from typhoon.tcp_cluster import RunOptions, run_tcp
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def reference(args: dict) -> dict[str, int]:
    want: Counter[str] = Counter()
    for s in generate_sentences(args["count"], args["seed"], args["words"], args["vocabulary"]):
        want.update(s.split())
    return dict(want)


def run(tmp_path: Path, name: str, chaining: bool) -> dict:
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount_chained.yaml"))
    t.name = name
    t.config["chaining"] = chaining
    return run_tcp(t, RunOptions(live=False, timeout=120, workdir=tmp_path))


def test_chained_wordcount_equals_unchained_and_the_reference(tmp_path: Path) -> None:
    chained = run(tmp_path, "chained", True)
    plain = run(tmp_path, "plain", False)
    args = load_topology(ROOT / "topologies" / "wordcount_chained.yaml").nodes["source"].args
    want = reference(args)
    for r in (chained, plain):
        assert r["ok"], r["problems"]
        assert {k: int(v) for k, v in r["results"]["count"]["counts"].items()} == want
    # per node, the same workers, tuples in and out, whether chained or not
    assert chained["nodes"] == plain["nodes"]
    assert chained["nodes"]["split"]["tuples_in"] == args["count"]
    assert chained["results"] == plain["results"]
    # chained: split's workers ran inside their source's process (one log per process)
    logs = {p.name for p in (tmp_path / "chained").glob("worker-*.log")}
    assert logs == {f"worker-{w}.log" for w in (1, 2, 5, 6, 7, 8)}, logs
    plain_logs = {p.name for p in (tmp_path / "plain").glob("worker-*.log")}
    assert plain_logs == {f"worker-{w}.log" for w in range(1, 9)}, plain_logs


@pytest.mark.long
def test_chained_exactly_once_survives_a_killed_chain(tmp_path: Path) -> None:
    """SIGKILL split[0], which takes its chain's process (source[0] too): both are
    relaunched as one process from the newest global checkpoint, and the counts are
    exact; each chained operator's state came back (the source replayed from the
    offset its checkpoint holds)."""
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount_chained.yaml"))
    t.name = "chaineo"
    args = t.nodes["source"].args
    args.update(count=12_000, rate=2_000)
    run = kill_once_checkpointed(tmp_path, t, ["split"])
    report, cluster, before = run.report, run.cluster, run.checkpoint_at_kill
    assert before is not None and run.sent_at_kill >= args["count"] // 4, run
    split0 = cluster.physical.of_node("split")[0].worker_id
    source0 = cluster.physical.of_node("source")[0].worker_id
    assert sorted(cluster.recovered) == sorted([split0, source0]), cluster.recovered
    assert report["ok"], report["problems"]
    counts = {k: int(v) for k, v in report["results"]["count"]["counts"].items()}
    assert counts == reference(args)
    by_id = {w["worker"]: w for w in report["workers"]}
    for wid in (source0, split0):
        assert by_id[wid]["restored_epochs"], by_id[wid]
        assert min(by_id[wid]["restored_epochs"]) >= before >= 1, (before, by_id[wid])
    assert 0 < by_id[source0]["replayed_from"]["emitted"] < args["count"] // 2
