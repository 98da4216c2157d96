"""A spark node in the global checkpoint on the SDN data plane, with the fault detector.

The job of tests/spark/test_spark_guarantee.py (source -> split -> spark
``running_counts`` -> collect, ``exactly_once``, 500 ms checkpoints) on 2
emulated hosts.  The spark node's first worker is SIGKILLed once Spark has
published batches; the fault detector starts a replacement under a new worker
ID, which continues the dead worker's log and outbox parts, and the job rolls
back.  The last row per word must be its exact count, with no update twice.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from pathlib import Path

import pytest
from harness import wait

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark"))
from test_spark_guarantee import final_counts, reference, topology  # noqa: E402

from mininet_env.fabric import FabricPlan  # noqa: E402
from mininet_env.run import EmulatedCluster, SdnRunOptions  # noqa: E402
from pyspark_bridge.outbox import manifest_path, out_dir  # noqa: E402
from typhoon.report import build_report, read_worker_reports  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    options = SdnRunOptions(
        plan=FabricPlan(hosts=2, prefix=f"ty{secrets.token_hex(2)}k"),
        apps=["apps/fault_detector.py"],
        live=False,
        timeout=400,
        start_timeout=300,  # a cold Spark session takes tens of seconds here
        controller_config=(
            "reconfig_step_timeout = 60\nmetrics_interval = 0.25\n"
            "[fault_detector]\nheartbeat_timeout = 15.0\n"
        ),
        workdir=tmp_path_factory.mktemp("spark-guarantee-sdn"),
    )
    c = EmulatedCluster(options)
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.mark.integration
def test_spark_node_survives_a_killed_worker_on_sdn(cluster, tmp_path):
    c = cluster
    t = topology(tmp_path)
    t.name = f"sk{secrets.token_hex(2)}"
    c.submit(t)
    c.wait_active(t.name)
    outbox = out_dir(c.workdir / t.name / "engines" / "spark" / "counts")
    wait(lambda: manifest_path(outbox, 1).exists(), 300, "Spark's second batch")
    physical = c.coordinator.get_physical(t.name)
    victim = physical.active_of_node("counts")[0].worker_id
    os.kill(c.coordinator.worker_statuses(t.name)[victim].pid, signal.SIGKILL)

    def rejoined():
        faults = c.rest("GET", "/faults")[1]  # worker IDs repeat across applications
        incident = {i["worker"]: i for i in faults if i["app"] == t.name}.get(victim)
        return incident if incident and incident["state"] in ("rejoined", "failed") else None

    incident = wait(rejoined, 120, f"the replacement of worker {victim}")
    assert incident["state"] == "rejoined", incident
    clean = c.wait_finished(t.name)
    reports = read_worker_reports(c.report_dir(t.name))
    c.kill(t.name)
    report = build_report(t, reports, ok=clean, recovered=c.recovered, transport="sdn")
    assert victim in c.recovered, c.recovered
    assert final_counts(report["results"]["sink"]["tuples"]) == reference()
    assert report["ok"], report["problems"]
    # the replacement (a new worker ID) continued the dead worker's log: no log of its own
    logs = sorted(p.name for p in (outbox.parent / "in").iterdir())
    assert logs == sorted(f"w{w.worker_id}" for w in physical.active_of_node("counts")), logs
