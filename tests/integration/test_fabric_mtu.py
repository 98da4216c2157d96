"""Frames that fit the path: a fabric whose links carry 1450 bytes (what VXLAN leaves
on a 1500-byte underlay), tuples of 4000 bytes, every one delivered exactly once.

The emulated links get MTU 1450 on both the veths and OVS, so a frame larger than
the fabric allows would be dropped on the way (and counted by the drop check of
the run); the workers learn the size from the cluster (``Cluster.mtu``) and cut
each oversize tuple into segments.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from mininet_env.fabric import FabricPlan
from mininet_env.run import EmulatedCluster, SdnRunOptions
from typhoon.topology import load_topology_text

BIG_TUPLES = """
name: bigmtu
spouts:
  - id: source
    operator: sequence_source
    args: {count: 3000, size: 4000}
bolts:
  - id: sink
    operator: sequence_check
streams:
  - from: source
    to: sink
    grouping: shuffle
"""


def test_big_tuples_cross_a_1450_byte_fabric(tmp_path: Path, ovs) -> None:
    plan = FabricPlan(hosts=2, prefix=f"ty{secrets.token_hex(2)}m", mtu=1450)
    options = SdnRunOptions(plan=plan, live=False, timeout=240, workdir=tmp_path)
    cluster = EmulatedCluster(options)
    try:
        cluster.start()
        assert cluster.coordinator.get_cluster().mtu == 1450
        for br in cluster.network.bridges():
            for port in ovs.run("ovs-vsctl", "list-ports", br).split():
                assert ovs.run("ovs-vsctl", "get", "Interface", port, "mtu").strip() == "1450"
        report = cluster.run(load_topology_text(BIG_TUPLES, "bigmtu"))
    finally:
        cluster.close()
    hosts = {w["node"]: w["host"] for w in report["workers"]}
    assert hosts["source"] != hosts["sink"]  # across the fabric
    assert report["ok"], report["problems"]
    sink = report["results"]["sink"]
    assert (sink["expected"], sink["missing"], sink["duplicates"]) == (3000, 0, 0)
    specs = list(tmp_path.rglob("worker-*.spec.json"))
    assert specs and {json.loads(p.read_text())["transport"]["mtu"] for p in specs} == {1450}
