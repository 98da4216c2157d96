"""Partial rollback as the controller runs it (``controller/recovery/partial_recovery.py``): the
ROLLBACK each worker gets, what the incident says, and the fallback to region
rollback when a sender's buffers do not reach back (reported, or found at replay)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.recovery.partial_recovery import PartialRecoveries
from typhoon.checkpoint.regions import GLOBAL, REGION
from typhoon.checkpoint.store import CheckpointStore
from typhoon.topology import load_topology, schedule
from typhoon.wire import Control

ROOT = Path(__file__).resolve().parents[2]


def ids(physical, node):
    return sorted(w.worker_id for w in physical.workers if w.node == node)


def checkpoint(store, physical, workers, epoch) -> None:
    for w in physical.workers:
        if w.worker_id in workers:
            store.write(epoch, f"{w.node}-{w.index}", b"state")


@pytest.fixture
def wordcount(tmp_path):
    topology = load_topology(ROOT / "topologies" / "wordcount.yaml")
    topology.config.update(guarantee="exactly_once", checkpoint_store=str(tmp_path))
    physical = schedule(topology, ["h1", "h2", "h3"], 0x42, first_port=10)
    store = CheckpointStore.local(str(tmp_path), topology.name)
    machine = PartialRecoveries(topology)
    for w in physical.workers:
        machine.heard(w.worker_id, {"backup_from": 2})
    return topology, physical, store, machine


def sent(plan):
    return {w: (ct.body["generation"], ct.body["epoch"], ct.body.get("replay")) for w, ct in
            plan.controls}  # fmt: skip


def test_a_dead_count_worker_rolls_back_alone_and_the_splits_replay(wordcount):
    topology, physical, store, machine = wordcount
    everyone = {w.worker_id for w in physical.workers}
    checkpoint(store, physical, everyone, 2)
    dead = ids(physical, "count")[1]
    checkpoint(store, physical, everyone - {dead}, 3)  # it died before its part of 3
    plan = machine.plan(physical, {dead}, {dead}, 1, store)  # its replacement has its ID
    assert plan.path == "partial" and plan.epoch == 2 and plan.workers == {dead}
    # the replacement (started restored) gets nothing; each split replays to it
    assert sent(plan) == {s: (1, 2, [dead]) for s in ids(physical, "split")}
    assert all(ct.type == Control.ROLLBACK for _, ct in plan.controls)
    assert plan.physical.generation_of(dead) == (1, 2)
    assert plan.physical.generation_of(ids(physical, "source")[0]) == (0, None)
    record = plan.incident()
    assert record["rollback"] == "partial" and record["region"] == [dead]
    assert record["replayers"] == {str(s): [dead] for s in ids(physical, "split")}
    assert record["restore_epoch"] == 2 and record["fallback"] == ""


def test_a_dead_split_takes_the_counts_and_the_source_replays_without_rolling_back(wordcount):
    topology, physical, store, machine = wordcount
    everyone = {w.worker_id for w in physical.workers}
    checkpoint(store, physical, everyone, 3)
    dead = ids(physical, "split")[0]
    plan = machine.plan(physical, {dead}, set(), 4, store)
    counts = ids(physical, "count")
    assert plan.path == "partial" and plan.workers == {dead, *counts}
    want = {c: (4, 3, None) for c in counts}
    want.update({s: (4, 3, [dead]) for s in ids(physical, "source")})
    want.update({s: (4, 3, counts) for s in ids(physical, "split") if s != dead})
    want[dead] = (4, 3, None)  # a worker that lives on (not restarted) rolls back too
    assert sent(plan) == want
    replacement = machine.plan(physical, {dead}, {dead}, 4, store)
    assert dead not in sent(replacement)  # one restarted restored is not told again


def test_a_sender_whose_buffers_are_short_makes_it_a_region_rollback(wordcount):
    topology, physical, store, machine = wordcount
    everyone = {w.worker_id for w in physical.workers}
    checkpoint(store, physical, everyone, 2)
    short = ids(physical, "split")[0]
    machine.heard(short, {"backup_from": -2})  # it trimmed
    dead = ids(physical, "count")[0]
    plan = machine.plan(physical, {dead}, set(), 1, store)
    assert plan.path == GLOBAL and plan.workers == everyone and plan.replayers == {}
    assert f"[{short}]" in plan.reason and plan.incident()["fallback"] == plan.reason
    assert all("replay" not in ct.body for _, ct in plan.controls)
    assert set(sent(plan)) == everyone


def test_a_refused_replay_falls_back_as_a_newer_generation(wordcount):
    topology, physical, store, machine = wordcount
    everyone = {w.worker_id for w in physical.workers}
    checkpoint(store, physical, everyone, 2)
    dead = ids(physical, "count")[2]
    plan = machine.plan(physical, {dead}, {dead}, 5, store)
    splits = ids(physical, "split")
    assert machine.acked(plan, splits[0], "ROLLBACK", 6, store) is None
    assert machine.acked(plan, 999, "REPLAY_REFUSED", 6, store) is None  # not asked
    step = machine.acked(plan, splits[1], "REPLAY_REFUSED", 6, store)
    assert step is not None and step.path == GLOBAL and step.generation == 6
    assert step.epoch == 2 and set(sent(step)) == everyone  # the replacement restores again
    assert f"worker {splits[1]} refused" in step.reason
    assert machine.coverage[splits[1]] is None and not plan.pending
    assert step.physical.generation_of(dead) == (6, 2)


def test_in_a_job_of_pipelines_only_the_failed_pipeline_is_touched(tmp_path):
    topology = load_topology(ROOT / "topologies" / "pipelines.yaml")
    topology.config.update(guarantee="exactly_once", checkpoint_store=str(tmp_path))
    physical = schedule(topology, ["h1", "h2"], 9, first_port=10)
    store = CheckpointStore.local(str(tmp_path), topology.name)
    machine = PartialRecoveries(topology)
    for w in physical.workers:
        machine.heard(w.worker_id, {"backup_from": -1})
    source = ids(physical, "source_2")[0]
    plan = machine.plan(physical, {source}, {source}, 1, store)
    pipeline = {w for n in ("source_2", "split_2", "count_2") for w in ids(physical, n)}
    assert plan.path == REGION and plan.workers == pipeline and plan.epoch is None
    assert set(sent(plan)) == pipeline - {source}


def test_metrics_that_are_not_a_coverage_are_ignored(wordcount):
    _, physical, _, machine = wordcount
    w = ids(physical, "split")[0]
    for bad in ({}, {"backup_from": "2"}, {"backup_from": True}, {"backup_from": 1.5}):
        machine.heard(w, bad)
    assert machine.coverage[w] == 2


# ----- in the fault detector's machine ------------------------------------------------------


@pytest.fixture
def machine_job(tmp_path):
    from test_fault_detector_machine import machine_for

    topology = load_topology(ROOT / "topologies" / "wordcount.yaml")
    topology.config.update(
        guarantee="exactly_once", checkpoint_store=str(tmp_path), partial_rollback=True
    )
    machine, core, clock, physical = machine_for(topology)
    store = CheckpointStore.local(str(tmp_path), topology.name)
    return machine, core, clock, physical, store


def fail_and_rejoin(machine, core, victim):
    from test_fault_detector_machine import APP

    machine.worker_down(APP, victim, "h1", 99, "deleted", machine.clock())
    core.status(victim, "exited", -9)
    machine.step()
    (incident,) = [i for i in machine.incidents if i.worker == victim]
    core.poll()
    core.status(incident.replacement, "attached")
    for _ in range(8):
        machine.step()
    return incident


def report_coverage(machine, physical, clock, start=1):
    from test_fault_detector_machine import APP

    for w in physical.workers:
        machine.metrics(APP, w.worker_id, {"backup_from": start}, clock.now)


def test_the_machine_rolls_back_a_dead_count_worker_alone(machine_job):
    from test_fault_detector_machine import APP

    machine, core, clock, physical, store = machine_job
    everyone = {w.worker_id for w in physical.workers}
    checkpoint(store, physical, everyone, 2)
    report_coverage(machine, physical, clock)
    victim = ids(physical, "count")[0]
    incident = fail_and_rejoin(machine, core, victim)
    new = incident.replacement
    assert incident.state == "rejoined", incident
    assert incident.rollback == "partial" and incident.region == [new]
    assert incident.restore_epoch == 2 and incident.fallback == ""
    assert incident.replayers == {s: [new] for s in ids(physical, "split")}
    rolled = {w: b for w, t, b in core.sent if t == "ROLLBACK"}
    # only the splits are told: replay to the replacement what went to its predecessor
    want = {"generation": 1, "epoch": 2, "replay": [new], "replay_from": [victim]}
    assert rolled == {s: want for s in ids(physical, "split")}
    assert incident.rolled_back == []  # no live worker went back: the replacement started so
    assert core.stored.generation_of(new) == (1, 2)
    assert all(core.stored.generation_of(w) == (0, None) for w in everyone - {victim})
    assert incident.to_dict()["rollback"] == "partial"
    # the splits say what they resent for that generation: the incident records it
    split = ids(physical, "split")[0]
    machine.metrics(APP, split, {"backup_from": 2, "backup_replayed_tuples": {"1": 77}}, 0.0)
    machine.metrics(APP, ids(physical, "source")[0],
                    {"backup_from": 2, "backup_replayed_tuples": {"1": 5}}, 0.0)  # fmt: skip
    assert incident.replayed == {split: 77}


def test_the_machine_falls_back_when_a_split_refuses_to_replay(machine_job):
    machine, core, clock, physical, store = machine_job
    everyone = {w.worker_id for w in physical.workers}
    checkpoint(store, physical, everyone, 2)
    report_coverage(machine, physical, clock)
    refusing = ids(physical, "split")[1]
    send = core.send_control

    def send_control(app, worker_ids, ct):  # its buffers were trimmed since it reported
        n = send(app, worker_ids, ct)
        if refusing in worker_ids and "replay" in ct.body:
            gen = ct.body["generation"]
            core.acks[("ROLLBACK", gen)].discard(refusing)
            core.acks.setdefault(("REPLAY_REFUSED", gen), set()).add(refusing)
        return n

    core.send_control = send_control
    victim = ids(physical, "count")[2]
    incident = fail_and_rejoin(machine, core, victim)
    assert incident.rollback == "global" and incident.generation == 2
    assert f"worker {refusing} refused" in incident.fallback
    second = {w: b for w, t, b in core.sent if t == "ROLLBACK" and b["generation"] == 2}
    live = everyone - {victim} | {incident.replacement}
    assert set(second) == live
    assert core.stored.generation_of(incident.replacement) == (2, 2)


def test_without_coverage_reports_the_machine_takes_the_region_path(machine_job):
    machine, core, clock, physical, store = machine_job
    everyone = {w.worker_id for w in physical.workers}
    checkpoint(store, physical, everyone, 2)
    incident = fail_and_rejoin(machine, core, ids(physical, "count")[0])
    assert incident.rollback == "global" and "do not reach back" in incident.fallback


def test_a_split_and_a_count_dead_at_once_are_one_rollback_set_the_source_replays(machine_job):
    """Two consecutive stages dead at once: the count worker's recovery is planned with
    the split's (not yet replaced) failure, so the dead split is a member, never a
    replayer; together the incidents roll back the split's closure, only the source and
    the other split replay, and the older generation's ROLLBACKs, covered by the newer
    one, are not sent."""
    from test_fault_detector_machine import APP

    machine, core, clock, physical, store = machine_job
    everyone = {w.worker_id for w in physical.workers}
    checkpoint(store, physical, everyone, 2)
    report_coverage(machine, physical, clock)
    split, count = ids(physical, "split")[0], ids(physical, "count")[0]
    (other,) = set(ids(physical, "split")) - {split}
    (source,) = ids(physical, "source")
    machine.worker_down(APP, split, "h1", 98, "deleted", machine.clock())
    machine.worker_down(APP, count, "h1", 99, "deleted", machine.clock())
    core.status(count, "exited", -9)  # the count's exit status comes first: planned first
    machine.step()
    core.status(split, "exited", -9)
    machine.step()
    first, second = (next(i for i in machine.incidents if i.worker == w) for w in (count, split))
    core.poll()
    for i in (first, second):
        core.status(i.replacement, "attached")
    for _ in range(12):
        machine.step()
    new = {first.replacement, second.replacement}
    counts = set(ids(physical, "count")) - {count}
    assert first.state == second.state == "rejoined", (first, second)
    assert first.rollback == second.rollback == "partial"
    assert first.generation == 1 and second.generation == 2
    assert set(first.region) | set(second.region) == new | counts | {split}
    assert set(second.region) == new | counts
    told = set(first.replayers) | set(second.replayers)
    assert told == {source, other}, (first.replayers, second.replayers)
    rolled = [(w, b) for w, t, b in core.sent if t == "ROLLBACK"]
    assert all(b["generation"] == 2 for _, b in rolled), rolled  # generation 1 covered
    assert all("replay" in b for w, b in rolled if w in (source, other)), rolled
    assert {w for w, b in rolled if "replay" not in b} == (new | counts) - {second.replacement}
    assert split not in {m for _, b in rolled for m in b.get("replay", [])}
    assert {w: b["replay"] for w, b in rolled if w == source} == {source: [second.replacement]}
