"""Windows through the real framework layers of every worker, on in-memory links.

``event_source`` -> ``window_aggregate`` -> ``collect``, each worker a real
:class:`~typhoon.runtime.framework.Framework` whose links keep their order as
the real transports do; a seeded scheduler interleaves deliveries on the links
and the workers' turns, and moves time.  The windows the sink collects must be
the reference computed from the generated events, whatever the interleaving:
watermarks travel behind their data, each window worker takes the minimum of
its inputs, and end of stream closes every window.
"""

from __future__ import annotations

import pytest
from model_net import SeededNet

from typhoon.operators.events import expected_windows

JOB = """
name: wmodel
spouts:
  - id: events
    operator: event_source
    args: {{count: {count}, seed: {seed}, keys: 5, step_ms: 1, disorder_ms: 20,
           tardy_every: {tardy_every}, tardy_ms: 30, late_every: {late_every}, late_ms: 600,
           rate: 1000}}
    parallelism: {sources}
    watermark: {{time_field: ts, out_of_order_ms: 25, interval_ms: 5}}
bolts:
  - id: window
    operator: window_aggregate
    args: {{key: key, time_field: ts, size_ms: 50, {slide} aggregate: sum, field: value,
           allowed_lateness_ms: 40}}
    parallelism: 3
  - {{id: results, operator: collect}}
  - {{id: too_late, operator: collect}}
streams:
  - {{from: events, to: window, grouping: {{type: fields, fields: [key]}}}}
  - {{from: window, to: results, grouping: global}}
  - {{from: window, to: too_late, stream: late, grouping: global}}
"""


def last_per_window(rows: list[list]) -> dict:
    out = {}
    for key, start, end, value in rows:
        out[(key, start, end)] = value
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slide", ["", "slide_ms: 25,"], ids=["tumbling", "sliding"])
def test_windows_equal_the_reference_with_late_tuples(seed, slide):
    """One source: the late events are late whatever the interleaving (the source's
    rate leaves time for a watermark that covers them to go out before them, on the
    same link)."""
    job = dict(count=3000, seed=seed, tardy_every=13, late_every=17, sources=1)
    net = SeededNet(JOB.format(slide=slide, **job), seed)
    net.run()
    args = net.topo.nodes["events"].args
    window = net.topo.nodes["window"].args
    want, want_late = expected_windows(args, window)
    got = last_per_window(net.results("results"))
    assert got == want
    late = net.results("too_late")
    assert sorted(t[3] for t in late) == sorted(want_late)
    assert all(t[1] == t[2] == t[3][1] for t in late)
    # the late tuples are counted where they were dropped, and reported per worker
    windows = [net.fws[w.worker_id] for w in net.phys.of_node("window")]
    assert sum(fw.metrics()["window_late"] for fw in windows) == len(want_late)
    assert all(fw.metrics()["watermark_closed"] == 1 for fw in windows)


@pytest.mark.parametrize("seed", range(4))
def test_two_sources_minimum_of_their_watermarks(seed):
    """Two sources, no late events: every window is exact whatever one source's lead
    (a window worker that followed the faster source alone would close windows early
    and drop the slower one's events as late)."""
    net = SeededNet(JOB.format(slide="", count=3000, seed=seed, tardy_every=0, late_every=0,
                         sources=2), seed)  # fmt: skip
    # let one source run ahead: the other gets a turn only every fourth time
    slow = net.phys.of_node("events")[1].worker_id
    step = net.fws[slow].step_spout
    turns = {"n": 0}

    def sometimes() -> None:
        turns["n"] += 1
        if turns["n"] % 4 == 0:
            step()

    net.fws[slow].step_spout = sometimes
    net.run(400_000)
    args = net.topo.nodes["events"].args
    want, _ = expected_windows(args, net.topo.nodes["window"].args)
    assert last_per_window(net.results("results")) == want
    assert net.results("too_late") == []
