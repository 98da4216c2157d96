"""A columnar source under ``exactly_once`` over sdn, a keyed worker SIGKILLed mid-run.

``topologies/keyed_columns.yaml`` on two emulated hosts (real OVS, Ryu running the core
alone): ``keyed_columns`` sends column blocks, a fields grouping on the int ``key``
deals them to ``max_and_prev`` (the largest and the last value per key, emitted with
each tuple), ``digest`` checksums every output.  Once a global checkpoint is complete
the first ``peak`` worker is SIGKILLed; the core's recovery replaces it and rolls the
job back (the source in place: ``hooks.bind_operator``).  Per-key results and the
digest must equal ``keyed_columns_reference``'s: 0 lost, 0 duplicated.
"""

from __future__ import annotations

import copy
import os
import secrets
import signal
import threading
from pathlib import Path

import pytest
from harness import ROOT, emulated_cluster, wait
from keyed_columns_reference import check, reference

from typhoon.coordinator import open_coordinator
from typhoon.topology import load_topology

pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_a_columnar_keyed_job_is_exact_after_a_killed_worker_over_sdn(tmp_path: Path) -> None:
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "keyed_columns.yaml"))
    t.name = f"ck{secrets.token_hex(2)}"
    args = t.nodes["source"].args
    args.update(count=60_000, rate=15_000)
    t.config.update(
        guarantee="exactly_once", checkpoint_interval_ms=300, checkpoint_store=str(tmp_path / "ck")
    )
    name = t.name
    killed: dict[str, int] = {}

    with emulated_cluster(tmp_path / "run", "k", hosts=2, apps=()) as c:

        def kill() -> None:
            coordinator = open_coordinator(c.coordinator_url)  # sqlite: one per thread
            try:
                wait(
                    lambda: (coordinator.get_app_state(name) or {}).get("checkpoint"),
                    60,
                    "a completed global checkpoint",
                )
                victim = coordinator.get_physical(name).active_of_node("peak")[0].worker_id
                os.kill(coordinator.worker_statuses(name)[victim].pid, signal.SIGKILL)
                killed["worker"] = victim
            finally:
                coordinator.close()

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        report = c.run(t)
        killer.join(timeout=5)

    assert "worker" in killed, "the kill never happened"
    check(report, reference(args))
    assert report["ok"], report["problems"]
    incidents = {i["worker"]: i for i in report["incidents"]}
    incident = incidents[killed["worker"]]
    assert incident["state"] == "rejoined" and incident["restore_epoch"] is not None, incident
    workers = {w["node"]: w for w in report["workers"]}
    source = workers["source"]
    assert source["worker"] in incident["rolled_back"], incident  # rolled back in place
    assert 0 < source["replayed_from"]["emitted"] < args["count"], source["replayed_from"]
    assert source["columns_out"] >= args["count"] and "columns_as_rows" not in source, source
    assert len({w["host"] for w in report["workers"]}) == 2
