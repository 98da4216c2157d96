"""``window_join`` through every worker's real framework layer on in-memory links.

Two seeded out-of-order event sources with their own watermarks, joined on the
key within tumbling windows on two workers: the pairs collected equal every
(left, right) pair of one key in one window, computed directly from the two
generators, whatever the interleaving of the links.
"""

from __future__ import annotations

import itertools

import pytest
from model_net import SeededNet

from typhoon.operators.base import Context
from typhoon.operators.events import event
from typhoon.operators.joins import WindowJoin
from typhoon.operators.windowing import window_starts
from typhoon.runtime.keyed_state import KeyedStates
from typhoon.topology import TopologyError, load_topology_text

JOB = """
name: join
spouts:
  - id: bids
    operator: event_source
    args: {{count: 500, seed: {seed}, keys: 4, step_ms: 1, disorder_ms: 20, rate: 1000}}
    watermark: {{time_field: ts, out_of_order_ms: 20, interval_ms: 5}}
  - id: asks
    operator: event_source
    args: {{count: 300, seed: {other}, keys: 4, step_ms: 2, disorder_ms: 10, rate: 500}}
    watermark: {{time_field: ts, out_of_order_ms: 10, interval_ms: 5}}
bolts:
  - id: join
    operator: window_join
    args: {{left: bids, right: asks, left_key: key, right_key: key, left_time: ts,
           right_time: ts, size_ms: 40{slide}}}
    parallelism: 2
  - {{id: results, operator: collect}}
  - {{id: too_late, operator: collect}}
streams:
  - {{from: bids, to: join, grouping: {{type: fields, fields: [key]}}}}
  - {{from: asks, to: join, grouping: {{type: fields, fields: [{right_field}]}}}}
  - {{from: join, to: results, grouping: global}}
  - {{from: join, to: too_late, stream: late, grouping: global}}
"""


def expected(left: dict, right: dict, size: int, slide: int) -> list:
    def by_window(args: dict) -> dict:
        out: dict = {}
        for i in range(args["count"]):
            values, _ = event(i, args)
            for s in window_starts(values[1], size, slide):
                out.setdefault((values[0], s), []).append(values)
        return out

    lw, rw = by_window(left), by_window(right)
    pairs = []
    for (key, s), lefts in lw.items():
        for lv, rv in itertools.product(lefts, rw.get((key, s), [])):
            pairs.append([key, s, s + size, lv, rv])
    return sorted(pairs)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("slide", ["", ", slide_ms: 20"], ids=["tumbling", "sliding"])
def test_join_pairs_equal_the_reference(seed, slide):
    net = SeededNet(JOB.format(seed=seed, other=seed + 100, slide=slide, right_field="key"), seed)
    net.run(400_000)
    t = net.topo
    want = expected(t.nodes["bids"].args, t.nodes["asks"].args, 40, 20 if slide else 40)
    assert want  # the keys and windows meet
    assert sorted(net.results("results")) == want
    assert net.results("too_late") == []
    joins = [net.fws[w.worker_id] for w in net.phys.of_node("join")]
    assert sum(fw.metrics()["join_pairs"] for fw in joins) == len(want)


def test_late_tuple_goes_to_late_with_its_side():
    op = WindowJoin("a", "b", "k", "k", "t", "t", 10)
    op.open(Context("x", "j", 1, 0, 1, operator="window_join", keyed_declared=True,
                    keyed=KeyedStates("window_join", "j", 1, [0], 1, {0}),
                    input_nodes={"a": ["k", "t"], "b": ["t", "k"]}))  # fmt: skip
    out: list = []

    def emit(values, stream="default"):
        out.append((stream, values))

    op.input = "a"
    op.process(["x", 3], emit)
    op.input = "b"
    op.process([5, "x"], emit)
    op.process(["soon", "x"], emit)  # not a time: counted
    op.on_watermark(10, emit)
    op.process([7, "x"], emit)  # its window closed
    op.input = "c"
    op.process([7, "x"], emit)  # not an input of the join: counted
    assert out == [
        ("default", ["x", 0, 10, ["x", 3], [5, "x"]]),
        ("late", ["x", 7, 7, None, [7, "x"]]),
    ]
    assert (op.bad_time, op.late, op.pairs, op.unknown_input) == (1, 1, 1, 1)


def test_loader_checks_both_sides():
    bad = JOB.format(seed=1, other=2, slide="", right_field="value")
    with pytest.raises(TopologyError, match="keeps its state per \\[key\\]"):
        load_topology_text(bad, "j.yaml")
    bad = JOB.format(seed=1, other=2, slide="", right_field="key").replace(
        "right: asks", "right: nowhere"
    )
    with pytest.raises(TopologyError, match="right 'nowhere' is not an input of this node"):
        load_topology_text(bad, "j.yaml")
