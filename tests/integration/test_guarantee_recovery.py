"""A guarantee brings its own recovery: no ``apps/fault_detector.py`` in the controller.

Wordcount under ``exactly_once`` on 3 emulated hosts (real OVS, Ryu running the
core alone).  Once a global checkpoint is complete, one count worker is
SIGKILLed.  The core's built-in recovery (``controller/core_recovery.py``)
replaces it and rolls the job back.  Pass: the merged counts equal the
reference, the run report (``EmulatedCluster.run``, switch drop counters
included) is ``ok``, and its ``incidents`` name the dead worker, the workers
rolled back and the epoch restored; frames that met a drop rule on their way
to the dead worker's address are listed with the incident, not as a problem.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import emulated_cluster, guaranteed_job, kill_first, run_checkpointed_then
from test_guarantees import reference

from mininet_env.processes import leftovers
from typhoon.coordinator import Coordinator
from typhoon.runtime.tap import tap_name

pytestmark = pytest.mark.integration
SYS_NET = Path("/sys/class/net")


def wordcount(tmp_path: Path, prefix: str):
    return guaranteed_job(
        "wordcount.yaml", prefix, tmp_path / "ck", {"count": 24_000, "rate": 2_000},
        guarantee="exactly_once", checkpoint_interval_ms=500,
    )  # fmt: skip


def test_a_guaranteed_job_recovers_without_the_fault_detector_app(tmp_path: Path) -> None:
    t = wordcount(tmp_path, "gr")
    with emulated_cluster(tmp_path / "run", "r", apps=()) as c:
        report, victim = run_checkpointed_then(c, t, lambda co: kill_first(co, t.name, "count"))

    counts = {k: int(v) for k, v in report["results"]["count"]["counts"].items()}
    want = reference(t.nodes["source"].args)
    diff = {w: (counts.get(w, 0), n) for w, n in want.items() if counts.get(w, 0) != n}
    assert not diff and set(counts) == set(want), list(diff.items())[:10]
    assert report["ok"], report["problems"]
    assert victim in report["recovered"], report["recovered"]
    incidents = {i["worker"]: i for i in report["incidents"]}
    assert victim in incidents, report["incidents"]
    incident = incidents[victim]
    assert incident["state"] == "rejoined", incident
    assert incident["restore_epoch"] is not None, incident
    assert incident["rolled_back"], incident
    assert victim not in incident["rolled_back"], incident
    for line in incident.get("dropped", []):
        assert "met drop rule" in line, incident


def test_a_host_failure_under_exactly_once_recovers_on_the_other_hosts(tmp_path: Path) -> None:
    """A power cut of one emulated host mid-run (its agent and workers SIGKILLed, its
    bridge deleted): no port event comes, the heartbeat finds every worker it ran, the
    replacements go to the other hosts, the counts are exact and each incident names
    the host."""
    t = wordcount(tmp_path, "gh")
    config = "metrics_interval = 0.25\n[fault_detector]\nheartbeat_timeout = 2.0\n"

    with emulated_cluster(tmp_path / "run", "h", apps=(), config=config) as c:

        def power_cut(coordinator: Coordinator) -> dict[str, object]:
            physical = coordinator.get_physical(t.name)
            source_host = physical.active_of_node("source")[0].host
            hosts = [w.host for w in physical.active_of_node("count")]
            host = next((h for h in hosts if h != source_host), hosts[0])
            workers = [w.worker_id for w in physical.workers if w.host == host]
            return {"host": host, "workers": workers, "killed": c.fail_host(host)}

        report, failed = run_checkpointed_then(c, t, power_cut)

    # close() left nothing of the cut host: no worker process, no TAP
    assert leftovers(tmp_path / "run") == []
    taps = [tap_name(report["app_id"], w) for w in failed["workers"]]
    assert not [tap for tap in taps if (SYS_NET / tap).exists()], taps
    host, workers = failed["host"], failed["workers"]
    assert failed["killed"] == workers, failed
    counts = {k: int(v) for k, v in report["results"]["count"]["counts"].items()}
    want = reference(t.nodes["source"].args)
    diff = {w: (counts.get(w, 0), n) for w, n in want.items() if counts.get(w, 0) != n}
    assert not diff and set(counts) == set(want), list(diff.items())[:10]
    assert report["ok"], report["problems"]
    incidents = {i["worker"]: i for i in report["incidents"]}
    assert set(workers) <= set(incidents), (workers, report["incidents"])
    for wid in workers:
        i = incidents[wid]
        assert i["host"] == host and i["state"] == "rejoined", i
        assert i["reason"].startswith("no METRIC_RESP"), i
    assert host not in {w["host"] for w in report["workers"] if w["worker"] not in workers}
