"""The locality router's pure parts: chain, plan, reroutes, crossing, and a run's steps."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controller.locality.job import FRESH_WAIT_S, LocalityJob, RouterSettings
from controller.locality.router import (
    LocalityError,
    compute_plan,
    crossing,
    find_chain,
    merged_pairs,
    minus,
    reroutes,
    routed_index,
    sent_links,
)
from controller.rules.view import AppView
from typhoon.operators.pairs import pair_tuple
from typhoon.reconfig import Reroute
from typhoon.runtime.policies import stable_hash
from typhoon.topology import load_topology, load_topology_text, schedule
from typhoon.topology.keygroups import DEFAULT_MAX_PARALLELISM, default_table
from typhoon.topology.model import Grouping

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["h1", "h2", "h3"]


def app():
    topo = load_topology(ROOT / "topologies" / "locality.yaml")
    return topo, schedule(topo, HOSTS, 7)


def sampled_pairs(n: int = 6000) -> Counter:
    return Counter(tuple(pair_tuple(1, s, 200, 200, 0.8, "")[:2]) for s in range(n))


def test_chain_of_the_locality_topology():
    topo, _ = app()
    chain = find_chain(topo)
    assert (chain.node, chain.stream_in.id, chain.stream_out.id) == ("a", 1, 2)
    assert chain.stream_in.grouping.fields == ("a",) and chain.stream_out.grouping.fields == ("b",)


def test_no_chain_without_locality_config():
    text = (ROOT / "topologies" / "locality.yaml").read_text()
    text = text.replace("  locality: {pairs: 1000, sample: 10}\n", "")
    with pytest.raises(LocalityError, match="has no config 'locality'"):
        find_chain(load_topology_text(text, "t"))


def test_routed_index_is_the_table_then_the_key_groups_owner():
    g = Grouping("direct", ("a",), {"a1": 2})
    owners = default_table(DEFAULT_MAX_PARALLELISM, 3)
    assert routed_index(g, "a1", 3) == 2
    assert routed_index(g, "a2", 3) == owners[stable_hash(["a2"]) % DEFAULT_MAX_PARALLELISM]
    fields = Grouping("fields", ("a",))
    assert routed_index(fields, "a1", 3) == owners[stable_hash(["a1"]) % DEFAULT_MAX_PARALLELISM]
    moved = [2] * DEFAULT_MAX_PARALLELISM  # a table from a rescale: every group on index 2
    assert routed_index(fields, "a1", 3, moved) == 2


def test_merged_pairs_sums_the_workers():
    ms = [{"pairs": {"a1": {"b1": 3, "b2": 1}}}, {"pairs": {"a1": {"b1": 2}}}, {"node": "x"}]
    assert merged_pairs(ms) == {("a1", "b1"): 5, ("a1", "b2"): 1}


def test_plan_keeps_most_correlated_pairs_on_one_host_and_reroutes_both_streams():
    topo, phys = app()
    chain = find_chain(topo)
    pairs = sampled_pairs()
    plan = compute_plan(topo, phys, chain, pairs, 1.03)
    # three hosts: hashing keeps about a third local; the partition most of the 80%
    assert plan.hash_local_fraction < 0.45
    assert plan.local_fraction > 0.75
    a, b = reroutes(chain, plan)
    assert a == Reroute(1, "direct", ("a",), tuple(sorted(plan.table_a.items())))
    assert b.stream == 2 and b.policy == "direct" and b.fields == ("b",)
    assert set(plan.table_a.values()) == {0, 1, 2}  # indexes, as the route request takes
    # once installed, the same plan changes nothing
    chain.stream_in.grouping = Grouping("direct", ("a",), dict(plan.table_a))
    assert [r.stream for r in reroutes(chain, plan)] == [2]


def test_crossing_counts_tuples_between_hosts_since_a_baseline():
    _, phys = app()
    a = {w.index: w.worker_id for w in phys.of_node("a")}
    b = {w.index: w.worker_id for w in phys.of_node("b")}
    metrics = {
        a[0]: {"sent_to": {f"{b[0]}:2": 10, f"{b[1]}:2": 30, "99:7": 5}},
        a[1]: {"sent_to": {f"{b[1]}:2": 20}},
    }
    links = sent_links(metrics, 2)
    assert links == {(a[0], b[0]): 10, (a[0], b[1]): 30, (a[1], b[1]): 20}
    c = crossing(links, phys)
    assert (c.crossed, c.total) == (30, 60)  # spread: a[i] and b[i] share host i
    later = {**links, (a[0], b[1]): 31, (a[1], b[1]): 60}
    assert crossing(minus(later, links), phys).to_dict() == {
        "tuples": 41,
        "crossed": 1,
        "fraction": round(1 / 41, 4),
    }


# ----- a run's steps against a fake core ---------------------------------------------------


@dataclass
class Record:
    id: int
    state: str = "running"
    error: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass
class Registry:
    latest: dict[str, Record] = field(default_factory=dict)

    def get(self, app: str):
        return self.latest.get(app)


class FakeCore:
    def __init__(self, pairs: Counter) -> None:
        topo, phys = app()
        self.view = type("View", (), {"apps": {"locality": AppView(topo, phys)}})()
        self.phys = phys
        self.reconfigs = Registry()
        self.requested: list[list[int]] = []
        self.requests: list[Reroute] = []
        self.ids = itertools.count(1)
        self.clock = 0.0
        self.pairs = pairs
        self.sent = 0
        self.metrics: dict[str, dict[int, dict]] = {"locality": {}}

    def worker_metrics(self, app: str) -> dict[int, dict]:
        return self.metrics.get(app, {})

    def reconfiguration(self, app: str):
        return self.reconfigs.get(app)

    def answer(self) -> None:
        """Every worker of `a` answers the last METRIC_REQ; each answer has a new time."""
        self.clock += 1
        self.sent += 100
        b = [w.worker_id for w in self.phys.of_node("b")]
        for i, w in enumerate(self.phys.of_node("a")):
            mine = {a: {bb: n} for (a, bb), n in self.pairs.items() if int(a[1:]) % 3 == i}
            self.metrics["locality"][w.worker_id] = {
                "time": self.clock,
                "pairs": mine,
                "sent_to": {f"{d}:2": self.sent for d in b},
            }

    def request_metrics(self, app: str, worker_ids=None) -> int:
        self.requested.append(list(worker_ids))
        return len(worker_ids)

    def reconfigure(self, app: str, request):
        self.requests.append(request)
        rec = self.reconfigs.latest[app] = Record(next(self.ids))
        return rec


def test_a_run_collects_plans_reroutes_both_streams_one_after_the_other_and_measures():
    core = FakeCore(sampled_pairs())
    job = LocalityJob("locality", False, RouterSettings(min_pairs=100), 0.0)
    job.begin(core, 0.0)
    a_ids = [w.worker_id for w in core.phys.of_node("a")]
    assert core.requested == [a_ids] and job.phase == "collecting"
    job.step(core, 0.1)
    assert job.phase == "collecting"  # no fresh answer yet
    core.answer()
    job.step(core, 0.2)
    assert job.phase == "routing" and [r.stream for r in core.requests] == [1]
    job.step(core, 0.3)
    assert len(core.requests) == 1  # the first reroute still runs
    core.reconfigs.latest["locality"].state = "done"
    job.step(core, 0.4)
    assert [r.stream for r in core.requests] == [1, 2]
    core.reconfigs.latest["locality"].state = "done"
    job.step(core, 0.5)
    assert job.phase == "measuring" and len(core.requested) == 2
    core.answer()
    job.step(core, 0.6)
    assert job.phase == "done", job.reason
    core.answer()  # 100 more tuples per link after the switch
    report = job.report(core)
    assert report["reconfigurations"] == [1, 2]
    assert report["plan"]["predicted_local"] > report["plan"]["current_local"]
    # each a worker sent the same to each b worker: 2 of 3 links cross hosts
    assert report["crossing"]["before"]["fraction"] == round(2 / 3, 4)
    assert report["crossing"]["after"] == {"tuples": 900, "crossed": 600, "fraction": 0.6667}


def test_a_failed_reroute_ends_the_run():
    core = FakeCore(sampled_pairs())
    job = LocalityJob("locality", False, RouterSettings(min_pairs=100), 0.0)
    job.begin(core, 0.0)
    core.answer()
    job.step(core, 0.1)
    rec = core.reconfigs.latest["locality"]
    rec.state, rec.error = "rolled_back", "a worker did not ack"
    job.step(core, 0.2)
    assert (job.phase, job.reason) == (
        "failed",
        "reconfiguration 1 rolled_back: a worker did not ack",
    )
    assert len(core.requests) == 1


def test_too_few_pairs_and_a_small_gain_skip():
    core = FakeCore(sampled_pairs(50))
    job = LocalityJob("locality", False, RouterSettings(min_pairs=1000), 0.0)
    job.begin(core, 0.0)
    core.answer()
    job.step(core, 0.1)
    assert job.phase == "skipped" and "fewer than min_pairs 1000" in job.reason
    core = FakeCore(sampled_pairs())
    job = LocalityJob("locality", True, RouterSettings(min_pairs=100, min_gain=0.99), 0.0)
    job.begin(core, 0.0)
    core.answer()
    job.step(core, 0.1)
    assert job.phase == "skipped" and "less than min_gain 0.99" in job.reason
    assert core.requests == []


def test_workers_that_never_answer_are_asked_again_then_named_when_the_run_fails():
    core = FakeCore(sampled_pairs())
    job = LocalityJob("locality", False, RouterSettings(), 0.0)
    job.begin(core, 0.0)
    a_ids = [w.worker_id for w in core.phys.of_node("a")]
    for t in (0.5, 1.0, 1.5, 2.0):
        job.step(core, t)
    # a lost METRIC_REQ or answer is repaired: asked again once a second, no more
    assert core.requested == [a_ids, a_ids, a_ids] and job.phase == "collecting"
    job.step(core, FRESH_WAIT_S)
    assert job.phase == "failed"
    assert job.reason == (
        f"worker(s) {', '.join(map(str, a_ids))} of 'a' did not answer any of "
        f"{len(core.requested)} METRIC_REQs in {FRESH_WAIT_S:g} s"
    )


def test_only_the_workers_still_silent_are_asked_again():
    core = FakeCore(sampled_pairs())
    job = LocalityJob("locality", False, RouterSettings(min_pairs=100), 0.0)
    job.begin(core, 0.0)
    core.answer()
    first = min(core.metrics["locality"])
    core.metrics["locality"][first]["time"] = None  # its answer predates the request
    job.asked[first] = None
    job.step(core, 1.0)
    assert core.requested[-1] == [first] and job.phase == "collecting"
    core.metrics["locality"][first]["time"] = 99.0
    job.step(core, 1.1)
    assert job.phase == "routing"


def test_benchmark_workload_installs_the_planned_tables_on_the_spread_placement():
    from benchmarks.scenarios.locality import Point, workload

    hashed = workload(Point(3, 100, "hash"), 1000, 0.0)
    assert [s.grouping.type for s in hashed.streams] == ["fields", "fields"]
    t = workload(Point(3, 100, "locality"), 1000, 0.0)
    a, b = (s.grouping for s in t.streams)
    assert (a.type, b.type) == ("direct", "direct") and len(a.table) == len(b.table) == 100
    phys = schedule(t, HOSTS, 7)
    host = {(w.node, w.index): w.host for w in phys.workers}
    pairs = Counter(tuple(pair_tuple(1, s, 100, 100, 0.8, "")[:2]) for s in range(3000))
    local = sum(n for (ka, kb), n in pairs.items() if host[("a", a.table[ka])] ==
                host[("b", b.table[kb])])  # fmt: skip
    assert local / sum(pairs.values()) > 0.75


def test_periodic_runs_only_when_on_counting_idle_and_the_interval_passed():
    from controller.locality.job import periodic_due

    on = RouterSettings(interval_s=30.0)
    assert not periodic_due(RouterSettings(), None, True, True, False, 100.0)  # off by default
    assert periodic_due(on, None, True, True, False, 100.0)
    assert not periodic_due(on, None, False, True, False, 100.0)  # no config locality
    assert not periodic_due(on, None, True, False, False, 100.0)  # not active yet
    assert not periodic_due(on, None, True, True, True, 100.0)  # an update runs
    last = LocalityJob("locality", True, on, 0.0, phase="skipped", finished=80.0)
    assert not periodic_due(on, last, True, True, False, 100.0)
    assert periodic_due(on, last, True, True, False, 110.0)
    last.phase = "routing"
    assert not periodic_due(on, last, True, True, False, 500.0)


def test_the_app_leaves_ryus_own_methods_alone():
    from apps.locality_router import LocalityRouter
    from controller.framework.ryu_compat import RyuApp

    for name in ("start", "stop", "close", "send_event", "register_handler"):
        assert getattr(LocalityRouter, name) is getattr(RyuApp, name), name
