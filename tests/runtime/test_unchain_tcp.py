"""Live unchaining on tcp: a chained edge goes on a tcp connection inside its process and
back to a function call mid-run (``typhoon unchain`` / ``typhoon chain``; the plan of
``typhoon/reconfig/unchain.py`` run by the tcp coordinator, ``typhoon/tcp_reconfig.py``,
the process's side in ``typhoon/runtime/chain.py``).

Real worker processes and sockets.  Two jobs:

* topologies/wordcount_chained.yaml (source[i] and split[i] in one process), the two
  verbs typed through the CLI (``typhoon unchain NAME split``, the run's control
  endpoint): the counts equal the reference, nothing is lost, the sources' rows
  went over tcp between the two verbs and by function call again after ``chain``;
* running_max.yaml with count -> max chained (a running count per word and the
  largest count per word, both stateful and not additive): the maxima equal the
  word counts only if each process kept its state through the split and re-forming.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from tcp_verbs import no_loss, over_tcp_between_the_verbs, reference, run_verbs

from typhoon.reconfig.requests import Chain, Reroute, Scale, Unchain
from typhoon.topology import load_topology
from typhoon.topology.chaining import chained_streams

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_wordcount_chain_split_and_formed_again_mid_run_through_the_cli_is_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`typhoon unchain unchaintcp split` and `typhoon chain unchaintcp split`, typed
    mid-run: the CLI finds the run by its name and reaches its control endpoint
    (typhoon/tcp_control.py), which hands each verb to the run's executor."""
    monkeypatch.setenv("TYPHOON_TCP_JOBS", str(tmp_path / "jobs"))
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount_chained.yaml"))
    t.name = "unchaintcp"
    args = t.nodes["source"].args
    args.update(count=10_000, rate=1_600)  # per source worker: about 3 s
    report, records, frames, cluster = run_verbs(
        tmp_path, t, [(0.25, Unchain("split")), (0.6, Chain("split"))], "source", cli=True
    )
    out = capsys.readouterr().out
    assert "reconfiguration 1 of unchaintcp: unchain split" in out, out
    assert "reconfiguration 2 of unchaintcp: chain again split" in out, out
    assert out.count(" done in ") == 2, out
    # each verb: one POST, then GETs of .../reconfig until it ended; nothing refused
    assert report["control_endpoint"]["accepted"] >= 2
    assert report["control_endpoint"]["rejected"] == {}
    no_loss(report)
    assert {k: int(v) for k, v in report["results"]["count"]["counts"].items()} == reference(args)
    assert report["nodes"]["split"]["tuples_in"] == args["count"]
    # the processes stayed: one per chain instance, none launched again
    assert len({id(p) for p in cluster.procs.values()}) == 2 + 4
    assert cluster.physical.unchained == []
    splits = sorted(w.worker_id for w in cluster.physical.of_node("split"))
    assert records[0].physical is not None and records[0].physical.unchained == splits
    assert records[1].physical is not None and records[1].physical.unchained == []
    over_tcp_between_the_verbs(report, frames, "source")
    assert len(report["reconfigurations"]) == 2


RUNNING_MAX_CHAINED = """
name: unchainmax
spouts:
  - id: source
    operator: sentence_source
    args: {count: 12000, seed: 5, words: 8, vocabulary: 500, rate: 1600}
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: count
    operator: running_count
    parallelism: 3
    config: {max_parallelism: 64}
  - id: relay
    operator: identity
    parallelism: 3
  - id: max
    operator: max_by_key
    parallelism: 2
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: count, grouping: {type: fields, fields: [word]}}
  - {from: count, to: relay, grouping: forward}
  - {from: relay, to: max, grouping: {type: fields, fields: [key]}}
"""


def running_max_chained(tmp_path: Path) -> Any:
    """topologies/running_max.yaml with count[i] -> relay[i] (identity) chained: count's
    running counts per word (keyed state, not additive) live in the chain's processes,
    and max keeps the largest per word, which equals the word's count only if every
    running count went on from where it was."""
    path = tmp_path / "running_max_chained.yaml"
    path.write_text(RUNNING_MAX_CHAINED)
    t = load_topology(path)
    assert ("count", "relay") in {(s.src, s.dst) for s in chained_streams(t)}
    return t


def test_a_stateful_chain_keeps_its_state_through_unchain_chain_scale_and_a_direct_route(
    tmp_path: Path,
) -> None:
    """Unchain, chain again, scale the chain 3 -> 4 (count's keyed state moves, the new
    instance is one new process) and route the chained edge direct (unchained first):
    the maxima stay exact through all four."""
    t = running_max_chained(tmp_path)
    table = (("ka", 0), ("lo", 3))  # two of sentence_source's words (vocabulary())
    verbs = [
        (0.2, Unchain("count")),
        (0.4, Chain("count")),
        (0.6, Scale("count", 4)),
        (0.8, Reroute("count->relay", "direct", ("key",), table)),
    ]
    report, records, frames, cluster = run_verbs(tmp_path / "run", t, verbs, "count")
    no_loss(report)
    assert report["results"]["max"]["max"] == reference(t.nodes["source"].args)
    assert [r.request for r in records] == [v for _, v in verbs]
    counts = [w.worker_id for w in cluster.physical.of_node("count")]
    relays = [w.worker_id for w in cluster.physical.of_node("relay")]
    assert all(cluster.procs[c] is cluster.procs[r] for c, r in zip(counts, relays, strict=True))
    assert len({id(cluster.procs[c]) for c in counts}) == 4
    assert sorted(records[2].added) == [counts[3], relays[3]]
    assert report["nodes"]["relay"]["tuples_in"] == report["nodes"]["count"]["tuples_in"]
    # the direct route put every count -> relay edge on the network first; the processes
    # stayed
    assert cluster.physical.unchained == relays
    assert [s["action"] for s in records[3].steps][:3] == ["keep_rules", "write", "wait_rules"]
    old = sorted(frames[0])
    final = {w["worker"]: w["frames_out"] for w in report["workers"] if w["node"] == "count"}
    for w in old:
        assert frames[1][w] > frames[0][w], frames  # on the network between the verbs
        assert frames[2][w] == frames[1][w], frames  # function calls again, the scale too
        assert final[w] > frames[2][w], (final, frames)  # the direct route: network
