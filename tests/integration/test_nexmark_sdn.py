"""The Nexmark queries (topologies/nexmark/) on sdn over 3 emulated hosts, with real OVS and Ryu.

Each query file with ``placement: spread`` (its workers over the three hosts)
and 20,000 events; every sink's tuples in the run report must equal what
``typhoon.operators.nexmark_reference`` computes from the generated events.
The events come out of order within the watermark's bound, so the windowed
queries (q4, q5, q7, q8) are exact only if the watermarks crossed the fabric
behind their data and every window worker took the minimum of its inputs; the
joins (q3, q8) and the two-stage aggregates (q4, q5, q7) have their stages on
different hosts.  Nothing may be late.
"""

from __future__ import annotations

import copy

import pytest
from harness import ROOT, emulated_cluster, finish

from typhoon.operators import nexmark_reference as ref
from typhoon.operators.nexmark import kind_count
from typhoon.report import build_report
from typhoon.topology import load_topology

COUNT = 20_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(tmp_path_factory.mktemp("nexmark"), "x") as c:
        yield c


@pytest.mark.parametrize("name", ref.QUERIES)
def test_query_sinks_equal_the_reference_on_three_hosts(cluster, name):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "nexmark" / f"{name}.yaml"))
    t.name = f"nexmark{name}sdn"
    t.config["placement"] = "spread"
    sources = [n for n, node in t.nodes.items() if node.operator == "nexmark_source"]
    for n in sources:
        t.nodes[n].args["count"] = COUNT
    cluster.submit(t)
    cluster.wait_active(t.name)
    topology, reports = finish(cluster, t.name)
    report = build_report(topology, reports)
    assert report["ok"], report["problems"]
    # spread placement puts a node's i-th worker on the i-th host: as many hosts as the
    # widest node has workers, up to the cluster's three
    widest = max(w["index"] for w in report["workers"]) + 1
    assert len({w["host"] for w in report["workers"]}) == min(3, widest)

    args = {n: node.args for n, node in t.nodes.items()}
    for n in sources:
        assert report["results"][n]["emitted"] == kind_count(args[n]["kind"], COUNT), n
    for sink, value in ref.expected(name, args).items():
        got = ref.observed(name, sink, report["results"][sink]["tuples"])
        assert got == value, f"{name}: sink '{sink}' differs from the reference"
        assert value
    windowed = [w for w in report["workers"] if "window_late" in w]
    assert all(w["window_late"] == 0 for w in windowed)
    if name in ("q4", "q5", "q7", "q8"):
        assert windowed and all(w["watermark_closed"] == 1 for w in windowed)
    if name == "q4":
        assert report["results"]["closing"]["late"] == 0
