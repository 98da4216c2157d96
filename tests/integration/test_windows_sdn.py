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
from harness import ROOT, emulated_cluster, finish, wait

from typhoon.live import data_tuples
from typhoon.operators.ads import reference_window_counts
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


def test_windows_stay_exact_through_a_rescale(cluster):
    """``window`` scaled 3 -> 5 while the source runs: the open windows move with their
    key groups (keyed state).  No event beyond the lateness here: a new owner's
    watermark starts low, so one right after the move could still be taken in."""
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "windows.yaml"))
    t.name = "windowsscale"
    args = t.nodes["events"].args
    args.update(count=40_000, rate=4_000, late_every=0)
    cluster.submit(t)
    cluster.wait_active(t.name)
    source = cluster.coordinator.get_physical(t.name).of_node("events")[0].worker_id

    def sent() -> int:
        return data_tuples(cluster.coordinator.get_metrics(t.name).get(source, {}).get("out", {}))

    wait(lambda: sent() >= 8_000, 60, "8,000 events sent", 0.05)
    status, record = cluster.rest("POST", f"/apps/{t.name}/scale", {"node": "window",
                                                                    "parallelism": 5})  # fmt: skip
    assert status == 202, record

    def finished():
        record = cluster.rest("GET", f"/apps/{t.name}/reconfig")[1]
        return record if record["state"] != "running" else None

    record = wait(finished, 90, "the rescale", 0.05)
    assert record["state"] == "done", record
    assert cluster.coordinator.worker_statuses(t.name)[source].state != "exited"  # mid-run
    topology, reports = finish(cluster, t.name)
    report = build_report(topology, reports)
    assert report["ok"], report["problems"]
    # every round of the stepwise migration (docs/keyed_state.md), not only a worker's
    # last one: with 8 keys in 64 key groups most rounds move groups without a key
    moved = [m for w in report["workers"] if w["node"] == "window"
             for m in w.get("keyed", {}).get("migrations", {}).values()]  # fmt: skip
    assert sum(m["keys"] for m in moved) > 0, report["workers"]
    want, want_late = expected_windows(args, t.nodes["window"].args)
    assert want_late == []
    got = {}
    for key, start, end, value in report["results"]["results"]["tuples"]:
        got[(key, start, end)] = value
    assert got == want
    assert report["results"]["too_late"]["tuples"] == []


JOIN = """
name: joinsdn
config: {placement: spread}
spouts:
  - id: bids
    operator: event_source
    args: {count: 3000, seed: 5, keys: 4, step_ms: 1, disorder_ms: 20, rate: 3000}
    watermark: {time_field: ts, out_of_order_ms: 20, interval_ms: 20}
  - id: asks
    operator: event_source
    args: {count: 1500, seed: 6, keys: 4, step_ms: 2, disorder_ms: 10, rate: 1500}
    watermark: {time_field: ts, out_of_order_ms: 10, interval_ms: 20}
bolts:
  - id: join
    operator: window_join
    args: {left: bids, right: asks, left_key: key, right_key: key, left_time: ts,
           right_time: ts, size_ms: 40}
    parallelism: 3
  - {id: results, operator: collect, args: {limit: 1000000}}
streams:
  - {from: bids, to: join, grouping: {type: fields, fields: [key]}}
  - {from: asks, to: join, grouping: {type: fields, fields: [key]}}
  - {from: join, to: results, grouping: global}
"""


def test_window_join_on_three_hosts(cluster):
    """Two sources on two hosts, the join on three: every pair, once."""
    from typhoon.operators.events import event
    from typhoon.operators.windowing import window_starts
    from typhoon.topology import load_topology_text

    t = load_topology_text(JOIN, "join.yaml")
    cluster.submit(t)
    cluster.wait_active(t.name)
    topology, reports = finish(cluster, t.name)
    report = build_report(topology, reports)
    assert report["ok"], report["problems"]
    assert len({w["host"] for w in report["workers"] if w["node"] == "join"}) == 3
    sides = []
    for node in ("bids", "asks"):
        args = t.nodes[node].args
        by: dict = {}
        for i in range(args["count"]):
            values, _ = event(i, args)
            for s in window_starts(values[1], 40, 40):
                by.setdefault((values[0], s), []).append(values)
        sides.append(by)
    want = sorted(
        [key, s, s + 40, lv, rv]
        for (key, s), lefts in sides[0].items()
        for lv in lefts
        for rv in sides[1].get((key, s), [])
    )
    assert sorted(report["results"]["results"]["tuples"]) == want
    assert report["results"]["join"]["pairs"] == len(want) > 10_000


@pytest.mark.long
def test_ad_analytics_native_on_three_hosts(cluster):
    """``topologies/ad_analytics_native.yaml`` spread over the hosts: the per-campaign
    10 s counts of ``window_aggregate`` (behind ``lookup``, the watermark from the
    source's event time crossing the fabric) equal the ad pipeline's reference, one
    final row per window, none late."""
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "ad_analytics_native.yaml"))
    t.name = "adnativesdn"
    t.config["placement"] = "spread"
    t.nodes["campaign"].args["table"] = str(ROOT / "topologies" / "data" / "campaigns.csv")
    args = t.nodes["events"].args
    args.update(count=20_000)
    cluster.submit(t)
    cluster.wait_active(t.name)
    topology, reports = finish(cluster, t.name)
    report = build_report(topology, reports)
    assert report["ok"], report["problems"]
    counters = [w for w in report["workers"] if w["node"] == "campaign_counts"]
    assert len({w["host"] for w in counters}) == 2
    rows = report["results"]["sink"]["tuples"]
    got = {(campaign, start): n for campaign, start, _end, n in rows}
    assert len(got) == len(rows), "a window was emitted twice"
    want = reference_window_counts(20_000, args["seed"], per_second=args["per_second"])
    assert got == want and len({start for _c, start in want}) == 2
    assert report["results"]["campaign"]["miss"] == 0
    assert all(w["window_late"] == 0 and w["watermark_closed"] == 1 for w in counters)
