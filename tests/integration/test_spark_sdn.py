"""A spark-engine node on the SDN data plane: the ad-analytics pipeline on emulated hosts.

The node's workers keep their TAP ports, routing and credits; the agent of
the host with the node's first worker runs the Spark driver and holds its
workers back from "attached" until the driver serves, so sources start after.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from mininet_env.fabric import FabricPlan
from mininet_env.run import EmulatedCluster, SdnRunOptions
from typhoon.operators.ads import reference_window_counts
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def final_counts(rows: list[list]) -> dict[tuple[str, int], int]:
    """Last (largest) count per (campaign, window); an update sent twice is an error."""
    assert len({(c, w, n) for c, w, _, n, _ in rows}) == len(rows), "an update was sent twice"
    final: dict[tuple[str, int], int] = {}
    for campaign, start, _end, count, _ts in rows:
        final[(campaign, start)] = max(final.get((campaign, start), 0), count)
    return final


def test_ad_analytics_on_emulated_hosts_counts_equal_reference(tmp_path):
    options = SdnRunOptions(
        plan=FabricPlan(hosts=2, prefix=f"ty{secrets.token_hex(2)}s"),
        live=False,
        timeout=400,
        start_timeout=300,  # a cold Spark session takes tens of seconds here
        workdir=tmp_path,
    )
    topo = load_topology(ROOT / "topologies" / "ad_analytics.yaml")
    topo.nodes["events"].args["count"] = 20000
    cluster = EmulatedCluster(options)
    try:
        cluster.start()
        report = cluster.run(topo)
    finally:
        cluster.close()
    assert report["ok"], report.get("exit_codes")
    assert {w["host"] for w in report["workers"]} == {"h1", "h2"}
    assert final_counts(report["results"]["sink"]["tuples"]) == reference_window_counts(20000, 7)
    assert report["results"]["campaign_counts"]["replays_dropped"] == 0
