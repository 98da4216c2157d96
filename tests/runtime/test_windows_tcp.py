"""Event-time windows over the tcp transport: real worker processes, real sockets.

``topologies/windows.yaml``: a seeded out-of-order event stream (bounded
disorder, some events late within the allowed lateness, some beyond it, a few
with a time that is not a number), its watermark from the events' time field,
a tumbling sum per key on 3 workers.  The last result of every window equals
the reference computed from the generator, the events beyond the lateness
arrive on the ``late`` stream, the bad times are counted where they were
dropped, and every window worker's watermark is in the run report.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from typhoon.operators.events import BAD, event, expected_windows
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_windows_equal_the_reference_and_late_events_go_to_late(tmp_path):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "windows.yaml"))
    t.name = "windowstcp"
    args = t.nodes["events"].args
    args.update(count=20_000, bad_every=499)
    cluster = TcpCluster(t, RunOptions(live=False, timeout=120), workdir=tmp_path / "run")
    try:
        cluster.start()
        cluster.activate()
        clean = cluster.wait()
        report = cluster.report(clean)
    finally:
        cluster.close()
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
