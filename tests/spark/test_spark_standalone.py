"""The Spark node on a Spark standalone cluster (``spark.master = spark://...``).

A master and a worker start from the installed pyspark distribution
(tests/spark/standalone.py); the ad-analytics pipeline runs over tcp with its
Spark node's executors on that worker, and the window counts must be exactly
the reference's, which is what ``local[*]`` gives
(tests/spark/test_spark_ad_analytics.py).  The master's own record shows the
application ran there, with executors on the worker.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from standalone import WORKER_CORES, StandaloneCluster
from test_spark_ad_analytics import AD_YAML, REPO, SEED, final_counts

from typhoon.operators.ads import reference_window_counts
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

pytestmark = pytest.mark.slow
COUNT = 20_000


@pytest.fixture
def standalone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if shutil.which("java") is None:
        pytest.fail("Java is not installed: the Spark engine needs a JDK (make setup)")
    # the driver (a child of the run) binds to loopback, where the master and worker listen
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    cluster = StandaloneCluster(tmp_path / "spark")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.long  # ad analytics again, on a standalone Spark cluster (make test-long)
def test_ad_analytics_on_a_standalone_cluster_counts_exactly(tmp_path: Path, standalone) -> None:
    topo = load_topology(AD_YAML)
    assert topo.config["spark.master"].startswith("local")  # the file's default
    topo.config.update(standalone.executor_conf())
    topo.nodes["events"].args.update(count=COUNT)
    params = topo.nodes["campaign_counts"].args["params"]
    params["campaigns"] = str(REPO / params["campaigns"])
    cluster = TcpCluster(topo, RunOptions(live=False, timeout=300), workdir=tmp_path / "run")
    try:
        cluster.start()
        cluster.activate()
        clean = cluster.wait()
        r = cluster.report(clean)
    finally:
        cluster.close()
    assert clean, r
    assert final_counts(r["results"]["sink"]["tuples"]) == reference_window_counts(COUNT, SEED)
    spark = r["results"]["campaign_counts"]
    assert spark["appended"] == sum(reference_window_counts(COUNT, SEED).values())
    assert spark["replays_dropped"] == 0
    assert r["services"]["spark-driver-h1"]["restarts"] == 0

    # the application ran on the standalone master, with the worker's cores
    state = standalone.state()
    apps = state["activeapps"] + state["completedapps"]
    ours = [a for a in apps if a["name"].startswith("typhoon-ad_analytics")]
    assert len(ours) == 1, apps
    assert ours[0]["cores"] == WORKER_CORES
    executors = list((standalone.workdir / "work" / ours[0]["id"]).iterdir())
    assert executors, "the worker started no executor for the application"
