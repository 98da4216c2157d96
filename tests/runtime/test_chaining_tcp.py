"""Operator chaining over tcp: a chained wordcount against the same job unchained and
against the reference, and a chain process killed under exactly-once.

topologies/wordcount_chained.yaml runs source[i] and split[i] in one process
(docs/topology.md, "Chaining"); with ``config: {chaining: false}`` the same job runs
every worker in its own process with the forward edge over tcp.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from midrun_kill import kill_once_checkpointed
from tcp_verbs import reference, run_verbs

from typhoon.reconfig import Swap
from typhoon.tcp_cluster import RunOptions, run_tcp
from typhoon.topology import load_topology, load_topology_text
from typhoon.topology.chaining import chain_groups

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


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


IN_PLACE = """
name: tcpinplace
spouts:
  - {id: source, operator: sentence_source, args: {count: 12000, seed: 7, words: 8,
     vocabulary: 500, rate: 1500}, parallelism: 2}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: count, operator: count_by_key, args: {key: word}, parallelism: 2, stateful: true}
streams:
  - {from: source, to: split, grouping: forward}
  - {from: split, to: count, grouping: forward}
"""


@pytest.mark.long
def test_a_chained_count_swapped_in_place_over_tcp_counts_exactly(tmp_path: Path) -> None:
    """source -> split -> count is one process per instance; mid-run the count is swapped
    in place (typhoon.reconfig.swap_in_place): the old instances' counts and the new
    ones' add up to the reference, nothing lost, no new worker or process."""
    t = load_topology_text(IN_PLACE, "tcpinplace.yaml")
    report, (rec,), _, cluster = run_verbs(
        tmp_path, t, [(0.4, Swap("count", "count_by_key", {}))], "source"
    )
    groups = chain_groups(t, cluster.physical)
    assert len(groups) == 2 and all(len(ws) == 3 for ws in groups.values()), groups
    assert rec.state == "done" and not rec.added and not rec.removed, rec.to_dict()
    assert [s["what"].split(":")[0] for s in rec.steps][2] == "SWAP", rec.steps
    assert report["ok"], report["problems"]
    want = reference(t.nodes["source"].args)
    assert {k: int(v) for k, v in report["results"]["count"]["counts"].items()} == want
    for w in report["workers"]:
        if w["node"] == "count":
            (old,) = w["swapped"]  # the old instance took part of the input, the new the rest
            assert old["operator"] == "count_by_key" and old["args"] == {"key": "word"}
            assert 0 < old["tuples_in"] < sum(w["in"].values()), (old, w["in"])
    logs = {p.name for p in tmp_path.glob("worker-*.log")}
    assert logs == {f"worker-{h}.log" for h in groups}, logs  # one process per instance
