"""Transit through intermediate bridges on real OVS (issue 33 item 4).

A 4-host line fabric (h1-h2-h3-h4), the linefab benchmark's placement: source
on h1, sink on h4, two idle bolts on h2 and h3.  Every tuple reaches the sink
once, the intermediate bridges forward whole frames (many tuples each, not a
frame per tuple) by exactly the data rules the compiler emits for the pairs
crossing them, and nothing else.  How fast, against a mesh or tcp, is the
benchmark's question (``typhoon bench --only linefab``), not this test's.
"""

from __future__ import annotations

import pytest
from harness import emulated_cluster

from benchmarks.fabric_flows import FlowWatch
from benchmarks.scenarios.linefab import forward_4hosts
from typhoon.topology.batching import Batching

COUNT = 200_000
BATCH = 100


@pytest.mark.long
def test_line_transit_forwards_whole_frames_by_the_pair_rules(tmp_path):
    topology = forward_4hosts("linetransit", COUNT, "ends")
    Batching(BATCH, 2.0).write(topology.config)
    with emulated_cluster(tmp_path, "t", hosts=4, shape="line", timeout=120) as c:
        bridges = [c.options.plan.bridge(i) for i in range(1, 5)]
        watch = FlowWatch(bridges, every=0.2)
        report = c.run(topology)
        seen, _ = watch.stop()
    assert report["ok"], report.get("problems")
    sink = report["results"]["sink"]
    assert sink["received"] == COUNT and not sink.get("missing") and not sink.get("duplicates")
    by_host = dict(zip(("h1", "h2", "h3", "h4"), seen, strict=True))
    # source <-> sink crosses h2 and h3; source <-> pad3 crosses h2; one rule per direction
    assert [by_host[h].rules for h in ("h1", "h2", "h3", "h4")] == [6, 6, 4, 2]
    for h in ("h2", "h3", "h4"):
        # what the sink got came in over h2's and h3's links, in frames of many tuples
        assert by_host[h].frames > 0, h
        assert by_host[h].frames < COUNT / 10, (h, by_host[h].frames)
    assert by_host["h2"].frames >= by_host["h4"].frames
    assert by_host["h3"].frames >= by_host["h4"].frames
