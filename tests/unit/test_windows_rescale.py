"""Windows through a rescale of ``window_aggregate``, in the model of
tests/unit/test_keyed_migration.py: every worker's real framework layer, the real
plan of a ``Scale`` run step by step, a seeded scheduler interleaving deliveries,
turns, time and control tuples.  The open windows move with their key groups; a
window that fired on the old owner and gets a tuple within its lateness on the
new one (whose watermark may still be lower) is emitted again, updated: the last
result of every window equals the reference computed from the generator.  (Before
that fix 1 of 16 cases lost a tuple's update.)
"""

from __future__ import annotations

import collections
import random

import pytest
from test_keyed_migration import Blobs, Net

from typhoon.operators.events import expected_windows
from typhoon.reconfig import Scale
from typhoon.topology import load_topology_text, schedule

JOB = """
name: wrescale
spouts:
  - id: source
    operator: event_source
    args: {count: 1500, seed: SEED, keys: 12, step_ms: 1, disorder_ms: 20, tardy_every: 11,
           tardy_ms: 30, rate: 500}
    watermark: {time_field: ts, out_of_order_ms: 25, interval_ms: 4}
bolts:
  - id: window
    operator: window_aggregate
    args: {key: key, time_field: ts, size_ms: 40, slide_ms: 20, aggregate: count,
           allowed_lateness_ms: 30}
    parallelism: 3
    config: {max_parallelism: 16}
  - {id: results, operator: collect}
  - {id: too_late, operator: collect}
streams:
  - {from: source, to: window, grouping: {type: fields, fields: [key]}}
  - {from: window, to: results, grouping: global}
  - {from: window, to: too_late, stream: late, grouping: global}
"""


class WindowNet(Net):
    def __init__(self, seed: int) -> None:  # Net's, over this job
        self.rng = random.Random(seed)
        self.topo = load_topology_text(JOB.replace("SEED", str(seed)))
        self.phys = schedule(self.topo, ["h1"], 3, first_port=10)
        self.blobs = Blobs()
        self.now = 0.0
        self.links = collections.defaultdict(collections.deque)
        self.fws = {}
        self.controls = []
        self.acks = set()
        self.version = 0
        for w in self.phys.workers:
            self.start(self.phys, w.worker_id)

    def collected(self, node: str) -> list:
        (w,) = self.phys.of_node(node)
        return self.fws[w.worker_id].op.result()["tuples"]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("to", [5, 2])
def test_windows_stay_exact_through_a_rescale(seed, to):
    net = WindowNet(seed)
    cut = net.rng.randrange(300, 900)
    net.run(lambda: sum(fw.tuples_in.get(1, 0) for fw in net.fws.values()) >= cut)
    p = net.reconfigure(Scale("window", to))
    rounds = [s.control for s in p.steps if s.action == "control"].count("KEYGROUPS") // 2
    assert rounds >= 1  # stepwise by default: every round must keep the windows exact
    net.run(net.done, 400_000)
    want, _ = expected_windows(net.topo.nodes["source"].args, net.topo.nodes["window"].args)
    got = {}
    for key, start, end, value in net.collected("results"):
        got[(key, start, end)] = value
    assert got == want
    assert net.collected("too_late") == []
    moved = [fw.last_migration for fw in net.fws.values() if fw.last_migration]
    assert sum(m["keys"] for m in moved) > 0  # open windows travelled
