"""Whole ad-analytics runs over tcp with a real Spark driver process (paper Fig. 13 pipeline).

Counts are compared per campaign and window with the pure-Python reference.
The Spark node runs in update mode, so the final count of a window is the
last (largest) row for it, and an update sent twice would show as a repeated
(campaign, window, count) row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyspark_bridge.outbox import manifest_path, out_dir
from typhoon.operators.ads import reference_window_counts
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

REPO = Path(__file__).resolve().parents[2]
AD_YAML = REPO / "topologies" / "ad_analytics.yaml"
SEED = 7  # as in the topology file

pytestmark = pytest.mark.slow


def final_counts(rows: list[list]) -> dict[tuple[str, int], int]:
    assert len({(c, w, n) for c, w, _, n, _ in rows}) == len(rows), "an update was sent twice"
    final: dict[tuple[str, int], int] = {}
    for campaign, start, _end, count, _ts in rows:
        final[(campaign, start)] = max(final.get((campaign, start), 0), count)
    return final


def test_counts_equal_reference_and_the_run_ends_by_itself(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "typhoon_cli",
            "run",
            str(AD_YAML),
            "--transport",
            "tcp",
            "--report",
            str(report),
            "-q",
            "--arg",
            "events.count=30000",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=dict(os.environ),
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(report.read_text())
    assert r["ok"] and all(w["finished"] for w in r["workers"])
    assert final_counts(r["results"]["sink"]["tuples"]) == reference_window_counts(30000, SEED)
    spark = r["results"]["campaign_counts"]
    assert spark["appended"] == sum(reference_window_counts(30000, SEED).values())
    assert spark["replays_dropped"] == 0
    # the metrics bridge: progress events reached the run coordinator through METRIC_RESP
    events = r["spark_progress"]
    assert events and {e["node"] for e in events} == {"campaign_counts"}
    assert sum(e["input_rows"] for e in events) <= spark["appended"]
    assert r["services"]["spark-driver-h1"]["restarts"] == 0


@pytest.mark.long  # a further variant of test_spark_guarantee's killed workers (make test-long)
def test_driver_killed_mid_run_counts_stay_exact(tmp_path: Path) -> None:
    topo = load_topology(AD_YAML)
    count = 20_000
    topo.nodes["events"].args.update(count=count, rate=1000)  # 20 s of events (on a quiet host)
    params = topo.nodes["campaign_counts"].args["params"]
    params["campaigns"] = str(REPO / params["campaigns"])
    cluster = TcpCluster(topo, RunOptions(live=False, timeout=600), workdir=tmp_path)
    try:
        cluster.start()
        cluster.activate()
        outbox = out_dir(cluster.topology.nodes["campaign_counts"].args["dir"])
        deadline = time.monotonic() + 300
        while not manifest_path(outbox, 0).exists():
            assert time.monotonic() < deadline, "no batch was published"
            cluster.pump(0.1)
        (driver,) = cluster.service_procs.values()
        driver.kill()  # mid-run: the node has input Spark has not processed yet
        assert not (outbox / "done").exists()
        published = len(list(outbox.glob("*.json")))
        clean = cluster.wait()
        r = cluster.report(clean)
    finally:
        cluster.close()
    assert clean, r
    assert r["services"]["spark-driver-h1"]["restarts"] == 1
    assert final_counts(r["results"]["sink"]["tuples"]) == reference_window_counts(count, SEED)
    assert r["results"]["campaign_counts"]["batches"] > published  # the new driver went on
