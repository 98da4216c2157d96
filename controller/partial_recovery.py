"""Partial rollback as the controller runs it: who gets which ROLLBACK, what the
incident says, and the fallback when a replay is refused.

Pure state machine (``typhoon/checkpoint/partial.py`` computes the sets): fed the
workers' METRIC_RESP (``backup_from``: how far back each one's output buffers
reach) and their ROLLBACK acks, it answers with the control tuples to send.  A
failure rolls back the failed workers and their downstream closure to the newest
checkpoint complete for them (members get ROLLBACK; the replacement starts
restored); each sender of the set outside it gets ROLLBACK with ``replay``: it
stays as it is and resends its buffers to the members it feeds.  A replay
refused (``REPLAY_REFUSED``: the buffer was trimmed since it last reported) or
a plan that cannot be partial falls back to region rollback
(``typhoon/checkpoint/regions.py``) as a newer generation; the incident says
which path was taken and why.

Not wired into the fault detector's machine yet (``controller/fault_recovery.py``
still takes the region path); docs/guarantees.md "Partial rollback".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from typhoon.checkpoint.partial import PARTIAL, downstream_closure, partial_rollback
from typhoon.checkpoint.progress import recovery_point
from typhoon.checkpoint.regions import roll_back, rollback_set, worker_edges
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.wire import Control, ControlTuple

CANNOT_REPLAY = -2  # ``backup_from`` of a worker whose buffers cannot replay at all


@dataclass
class RecoveryPlan:
    """One recovery step: the physical topology to write, then the controls to send."""

    generation: int
    epoch: int | None
    path: str  # partial, region or global
    workers: frozenset[int]  # rolled back (the replacement included)
    replayers: dict[int, tuple[int, ...]]
    physical: PhysicalTopology
    controls: list[tuple[int, ControlTuple]] = field(default_factory=list)
    reason: str = ""  # why not partial
    pending: set[int] = field(default_factory=set)  # acks still to come

    def incident(self) -> dict[str, Any]:
        """What the incident record says about this step."""
        return {
            "rollback": self.path,
            "generation": self.generation,
            "restore_epoch": self.epoch,
            "region": sorted(self.workers),
            "replayers": {str(w): list(ms) for w, ms in sorted(self.replayers.items())},
            "fallback": self.reason,
        }


class PartialRecoveries:
    """One application's partial recoveries."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.coverage: dict[int, int | None] = {}  # worker -> backup_from it reported

    def heard(self, worker: int, metrics: Mapping[str, Any]) -> None:
        """A METRIC_RESP: how far back the worker's output buffers reach."""
        start = metrics.get("backup_from")
        if type(start) is int:
            self.coverage[worker] = None if start == CANNOT_REPLAY else start

    def plan(
        self,
        physical: PhysicalTopology,
        failed: set[int],
        replacements: set[int],
        generation: int,
        store: Any,
    ) -> RecoveryPlan:
        """The recovery of ``failed`` (``physical`` already holds ``replacements`` in their
        place): partial when it can be, else the failed workers' regions."""
        dead = failed | replacements
        closure = downstream_closure(worker_edges(self.topology, physical), dead)
        epoch = recovery_point(physical, store, set(closure))
        cover = {w: c for w, c in self.coverage.items() if w not in dead}
        chosen = partial_rollback(self.topology, physical, dead, epoch, cover)
        if chosen.path != PARTIAL:
            epoch = recovery_point(physical, store, set(chosen.workers))
        return self._plan(physical, chosen.workers, chosen.path, chosen.replayers, generation,
                          epoch, replacements, chosen.reason)  # fmt: skip

    def _plan(
        self,
        physical: PhysicalTopology,
        workers: frozenset[int],
        path: str,
        replayers: dict[int, tuple[int, ...]],
        generation: int,
        epoch: int | None,
        started: set[int],
        reason: str,
    ) -> RecoveryPlan:
        body = {"generation": generation, "epoch": -1 if epoch is None else epoch}
        controls = [
            (w, ControlTuple(Control.ROLLBACK, dict(body))) for w in sorted(workers - started)
        ]
        controls += [
            (w, ControlTuple(Control.ROLLBACK, {**body, "replay": list(ms)}))
            for w, ms in sorted(replayers.items())
        ]
        return RecoveryPlan(
            generation,
            epoch,
            path,
            workers,
            replayers,
            roll_back(physical, workers, generation, epoch),
            controls,
            reason,
            {w for w, _ in controls},
        )

    def acked(
        self, plan: RecoveryPlan, worker: int, what: str, generation: int, store: Any
    ) -> RecoveryPlan | None:
        """A worker's ack of ``plan``'s ROLLBACK.  ``REPLAY_REFUSED`` (its buffers no longer
        reach back): the next step, a region rollback of the failed workers' regions as
        ``generation`` (None: nothing more to do)."""
        if worker not in plan.pending:
            return None
        plan.pending.discard(worker)
        if what != "REPLAY_REFUSED":
            return None
        self.coverage[worker] = None
        plan.pending.clear()  # superseded
        failed = set(plan.workers)
        region = rollback_set(self.topology, plan.physical, failed)
        epoch = recovery_point(plan.physical, store, set(region.workers))
        reason = f"worker {worker} refused to replay epoch {plan.epoch}"
        return self._plan(plan.physical, region.workers, region.path, {}, generation, epoch,
                          set(), reason)  # fmt: skip
