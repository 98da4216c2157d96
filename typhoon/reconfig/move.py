"""Moving one running worker to another host (``typhoon move``; paper §8, pause and resume).

A move is a stable update like the others (``typhoon.reconfig.plan``), not a
path of its own: the worker's (node, index) gets a new worker on the chosen
host (a new worker ID and port, placed by the scheduler's ``reschedule``),
the senders switch to it by ROUTING with handoff, and the old worker ships
**all** its state through the checkpoint store with the rescale's KEYGROUPS
migration (``typhoon.runtime.migration``): every key group and pinned key of
its keyed state, its operator's ``snapshot()`` and its plain timers, once every
sender's handoff is in.  The new worker holds every tuple it gets until that
state is loaded, restores the operator, then runs them in arrival order, so it
starts exactly where the old one stopped.  The old worker is then released
and drained, and leaves the physical topology.

This module checks a move against the running application and adds the
operator's part to the plan's migration (pure, like the rest of the package).
"""

from __future__ import annotations

from typing import Any

from typhoon.checkpoint.settings import guarantee_of
from typhoon.reconfig.requests import Move, ReconfigError
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment


def check_move(
    request: Move,
    topology: Topology,
    physical: PhysicalTopology,
    hosts: list[str],
    exited: set[int] | frozenset = frozenset(),
) -> WorkerAssignment:
    """The worker to move; ReconfigError (4xx, one sentence) when it cannot be moved."""
    name = topology.name
    try:
        w = physical.by_id(request.worker)
    except KeyError:
        have = ", ".join(str(x.worker_id) for x in physical.workers if x.active)
        raise ReconfigError(
            f"'{name}' has no worker {request.worker} (workers: {have})", 404
        ) from None
    if not w.active:
        raise ReconfigError(f"worker {w.worker_id} of '{name}' is leaving in an update", 409)
    if w.worker_id in exited:
        raise ReconfigError(f"worker {w.worker_id} of '{name}' has finished: nothing to move", 409)
    if request.host not in hosts:
        raise ReconfigError(
            f"no host named '{request.host}' in the cluster (hosts: {', '.join(hosts)})", 404
        )
    if request.host == w.host:
        raise ReconfigError(
            f"worker {w.worker_id} ('{w.node}' #{w.index}) already runs on {w.host}"
        )
    node = topology.nodes[w.node]
    if node.kind == "spout":
        raise ReconfigError(
            f"worker {w.worker_id} belongs to the spout '{w.node}', which cannot be moved at "
            "run time (its place in its input does not travel); kill and submit the "
            "application again"
        )
    if node.engine != "python":
        raise ReconfigError(
            f"worker {w.worker_id} belongs to the {node.engine} node '{w.node}', whose "
            "engine service runs a fixed query per worker; only python workers move",
            409,
        )
    guarantee = guarantee_of(topology)
    if guarantee != "none":
        raise ReconfigError(
            f"'{name}' runs under guarantee '{guarantee}', and a checkpoint cut across a "
            "move of operator state is not handled; workers of guaranteed jobs do not move",
            409,
        )
    return w


def add_worker_move(
    migrating: dict[str, dict[str, Any]], old: WorkerAssignment, new: PhysicalTopology
) -> tuple[int, int]:
    """Record in the plan's migration that ``old``'s operator state goes to the new worker
    of its (node, index) in ``new``: (old worker ID, new worker ID)."""
    (after,) = [w for w in new.active_of_node(old.node) if w.index == old.index]
    entry = migrating.setdefault(old.node, {"groups": {}, "keys": {}})
    entry["worker"] = (old.worker_id, after.worker_id)
    return old.worker_id, after.worker_id
