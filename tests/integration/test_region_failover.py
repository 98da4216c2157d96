"""Region failover end to end: Mininet (3 hosts), real OVS, Ryu running the core's
built-in recovery, a job of three independent wordcount pipelines
(``topologies/pipelines.yaml``: ``source_N -> split_N x2 -> count_N x2``) under
``exactly_once``.

Once a global checkpoint is recorded, a worker of pipeline 1 is SIGKILLed (and, in
the second test, one of pipeline 2 with it).  Pass: the incident of each dead
worker says ``"rollback": "region"`` and lists only its own pipeline's workers as
rolled back and as its region; it restored a checkpoint, not the start; the
workers of the pipelines no failure touched report no restore and no rollback;
every pipeline's counts equal its reference exactly and the run report is ok.

The single kill is ``long`` (``make test-long``): the double kill, in ``make test``,
drives the same region rollback end to end for the same count worker of pipeline 1
and checks every assertion of the single kill (its incident, its region, an untouched
pipeline that reports no restore, exact counts), for two regions at once.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from harness import emulated_cluster, guaranteed_job, run_checkpointed_then
from test_guarantees import reference

from typhoon.coordinator import Coordinator
from typhoon.report import read_worker_reports, restored_epochs

PIPELINES = (1, 2, 3)

pytestmark = pytest.mark.integration


def run_with_kills(tmp_path: Path, tag: str, victims: list[str]) -> tuple[dict, list, dict]:
    """Run the pipelines job; once a global checkpoint is recorded, SIGKILL the first
    worker of each node in ``victims``.  The report, the worker reports, and
    node -> (worker killed, the workers of its pipeline before the kill)."""
    t = guaranteed_job("pipelines.yaml", f"rf{tag}", tmp_path / "ck")

    def kill(coordinator: Coordinator) -> dict[str, tuple[int, set[int]]]:
        physical = coordinator.get_physical(t.name)
        statuses = coordinator.worker_statuses(t.name)
        killed = {}
        for node in victims:
            i = node.rsplit("_", 1)[1]
            chain = {f"source_{i}", f"split_{i}", f"count_{i}"}
            mine = {w.worker_id for w in physical.workers if w.node in chain}
            victim = physical.active_of_node(node)[0].worker_id
            killed[node] = (victim, mine)
        for victim, _ in killed.values():
            os.kill(statuses[victim].pid, signal.SIGKILL)
        return killed

    with emulated_cluster(tmp_path / "run", tag, apps=()) as c:
        report, killed = run_checkpointed_then(c, t, kill)
        reports = read_worker_reports(c.report_dir(t.name))
    assert len(killed) == len(victims), "the kills never happened"
    for i in PIPELINES:  # every pipeline exact
        counts = {k: int(v) for k, v in report["results"][f"count_{i}"]["counts"].items()}
        want = reference(t.nodes[f"source_{i}"].args)
        diff = {w: (counts.get(w, 0), n) for w, n in want.items() if counts.get(w, 0) != n}
        assert not diff and set(counts) == set(want), (i, list(diff.items())[:10])
    assert report["ok"], report["problems"]
    return report, reports, killed


def check_regions(report: dict, reports: list, killed: dict) -> None:
    incidents = {i["worker"]: i for i in report["incidents"]}
    touched: set[int] = {victim for victim, _ in killed.values()}
    for victim, mine in killed.values():
        assert victim in incidents, report["incidents"]
        i = incidents[victim]
        assert i["state"] == "rejoined" and i["rollback"] == "region", i
        assert i["restore_epoch"] is not None, i  # a checkpoint, not the start
        assert set(i["region"]) == mine - {victim} | {i["replacement"]}, (i, mine)
        assert set(i["rolled_back"]) == mine - {victim}, (i, mine)
        # the pipeline's source rolled back in its process: it says what it replayed
        replayed = {int(w): n for w, n in i["replayed"].items()}
        assert set(replayed) <= mine and replayed and all(n >= 0 for n in replayed.values()), i
        touched |= set(i["region"])
        keys = ("worker", "rollback", "region", "rolled_back", "restore_epoch", "replayed")
        print("incident:", {k: i[k] for k in (*keys, "rolled_back_ms", "rejoined_ms")})
    by_worker = {r["worker"]: r for r in reports}
    untouched = [r for w, r in by_worker.items() if w not in touched]
    assert untouched
    for r in untouched:
        assert restored_epochs(r["metrics"]) == [], r["metrics"].get("restored_epochs")
        assert r["metrics"].get("rollbacks", 0) == 0 and r["metrics"].get("generation") == 0, r
    for victim, _ in killed.values():
        epoch = incidents[victim]["restore_epoch"]
        replacement = by_worker[incidents[victim]["replacement"]]
        assert restored_epochs(replacement["metrics"])[0] == epoch, replacement["metrics"]


@pytest.mark.long
def test_a_failure_rolls_back_only_its_pipeline(tmp_path: Path) -> None:
    report, reports, killed = run_with_kills(tmp_path, "p", ["count_1"])
    check_regions(report, reports, killed)
    pipelines = {r["node"].rsplit("_", 1)[1] for r in reports if restored_epochs(r["metrics"])}
    assert pipelines == {"1"}, pipelines


def test_failures_in_two_pipelines_at_once_roll_back_each_on_its_own(tmp_path: Path) -> None:
    report, reports, killed = run_with_kills(tmp_path, "q", ["count_1", "split_2"])
    check_regions(report, reports, killed)
    pipelines = {r["node"].rsplit("_", 1)[1] for r in reports if restored_epochs(r["metrics"])}
    assert pipelines == {"1", "2"}, pipelines
