"""Failover regions (``typhoon/checkpoint/regions.py``) and what the per-region
generations change in the physical topology and the core's job progress."""

from __future__ import annotations

from pathlib import Path

import pytest

from typhoon.checkpoint.progress import JobProgress, recovery_point
from typhoon.checkpoint.regions import (
    GLOBAL,
    REGION,
    failover_regions,
    roll_back,
    rollback_set,
    worker_edges,
)
from typhoon.checkpoint.store import CheckpointStore
from typhoon.topology import load_topology, schedule
from typhoon.topology.loader import load_topology_text
from typhoon.topology.model import PhysicalTopology

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["h1", "h2", "h3"]


def ids(physical: PhysicalTopology, *nodes: str) -> set[int]:
    return {w.worker_id for n in nodes for w in physical.active_of_node(n)}


@pytest.fixture
def pipelines():
    t = load_topology(ROOT / "topologies" / "pipelines.yaml")
    return t, schedule(t, HOSTS, 0x42, first_port=10)


def chain(i: int) -> tuple[str, str, str]:
    return (f"source_{i}", f"split_{i}", f"count_{i}")


def test_independent_pipelines_are_one_region_each(pipelines):
    t, p = pipelines
    regions = failover_regions(t, p)
    assert regions == sorted((frozenset(ids(p, *chain(i))) for i in (1, 2, 3)), key=min)
    count = p.active_of_node("count_1")[0].worker_id
    r = rollback_set(t, p, [count])
    assert r.path == REGION and r.regions == 3 and r.workers == ids(p, *chain(1))


def test_a_connected_job_is_one_region_and_its_rollback_is_global():
    t = load_topology(ROOT / "topologies" / "wordcount.yaml")
    p = schedule(t, HOSTS, 0x42, first_port=10)
    (region,) = failover_regions(t, p)
    assert region == {w.worker_id for w in p.workers}
    r = rollback_set(t, p, [p.active_of_node("split")[1].worker_id])
    assert r.path == GLOBAL and r.workers == region and r.regions == 1
    # shuffle and fields couple every worker of the two nodes
    splits, counts = ids(p, "split"), ids(p, "count")
    assert {(a, b) for a in splits for b in counts} <= worker_edges(t, p)


def test_failover_global_makes_independent_pipelines_one_region(pipelines):
    t, p = pipelines
    t.config["failover"] = "global"
    (region,) = failover_regions(t, p)
    assert region == {w.worker_id for w in p.workers}
    r = rollback_set(t, p, [p.active_of_node("count_2")[0].worker_id])
    assert r.path == GLOBAL and r.workers == region
    text = (ROOT / "topologies" / "pipelines.yaml").read_text()
    assert load_topology_text(text.replace("  guarantee:", "  failover: global\n  guarantee:"))
    with pytest.raises(Exception, match="failover"):
        load_topology_text(text.replace("  guarantee:", "  failover: full\n  guarantee:"))


def test_failed_workers_of_two_regions_roll_both_back_and_ids_not_in_the_job_are_ignored(
    pipelines,
):
    t, p = pipelines
    a, b = p.active_of_node("split_1")[0], p.active_of_node("count_3")[1]
    r = rollback_set(t, p, [a.worker_id, b.worker_id, 999])
    assert r.path == REGION and r.workers == ids(p, *chain(1), *chain(3))
    assert rollback_set(t, p, [999]).workers == frozenset()


def test_a_global_grouping_couples_every_receiver_too():
    """``global`` sends its data to one receiver, but anchors and marks to every one:
    a receiver that gets no data still aligns on the senders' anchors."""
    t = load_topology_text(
        """
name: g
spouts: [{id: s, operator: sequence_source, parallelism: 2}]
bolts: [{id: k, operator: sequence_check, parallelism: 3}]
streams: [{from: s, to: k, grouping: global}]
"""
    )
    p = schedule(t, HOSTS, 0x42, first_port=10)
    assert failover_regions(t, p) == [frozenset(w.worker_id for w in p.workers)]


def test_roll_back_records_each_regions_generation_and_a_global_one_clears_them(pipelines):
    t, p = pipelines
    one, two = ids(p, *chain(1)), ids(p, *chain(2))
    q = roll_back(p, one, 1, 7)
    assert (q.generation, q.restore_epoch) == (1, 7)
    assert all(q.generation_of(w) == (1, 7) for w in one)
    assert all(q.generation_of(w) == (0, None) for w in two)
    r = roll_back(q, two, 2, 5)  # another region later: the first keeps its generation
    assert all(r.generation_of(w) == (1, 7) for w in one)
    assert all(r.generation_of(w) == (2, 5) for w in two)
    assert all(r.generation_of(w) == (0, None) for w in ids(p, *chain(3)))
    back = PhysicalTopology.from_dict(r.to_dict())  # through the coordinator (JSON)
    assert back.worker_generations == r.worker_generations and back == r
    everyone = {w.worker_id for w in p.workers}
    g = roll_back(r, everyone, 3, 9)
    assert g.worker_generations == {} and all(g.generation_of(w) == (3, 9) for w in everyone)


def test_the_core_compares_each_worker_with_its_own_regions_generation(pipelines):
    """A worker of an untouched region in generation 0 is not behind after another
    region recovered (the core would roll it back), and the job completes when each
    worker finished in its own region's generation."""
    t, p = pipelines
    one = ids(p, *chain(1))
    q = roll_back(p, one, 1, 4)
    progress = JobProgress()
    other = min(ids(p, *chain(2)))
    mine = min(one)
    assert progress.behind(other, {"generation": 0}, q, 100.0) is None
    assert progress.behind(other, {"generation": 0}, q, 200.0) is None
    assert progress.behind(mine, {"generation": 0}, q, 100.0) is None  # grace
    assert progress.behind(mine, {"generation": 0}, q, 103.0) == {"generation": 1, "epoch": 4}
    for w in q.workers:
        progress.heard(w.worker_id, {"done": True, "generation": 1 if w.worker_id in one else 0})
    assert progress.complete(q)
    progress.heard(mine, {"done": True, "generation": 0})  # one of region 1 in the old one
    assert not progress.complete(q)


def test_a_regions_recovery_point_is_the_newest_epoch_its_own_workers_completed(
    pipelines, tmp_path
):
    t, p = pipelines
    store = CheckpointStore.local(str(tmp_path), "pipelines")
    one, two = ids(p, *chain(1)), ids(p, *chain(2))
    part = {w.worker_id: f"{w.node}-{w.index}" for w in p.workers}
    for w in p.workers:
        store.write(3, part[w.worker_id], b"x")
    for w in one:  # region 1 went on to epoch 5 (in generation 1's numbering)
        store.write(1_000_005, part[w], b"y")
    for w in sorted(two)[:-1]:  # region 2's epoch 4 lacks a part
        store.write(4, part[w], b"z")
    assert recovery_point(p, store, one) == 1_000_005
    assert recovery_point(p, store, two) == 3
    assert recovery_point(p, store) == 3  # the whole job: its newest common epoch
