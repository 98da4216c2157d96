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
