"""Region failover in the fault detector's machine (``controller/recovery/region_recovery.py``):
a job of three independent pipelines under ``exactly_once``; a failure rolls back
only its pipeline, from that pipeline's newest checkpoint, and the other workers
are never sent anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fault_detector_machine import APP, machine_for

from typhoon.checkpoint.store import CheckpointStore
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def job(tmp_path):
    topology = load_topology(ROOT / "topologies" / "pipelines.yaml")
    topology.config.update(checkpoint_store=str(tmp_path))
    machine, core, clock, physical = machine_for(topology)
    store = CheckpointStore.local(str(tmp_path), topology.name)
    return machine, core, clock, physical, store


def pipeline(physical, i: int) -> set[int]:
    nodes = (f"source_{i}", f"split_{i}", f"count_{i}")
    return {w.worker_id for w in physical.workers if w.node in nodes}


def checkpoint(store, physical, workers, epoch) -> None:
    for w in physical.workers:
        if w.worker_id in workers:
            store.write(epoch, f"{w.node}-{w.index}", b"state")


def kill(machine, core, wid) -> None:
    machine.worker_down(APP, wid, "h1", 99, "deleted", machine.clock())
    core.status(wid, "exited", -9)
    machine.step()


def rejoin(machine, core, *replacements) -> None:
    core.poll()
    for r in replacements:
        core.status(r, "attached")
    for _ in range(6):
        machine.step()


def test_a_failure_rolls_back_only_its_pipeline_from_its_newest_checkpoint(job):
    machine, core, clock, physical, store = job
    one, two, three = (pipeline(physical, i) for i in (1, 2, 3))
    checkpoint(store, physical, one | two | three, 2)
    checkpoint(store, physical, one, 3)  # pipeline 1 is a checkpoint ahead
    victim = physical.active_of_node("count_1")[0].worker_id
    kill(machine, core, victim)
    (incident,) = machine.incidents
    new = incident.replacement
    assert incident.rollback == "region" and incident.restore_epoch == 3
    assert set(incident.region) == one - {victim} | {new}
    written = core.stored
    assert written.generation_of(new) == (1, 3)
    assert all(written.generation_of(w) == (0, None) for w in two | three)
    rejoin(machine, core, new)
    assert incident.state == "rejoined", incident
    told = {w for w, t, _ in core.sent if t in ("ROLLBACK", "UPSTREAM", "ROUTING")}
    assert told <= one | {new}  # the other pipelines heard nothing
    rolled = {w: b for w, t, b in core.sent if t == "ROLLBACK"}
    assert set(rolled) == one - {victim} == set(incident.rolled_back)
    assert all(b == {"generation": 1, "epoch": 3} for b in rolled.values())
    # the sources' replay count comes with their METRIC_RESP
    source = physical.active_of_node("source_1")[0].worker_id
    machine.metrics(APP, source, {"replayed": {"1": 840}}, clock.now)
    machine.metrics(APP, min(two), {"replayed": {"1": 5}}, clock.now)  # not rolled back
    assert incident.replayed == {source: 840}
    assert incident.to_dict()["rollback"] == "region"


def test_failures_in_two_pipelines_at_once_roll_each_back_to_its_own_checkpoint(job):
    machine, core, clock, physical, store = job
    one, two, three = (pipeline(physical, i) for i in (1, 2, 3))
    checkpoint(store, physical, one | two | three, 2)
    checkpoint(store, physical, two, 4)
    a = physical.active_of_node("split_1")[1].worker_id
    b = physical.active_of_node("count_2")[0].worker_id
    kill(machine, core, a)
    kill(machine, core, b)
    first, second = machine.incidents
    assert (first.generation, first.restore_epoch) == (1, 2)
    assert (second.generation, second.restore_epoch) == (2, 4)
    rejoin(machine, core, first.replacement, second.replacement)
    assert first.state == second.state == "rejoined", (first, second)
    rolled = {w: b for w, t, b in core.sent if t == "ROLLBACK"}
    assert set(rolled) == (one - {a}) | (two - {b})
    assert all(rolled[w] == {"generation": 1, "epoch": 2} for w in one - {a})
    assert all(rolled[w] == {"generation": 2, "epoch": 4} for w in two - {b})
    assert not {w for w, _, _ in core.sent} & three
    p = core.stored
    assert p.generation_of(first.replacement) == (1, 2)
    assert p.generation_of(second.replacement) == (2, 4)
    assert all(p.generation_of(w) == (0, None) for w in three)


def test_two_failures_in_one_pipeline_roll_it_back_once_to_the_newer_generation(job):
    machine, core, clock, physical, store = job
    one = pipeline(physical, 1)
    checkpoint(store, physical, one, 2)
    a = physical.active_of_node("split_1")[0].worker_id
    b = physical.active_of_node("count_1")[1].worker_id
    kill(machine, core, a)
    kill(machine, core, b)
    first, second = machine.incidents
    rejoin(machine, core, first.replacement, second.replacement)
    assert first.state == second.state == "rejoined", (first, second)
    rolled = [(w, b) for w, t, b in core.sent if t == "ROLLBACK"]
    targets = [w for w, _ in rolled]
    assert len(targets) == len(set(targets))  # once each
    assert {b["generation"] for _, b in rolled} == {2}
    assert set(targets) == (one - {a, b}) | {first.replacement}


def test_a_connected_job_still_rolls_back_globally(tmp_path):
    topology = load_topology(ROOT / "topologies" / "wordcount.yaml")
    topology.config.update(guarantee="exactly_once", checkpoint_store=str(tmp_path))
    machine, core, clock, physical = machine_for(topology)
    victim = physical.active_of_node("count")[0].worker_id
    kill(machine, core, victim)
    (incident,) = machine.incidents
    rejoin(machine, core, incident.replacement)
    assert incident.rollback == "global" and incident.state == "rejoined"
    everyone = {w.worker_id for w in physical.workers} - {victim}
    assert set(incident.rolled_back) == everyone and core.stored.worker_generations == {}
