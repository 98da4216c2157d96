"""The rollback set of partial rollback (``typhoon/checkpoint/partial.py``): the failed
workers and their downstream closure, their senders outside it replay, and the
fallbacks to region rollback."""

from __future__ import annotations

from pathlib import Path

import pytest

from typhoon.checkpoint.output_buffers import START
from typhoon.checkpoint.partial import (
    PARTIAL,
    boundary,
    covered,
    downstream_closure,
    partial_rollback,
)
from typhoon.checkpoint.regions import GLOBAL, REGION
from typhoon.topology import load_topology, schedule

ROOT = Path(__file__).resolve().parents[2]

# SAND's Fig. 5: U_e = {c}, D_e = {g, h}; U_{c,e} = {a, c}, D_{c,e} = {e, f, g, h}
FIG5 = [("a", "c"), ("b", "d"), ("c", "e"), ("c", "f"), ("d", "g"), ("e", "g"), ("e", "h"),
        ("f", "h")]  # fmt: skip


def test_the_papers_example():
    members = downstream_closure(FIG5, {"d", "e"})
    assert members == {"d", "e", "g", "h"}
    assert set(boundary(FIG5, members)) == {"b", "c", "f"}
    assert boundary(FIG5, members)["c"] == ("e",)
    assert downstream_closure(FIG5, {"c"}) == {"c", "e", "f", "g", "h"}
    assert downstream_closure(FIG5, {"h"}) == {"h"}
    assert downstream_closure(FIG5, {"z"}) == {"z"}  # not in the graph: itself


@pytest.mark.parametrize(
    ("start", "epoch", "ok"),
    [(START, None, True), (START, 7, True), (5, 7, True), (7, 7, True), (8, 7, False),
     (5, None, False), (None, 7, False)],
)  # fmt: skip
def test_covered(start, epoch, ok):
    coverage = {} if start is None else {1: start}
    assert covered(coverage, 1, epoch) is ok


def ids(physical, node):
    return {w.worker_id for w in physical.workers if w.node == node}


@pytest.fixture
def wordcount():
    topology = load_topology(ROOT / "topologies" / "wordcount.yaml")
    topology.config.update(guarantee="exactly_once")
    return topology, schedule(topology, ["h1", "h2", "h3"], 7, first_port=10)


def everyone(physical, start=START):
    return {w.worker_id: start for w in physical.workers}


def test_a_count_worker_rolls_back_alone_and_every_split_replays_to_it(wordcount):
    topology, physical = wordcount
    dead = min(ids(physical, "count"))
    plan = partial_rollback(topology, physical, [dead], 3, everyone(physical, 2))
    assert plan.path == PARTIAL and plan.workers == {dead} and not plan.reason
    assert plan.replayers == {s: (dead,) for s in sorted(ids(physical, "split"))}


def test_a_split_worker_takes_every_count_worker_the_source_replays(wordcount):
    topology, physical = wordcount
    dead = min(ids(physical, "split"))
    plan = partial_rollback(topology, physical, [dead], None, everyone(physical))
    assert plan.path == PARTIAL
    assert plan.workers == {dead} | ids(physical, "count")
    others = ids(physical, "split") - {dead}
    want = {**{s: (dead,) for s in ids(physical, "source")},
            **{s: tuple(sorted(ids(physical, "count"))) for s in others}}  # fmt: skip
    assert plan.replayers == want


def test_a_source_in_the_set_falls_back_to_the_region(wordcount):
    topology, physical = wordcount
    dead = min(ids(physical, "source"))
    plan = partial_rollback(topology, physical, [dead], 3, everyone(physical))
    assert plan.path == GLOBAL and plan.replayers == {}
    assert "seek back" in plan.reason and len(plan.workers) == len(physical.workers)


@pytest.mark.parametrize("coverage", [{}, "short", "none"])
def test_buffers_that_do_not_reach_back_fall_back_and_say_so(wordcount, coverage):
    topology, physical = wordcount
    dead = min(ids(physical, "count"))
    splits = ids(physical, "split")
    cov = everyone(physical, 2)
    if coverage == {}:
        cov = {}
    elif coverage == "short":
        cov[min(splits)] = 4  # it purged past epoch 3
    else:
        cov[min(splits)] = None  # it trimmed, or sent through a load-balancer address
    plan = partial_rollback(topology, physical, [dead], 3, cov)
    assert plan.path == GLOBAL and "do not reach back to epoch 3" in plan.reason


def test_in_a_job_of_pipelines_the_fallback_is_the_region_only():
    topology = load_topology(ROOT / "topologies" / "pipelines.yaml")
    topology.config.update(guarantee="exactly_once")
    physical = schedule(topology, ["h1", "h2"], 9, first_port=10)
    counts = sorted(w.worker_id for w in physical.workers if w.node == "count_1")
    plan = partial_rollback(topology, physical, [counts[0]], 2, everyone(physical))
    assert plan.path == PARTIAL and plan.workers == {counts[0]}
    assert {physical.by_id(s).node for s in plan.replayers} == {"split_1"}
    source = min(w.worker_id for w in physical.workers if w.node == "source_1")
    plan = partial_rollback(topology, physical, [source], 2, everyone(physical))
    assert plan.path == REGION
    assert {physical.by_id(w).node for w in plan.workers} == {"source_1", "split_1", "count_1"}


def test_unknown_failed_workers_are_ignored(wordcount):
    topology, physical = wordcount
    plan = partial_rollback(topology, physical, [60000], 3, everyone(physical))
    assert plan.workers == frozenset() and plan.replayers == {} and "no failed" in plan.reason
