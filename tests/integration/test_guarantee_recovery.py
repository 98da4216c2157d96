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

import copy
import os
import secrets
import signal
import threading
from pathlib import Path

import pytest
from harness import emulated_cluster, wait
from test_guarantees import reference

from typhoon.coordinator import open_coordinator
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_a_guaranteed_job_recovers_without_the_fault_detector_app(tmp_path: Path) -> None:
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.name = f"gr{secrets.token_hex(2)}"
    t.nodes["source"].args.update(count=24_000, rate=2_000)
    t.config.update(
        guarantee="exactly_once", checkpoint_interval_ms=500, checkpoint_store=str(tmp_path / "ck")
    )
    name = t.name
    killed: dict[str, int] = {}

    with emulated_cluster(tmp_path / "run", "r", apps=()) as c:

        def kill() -> None:
            coordinator = open_coordinator(c.coordinator_url)  # sqlite: one per thread
            try:

                def checkpointed():
                    state = coordinator.get_app_state(name) or {}
                    return state.get("checkpoint")

                wait(checkpointed, 60, "a completed global checkpoint")
                victim = coordinator.get_physical(name).active_of_node("count")[0].worker_id
                os.kill(coordinator.worker_statuses(name)[victim].pid, signal.SIGKILL)
                killed["worker"] = victim
            finally:
                coordinator.close()

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        report = c.run(t)
        killer.join(timeout=5)

    assert "worker" in killed, "the kill never happened"
    victim = killed["worker"]
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
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.name = f"gh{secrets.token_hex(2)}"
    t.nodes["source"].args.update(count=24_000, rate=2_000)
    t.config.update(
        guarantee="exactly_once", checkpoint_interval_ms=500, checkpoint_store=str(tmp_path / "ck")
    )
    name = t.name
    failed: dict[str, object] = {}
    config = "metrics_interval = 0.25\n[fault_detector]\nheartbeat_timeout = 2.0\n"

    with emulated_cluster(tmp_path / "run", "h", apps=(), config=config) as c:

        def power_cut() -> None:
            coordinator = open_coordinator(c.coordinator_url)  # sqlite: one per thread
            try:
                wait(
                    lambda: (coordinator.get_app_state(name) or {}).get("checkpoint"),
                    60,
                    "a completed global checkpoint",
                )
                physical = coordinator.get_physical(name)
                source_host = physical.active_of_node("source")[0].host
                hosts = [w.host for w in physical.active_of_node("count")]
                host = next((h for h in hosts if h != source_host), hosts[0])
                failed["host"] = host
                failed["workers"] = [w.worker_id for w in physical.workers if w.host == host]
            finally:
                coordinator.close()
            failed["killed"] = c.fail_host(failed["host"])

        cutter = threading.Thread(target=power_cut, daemon=True)
        cutter.start()
        report = c.run(t)
        cutter.join(timeout=5)

    assert "killed" in failed, "the power cut never happened"
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
