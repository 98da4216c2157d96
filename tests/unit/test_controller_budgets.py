"""FLOW_CONTROL budgets the core sends (controller/budgets.py), from a view alone."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from fakeflows import line_cluster

from controller.budgets import budget_updates
from controller.rules.view import AppView, ClusterView
from typhoon.coordinator import WorkerStatus
from typhoon.topology import load_topology, schedule

ROOT = Path(__file__).resolve().parents[2]
LOG = logging.getLogger("test")


def view_of(config: dict | None = None, starting: int | None = None) -> ClusterView:
    topology = load_topology(ROOT / "topologies" / "wordcount.yaml")
    if config is not None:
        topology = dataclasses.replace(topology, config={**topology.config, **config})
    physical = schedule(topology, ["h1", "h2", "h3"], 0x42, first_port=10)
    statuses = {
        w.worker_id: WorkerStatus(
            w.worker_id, w.host, "starting" if w.worker_id == starting else "running"
        )
        for w in physical.workers
    }
    return ClusterView(line_cluster(3), {"wc": AppView(topology, physical, statuses)})


def test_each_attached_worker_is_told_once_until_its_share_changes():
    view = view_of()
    told: dict[tuple[str, int], int] = {}
    updates = budget_updates(view, told, LOG)
    workers = {w.worker_id for w in view.apps["wc"].physical.workers}
    assert {wid for _, wid, _ in updates} == workers
    assert all(budget > 0 for _, _, budget in updates)
    told.update({(a, w): b for a, w, b in updates})
    assert budget_updates(view, told, LOG) == []
    wid = next(iter(workers))
    told[("wc", wid)] += 1  # it was told something else
    assert [(a, w) for a, w, _ in budget_updates(view, told, LOG)] == [("wc", wid)]


def test_workers_not_attached_and_apps_with_their_own_budget_are_left_alone():
    physical = view_of().apps["wc"].physical
    first = physical.workers[0].worker_id
    updates = budget_updates(view_of(starting=first), {}, LOG)
    assert first not in {w for _, w, _ in updates}
    assert budget_updates(view_of({"sdn": {"port_budget": 65536}}), {}, LOG) == []
    assert budget_updates(view_of({"flow_control": False}), {}, LOG) == []


def test_applications_that_are_gone_are_forgotten():
    told = {("gone", 3): 100}
    budget_updates(view_of(), told, LOG)
    assert ("gone", 3) not in told
