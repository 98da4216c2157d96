"""Event-time windows over the tcp transport: real worker processes, real sockets.

``topologies/windows.yaml``: a seeded out-of-order event stream (bounded
disorder, some events late within the allowed lateness, some beyond it, a few
with a time that is not a number), its watermark from the events' time field,
a tumbling sum per key on 3 workers.  The last result of every window equals
the reference computed from the generator, the events beyond the lateness
arrive on the ``late`` stream, the bad times are counted where they were
dropped, and every window worker's watermark is in the run report.  Under
``exactly_once`` a SIGKILLed window worker is relaunched from the last global
checkpoint with its open windows (keyed state) and the watermark they saw, and
the windows stay exact.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from midrun_kill import run_killing, sent_by

from typhoon.operators.ads import reference_window_counts
from typhoon.operators.events import BAD, event, expected_windows
from typhoon.tcp_cluster import RunOptions, TcpCluster, run_tcp
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_windows_equal_the_reference_and_late_events_go_to_late(tmp_path):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "windows.yaml"))
    t.name = "windowstcp"
    args = t.nodes["events"].args
    args.update(count=20_000, bad_every=499)
    report = run_tcp(t, RunOptions(live=False, timeout=120, workdir=tmp_path))
    assert report["ok"], report["problems"]
    want, want_late = expected_windows(args, t.nodes["window"].args)
    got = {}
    for key, start, end, value in report["results"]["results"]["tuples"]:
        got[(key, start, end)] = value  # one link from each window worker: the last counts
    assert got == want
    late = report["results"]["too_late"]["tuples"]
    assert sorted(row[3] for row in late) == sorted(want_late)
    assert len(want_late) > 100
    bad = sum(1 for i in range(args["count"]) if event(i, args)[1] == BAD)
    merged = report["results"]["window"]
    assert merged["bad_time"] == bad > 0
    assert merged["late"] == len(want_late)
    workers = {w["node"]: w for w in report["workers"]}
    assert workers["events"]["watermark_bad_time"] == bad
    windows = [w for w in report["workers"] if w["node"] == "window"]
    assert len(windows) == 3
    assert all(w["watermark_closed"] == 1 for w in windows)
    assert sum(w["window_late"] for w in windows) == len(want_late)
    # the source's watermark stays behind the largest time it emitted by out_of_order_ms
    times = [event(i, args)[0][1] for i in range(args["count"])]
    high = max(ts for ts in times if isinstance(ts, int))
    assert 0 < workers["events"]["watermark"] <= high - 200


def test_windows_stay_exact_through_a_sigkill_under_exactly_once(tmp_path):
    """No event beyond the lateness here: which ones are depends on when watermarks
    arrived, and a replay changes that; every other result does not."""
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "windows.yaml"))
    t.name = "windowskill"
    args = t.nodes["events"].args
    args.update(count=20_000, late_every=0, rate=4_000)
    t.config.update(
        guarantee="exactly_once", checkpoint_interval_ms=300, checkpoint_store=str(tmp_path / "ck")
    )
    cluster = TcpCluster(t, RunOptions(live=False, timeout=120), workdir=tmp_path / "run")
    try:
        cluster.start()
        cluster.activate()
        victim = cluster.physical.of_node("window")[1].worker_id
        sent = sent_by(cluster, "events")
        # mid-run by count (the source's METRIC_RESPs), not a sleep
        clean = run_killing(cluster, [victim], lambda: sent() >= 8_000)
        report = cluster.report(clean)
    finally:
        cluster.close()
    assert len(cluster.recovered) == 1, cluster.recovered
    assert report["ok"], report["problems"]
    want, want_late = expected_windows(args, t.nodes["window"].args)
    assert want_late == []
    got = {}
    for key, start, end, value in report["results"]["results"]["tuples"]:
        got[(key, start, end)] = value
    assert got == want
    assert report["results"]["too_late"]["tuples"] == []


JOIN = """
name: jointcp
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
    parallelism: 2
  - {id: results, operator: collect, args: {limit: 1000000}}
  - {id: too_late, operator: collect}
streams:
  - {from: bids, to: join, grouping: {type: fields, fields: [key]}}
  - {from: asks, to: join, grouping: {type: fields, fields: [key]}}
  - {from: join, to: results, grouping: global}
  - {from: join, to: too_late, stream: late, grouping: global}
"""


def test_window_join_pairs_equal_every_pair_of_the_two_sources(tmp_path):
    """Two sources, each with its watermark: a join worker closes a window only when
    both passed it, so every pair is there, once."""
    from typhoon.operators.windowing import window_starts
    from typhoon.topology import load_topology_text

    t = load_topology_text(JOIN, "join.yaml")
    report = run_tcp(t, RunOptions(live=False, timeout=120, workdir=tmp_path))
    assert report["ok"], report["problems"]
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
    assert len(want) > 10_000
    assert sorted(report["results"]["results"]["tuples"]) == want
    assert report["results"]["too_late"]["tuples"] == []
    assert report["results"]["join"]["pairs"] == len(want)


@pytest.mark.long
def test_ad_analytics_native_counts_equal_the_reference(tmp_path):
    """``topologies/ad_analytics_native.yaml``: the per-campaign 10 s counts of
    ``window_aggregate`` (behind ``lookup``) equal the ad pipeline's reference,
    one final row per window, none late, the watermark taken from the source's
    event time."""
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "ad_analytics_native.yaml"))
    t.name = "adnativetcp"
    t.nodes["campaign"].args["table"] = str(ROOT / "topologies" / "data" / "campaigns.csv")
    args = t.nodes["events"].args
    args.update(count=30_000, rate=15_000)
    report = run_tcp(t, RunOptions(live=False, timeout=120, workdir=tmp_path))
    assert report["ok"], report["problems"]
    rows = report["results"]["sink"]["tuples"]
    got = {(campaign, start): n for campaign, start, _end, n in rows}
    assert len(got) == len(rows), "a window was emitted twice"
    want = reference_window_counts(30_000, args["seed"], per_second=args["per_second"])
    assert got == want and len({start for _c, start in want}) == 3
    assert report["results"]["campaign"]["miss"] == 0
    counters = [w for w in report["workers"] if w["node"] == "campaign_counts"]
    assert len(counters) == 2 and all(w["window_late"] == 0 for w in counters)
    assert all(w["watermark_closed"] == 1 for w in counters)
