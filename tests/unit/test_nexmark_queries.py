"""The Nexmark queries (topologies/nexmark/) through every worker's real framework layer.

Each query file is loaded as it is (only the event count, the event spacing and
the seed changed, so a run takes seconds), scheduled, and every worker is a real
:class:`~typhoon.runtime.framework.Framework` with its operator, on in-memory
links that keep their order as the real transports do; a seeded scheduler
interleaves deliveries and the workers' turns (as tests/unit/test_windows_model.py
does).  The sinks must hold what ``typhoon.operators.nexmark_reference``
computes from the generated events, whatever the interleaving.  The events
come out of order (the generator's bounded disorder, 200 ms over events 2 ms
apart), within the watermark's ``out_of_order_ms``: nothing may be late.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from model_net import SeededNet

from typhoon.operators import nexmark_reference as ref
from typhoon.operators.nexmark import BID, events_of, kind_count
from typhoon.topology import Topology, load_topology

QUERIES = Path(__file__).resolve().parents[2] / "topologies" / "nexmark"
# 6,000 events 2 ms apart: 12 s of event time, 5,520 bids, 360 auctions, 120 people
SMALL = {"count": 6000, "step_us": 2000}
SPAN_S = 2.0  # every source emits its events over 2 s of the scheduler's clock


def query(name: str, seed: int) -> tuple[Topology, dict[str, dict]]:
    """The query file with the small run's arguments on every source; its nodes' args."""
    topo = copy.deepcopy(load_topology(QUERIES / f"{name}.yaml"))
    for node in topo.nodes.values():
        if node.operator == "nexmark_source":
            node.args.update(SMALL, seed=seed)
            # paced, so that watermarks (every 5 ms) go out between the events they cover
            n = kind_count(node.args["kind"], SMALL["count"])
            node.args["rate"] = n / node.parallelism / SPAN_S
            node.watermark["interval_ms"] = 5
    return topo, {n: node.args for n, node in topo.nodes.items()}


def run(name: str, seed: int) -> tuple[SeededNet, dict[str, dict]]:
    topo, args = query(name, seed)
    net = SeededNet(topo, seed, batch_size=16)
    net.run(2_000_000)
    for w in net.phys.workers:  # the watermark rose many times before the end
        if topo.nodes[w.node].kind == "spout":
            assert net.fws[w.worker_id].metrics()["watermarks_sent"] > 50
    return net, args


def windows(rows: list[list]) -> dict:
    """``[key, start, end, value]`` rows as one value per window; each window once."""
    out = {}
    for key, start, end, value in rows:
        assert (key, start, end) not in out, f"window {(key, start, end)} emitted twice"
        out[(key, start, end)] = value
    return out


def test_the_bids_come_out_of_order_within_the_watermark_bound():
    _, args = query("q0", 3)
    times = [b[5] for b in events_of(BID, args["bids"])]
    behind = [hi - t for hi, t in zip(_running_max(times), times, strict=True)]
    assert max(behind) > 50  # out of order, by much more than the spacing of events
    assert max(behind) <= args["bids"]["disorder_ms"]
    wm = load_topology(QUERIES / "q0.yaml").nodes["bids"].watermark
    assert wm["time_field"] == "dateTime" and wm["out_of_order_ms"] >= max(behind)


def _running_max(xs: list[int]) -> list[int]:
    out, hi = [], xs[0]
    for x in xs:
        hi = max(hi, x)
        out.append(hi)
    return out


@pytest.mark.parametrize("seed", range(2))
def test_q0_pass_through(seed):
    net, args = run("q0", seed)
    got = ref.multiset(net.results("results"))
    assert got == ref.q0(args["bids"])
    assert sum(got.values()) == 5520


@pytest.mark.parametrize("seed", range(2))
def test_q1_currency_conversion(seed):
    net, args = run("q1", seed)
    want = ref.q1(args["bids"], args["convert"])
    assert ref.multiset(net.results("results")) == want
    assert any(type(row[2]) is float for row in want)
    assert net.metric("convert", "map_bad_value") == 0


@pytest.mark.parametrize("seed", range(2))
def test_q2_selection(seed):
    net, args = run("q2", seed)
    want = ref.q2(args["bids"], args["select"])
    assert ref.multiset(net.results("results")) == want
    assert 0 < sum(want.values()) < 5520
    assert net.metric("select", "filter_bad_value") == 0


@pytest.mark.parametrize("seed", range(3))
def test_q3_local_item_suggestion(seed):
    net, args = run("q3", seed)
    want = ref.q3(
        args["persons"], args["auctions"], args["local"]["values"], args["category"]["equals"]
    )
    assert ref.multiset(net.results("results")) == want
    assert sum(want.values()) > 3


@pytest.mark.parametrize("seed", range(3))
def test_q5_hot_items(seed):
    net, args = run("q5", seed)
    counts, hottest = ref.q5(args["bids"], args["count"], args["hottest"])
    assert windows(net.results("counts")) == counts
    assert windows(net.results("results")) == hottest
    assert len(hottest) >= 20
    assert net.metric("count", "window_late") == net.metric("hottest", "window_late") == 0
    # the hot auctions of each window: those whose count is that window's maximum
    hot = {(s, a) for (a, s, _), n in counts.items() if n == hottest[(s, *_slot(s, args))]}
    assert hot


def _slot(start: int, args: dict) -> tuple[int, int]:
    end = start + args["count"]["size_ms"]
    return end, end + args["hottest"]["size_ms"]


@pytest.mark.parametrize("seed", range(3))
def test_q7_highest_bid(seed):
    net, args = run("q7", seed)
    want = ref.q7(args["bids"], args["per_auction"], args["highest"])
    assert windows(net.results("results")) == want
    assert len(want) == 13  # one per second of event time: 12 s and the disorder past it
    assert net.metric("per_auction", "window_late") == net.metric("highest", "window_late") == 0


@pytest.mark.parametrize("seed", range(3))
def test_q8_monitor_new_users(seed):
    net, args = run("q8", seed)
    want = ref.q8(args["persons"], args["auctions"], args["join"])
    assert ref.multiset(net.results("results")) == want
    assert sum(want.values()) > 20
    assert net.metric("join", "window_late") == 0


def test_a_watermark_tighter_than_the_disorder_finds_late_events():
    """The disorder is real: with out_of_order_ms 0 instead of the generator's bound,
    q7's first stage finds bids late for their tumbling windows and drops them (so
    the exact results above are not for want of out-of-order events)."""
    topo, _ = query("q7", 1)
    topo.nodes["bids"].watermark["out_of_order_ms"] = 0
    net = SeededNet(topo, 1, batch_size=16)
    net.run(2_000_000)
    assert net.metric("per_auction", "window_late") > 0


@pytest.mark.parametrize("seed", range(3))
def test_q4_average_closing_price_per_category(seed):
    net, args = run("q4", seed)
    closing, averages = ref.q4(args["auctions"], args["bids"], args["average"])
    assert ref.multiset(net.results("prices")) == closing
    assert windows(net.results("results")) == averages
    assert sum(closing.values()) > 100 and len(averages) > 10
    assert net.metric("closing", "window_late") == net.metric("average", "window_late") == 0
    assert net.metric("closing", "interval_late_right") == 0


@pytest.mark.parametrize("name", ref.QUERIES)
def test_expected_and_observed_cover_every_sink_of_every_query(name):
    """What the tcp and sdn tests (tests/runtime/test_nexmark_tcp.py,
    tests/integration/test_nexmark_sdn.py) compare with: every sink of each file."""
    net, args = run(name, 4)
    sinks = {n for n, node in net.topo.nodes.items() if node.operator == "collect"}
    want = ref.expected(name, args)
    assert set(want) == sinks
    for sink, value in want.items():
        assert value and ref.observed(name, sink, net.results(sink)) == value


@pytest.mark.parametrize("name", ["q3", "q4", "q8"])
def test_two_sources_one_far_behind(name):
    """The first source paced 4 times slower than the other: the joins and the intervals
    wait for its watermark (the minimum of their inputs'), so the results stay exact."""
    topo, args = query(name, 2)
    first = next(n for n, node in topo.nodes.items() if node.operator == "nexmark_source")
    topo.nodes[first].args["rate"] /= 4
    net = SeededNet(topo, 2, batch_size=16)
    net.run(4_000_000)
    for sink, value in ref.expected(name, args).items():
        assert ref.observed(name, sink, net.results(sink)) == value
