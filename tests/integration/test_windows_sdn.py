"""Event-time windows on sdn over 3 emulated hosts, with real OVS and Ryu.

``topologies/windows.yaml`` with ``placement: spread`` (the window workers on
three hosts): a seeded out-of-order event stream with bounded disorder, events
late within the allowed lateness and beyond it; watermarks travel in-band
behind the data on every link, and on the multicast path of a one-to-many
stream.  The last result of every window equals the reference computed from the
generator, the events beyond the lateness arrive on ``late``, and the
receivers of the ``all`` stream got the watermark (their metrics say so).
"""

from __future__ import annotations

import copy

import pytest
from harness import ROOT, emulated_cluster, finish

from typhoon.operators.events import expected_windows
from typhoon.report import build_report
from typhoon.topology import load_topology
from typhoon.topology.model import Grouping, Node, Stream


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(tmp_path_factory.mktemp("windows"), "w") as c:
        yield c


def test_windows_equal_the_reference_on_three_hosts(cluster):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "windows.yaml"))
    t.name = "windowssdn"
    t.config["placement"] = "spread"
    args = t.nodes["events"].args
    args.update(count=20_000)
    # one-to-many: every window result to both workers of a second sink
    t.nodes["fanout"] = Node("fanout", "bolt", "collect", {}, parallelism=2, line=1)
    t.streams.append(Stream(len(t.streams) + 1, "window", "fanout", Grouping("all"), line=1))
    cluster.submit(t)
    cluster.wait_active(t.name)
    topology, reports = finish(cluster, t.name)
    report = build_report(topology, reports)
    assert report["ok"], report["problems"]
    hosts = {w["host"] for w in report["workers"] if w["node"] == "window"}
    assert len(hosts) == 3

    want, want_late = expected_windows(args, t.nodes["window"].args)
    got = {}
    for key, start, end, value in report["results"]["results"]["tuples"]:
        got[(key, start, end)] = value
    assert got == want
    late = report["results"]["too_late"]["tuples"]
    assert sorted(row[3] for row in late) == sorted(want_late)
    assert len(want_late) > 100
    assert report["results"]["window"]["late"] == len(want_late)
    # the `all` stream: each fanout worker got every result, and the watermarks with them
    fan = [w for w in report["workers"] if w["node"] == "fanout"]
    assert len(fan) == 2 and all(w["watermark_closed"] == 1 for w in fan)
    assert len(report["results"]["fanout"]["tuples"]) == 2 * len(
        report["results"]["results"]["tuples"]
    )
    windows = [w for w in report["workers"] if w["node"] == "window"]
    assert all(w["watermark_closed"] == 1 for w in windows)
