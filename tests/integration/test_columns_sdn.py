"""The columnar source over sdn on two emulated hosts, with real OVS and Ryu.

``topologies/forward_columns.yaml`` with its two workers on different hosts:
``sequence_columns`` sends numpy columns as column blocks (``emit_columns``), the
sink checks them as columns; every tuple must arrive exactly once, every one of
them sent and received in a block.
"""

from __future__ import annotations

import copy

import pytest
from harness import ROOT, emulated_cluster, finish

from typhoon.report import build_report
from typhoon.topology import load_topology

pytestmark = [pytest.mark.integration, pytest.mark.long]

COUNT = 300_000


def test_a_columnar_source_is_exact_across_two_hosts(tmp_path):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "forward_columns.yaml"))
    t.name = "colsdn"
    t.nodes["source"].args["count"] = COUNT
    with emulated_cluster(tmp_path, "c", hosts=2) as cluster:
        cluster.submit(t)
        cluster.wait_active(t.name)
        topology, reports = finish(cluster, t.name)
    report = build_report(topology, reports)
    assert report["ok"], report["problems"]
    sink = report["results"]["sink"]
    assert sink["expected"] == sink["received"] == COUNT
    assert sink["missing"] == 0 and sink["duplicates"] == 0
    workers = {w["node"]: w for w in report["workers"]}
    assert workers["source"]["host"] != workers["sink"]["host"]
    assert workers["source"]["columns_out"] == COUNT
    assert "columns_as_rows" not in workers["source"]
    assert workers["sink"]["columns_in"] == COUNT
    assert not workers["sink"]["drops"]
