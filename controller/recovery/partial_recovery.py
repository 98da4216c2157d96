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

``PartialRecovery`` runs it in the fault detector's machine
(``controller/recovery/fault_recovery.py``) for applications with ``partial_rollback:
true``; docs/guarantees.md "Partial rollback".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from controller.recovery.fault_detector import FaultSettings, Incident
from controller.waits import WAIT, Check
from typhoon.checkpoint import CheckpointError, open_store
from typhoon.checkpoint.partial import (
    PARTIAL,
    downstream_closure,
    partial_enabled,
    partial_rollback,
)
from typhoon.checkpoint.progress import recovery_point
from typhoon.checkpoint.regions import roll_back, rollback_set, worker_edges
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.wire import Control, ControlTuple

if TYPE_CHECKING:
    from controller.recovery.fault_core import Core

CANNOT_REPLAY = -2  # ``backup_from`` of a worker whose buffers cannot replay at all
IN_FLIGHT = ("rerouting", "replacing")  # an incident whose recovery has not finished


class _NoStore:
    """A store that cannot be read: no checkpoint, a rollback goes to the start."""

    def latest_complete(self, parts: set[str], accept: Any = None) -> None:
        return None


NO_STORE = _NoStore()


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

    def __init__(self, topology: Topology | None) -> None:
        self.topology = topology  # None until a recovery (coverage may come first)
        self.coverage: dict[int, int | None] = {}  # worker -> backup_from it reported
        self.predecessors: dict[int, int] = {}  # replacement -> dead worker (newest plan)

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
        predecessors: Mapping[int, int] | None = None,
        started: set[int] | None = None,
        gone: set[int] | frozenset[int] = frozenset(),
    ) -> RecoveryPlan:
        """The recovery of ``failed`` (``physical`` already holds ``replacements`` in their
        place; ``predecessors``: replacement -> the dead worker whose link it takes over):
        partial when it can be, else the failed workers' regions.  ``started``: the
        replacements that start restored in this generation (default: all of them; one
        of an earlier recovery restores again).  ``gone``: failed workers that are dead
        and not replaced yet: members, but nobody replays to them (their replacement's
        own recovery will)."""
        self.predecessors = dict(predecessors or {})
        dead = failed | replacements
        closure = downstream_closure(worker_edges(self.topology, physical), dead)
        epoch = recovery_point(physical, store, set(closure))
        cover = {w: c for w, c in self.coverage.items() if w not in dead}
        chosen = partial_rollback(self.topology, physical, dead, epoch, cover)
        if chosen.path != PARTIAL:
            epoch = recovery_point(physical, store, set(chosen.workers))
        replayers = {
            w: kept
            for w, ms in chosen.replayers.items()
            if (kept := tuple(m for m in ms if m not in gone))
        }
        started = replacements if started is None else started
        return self._plan(physical, chosen.workers, chosen.path, replayers, generation,
                          epoch, started, chosen.reason)  # fmt: skip

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
        for w, ms in sorted(replayers.items()):
            replay: dict[str, Any] = {**body, "replay": list(ms)}
            links = [self.predecessors.get(m, m) for m in ms]
            if links != list(ms):
                replay["replay_from"] = links
            controls.append((w, ControlTuple(Control.ROLLBACK, replay)))
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
        self,
        plan: RecoveryPlan,
        worker: int,
        what: str,
        generation: int,
        store: Any,
        physical: PhysicalTopology | None = None,
    ) -> RecoveryPlan | None:
        """A worker's ack of ``plan``'s ROLLBACK.  ``REPLAY_REFUSED`` (its buffers no longer
        reach back): the next step, a region rollback of the failed workers' regions as
        ``generation`` on ``physical`` (default: the plan's) (None: nothing more to do).
        Every live worker of the regions gets its ROLLBACK, the replacement too: it
        started in the plan's generation."""
        if worker not in plan.pending:
            return None
        plan.pending.discard(worker)
        if what != "REPLAY_REFUSED":
            return None
        self.coverage[worker] = None
        plan.pending.clear()  # superseded
        now = physical or plan.physical
        region = rollback_set(self.topology, now, set(plan.workers))
        epoch = recovery_point(now, store, set(region.workers))
        reason = f"worker {worker} refused to replay epoch {plan.epoch}"
        return self._plan(now, region.workers, region.path, {}, generation, epoch, set(), reason)


class PartialRecovery:
    """The partial half of ``GuaranteedRecovery`` (a mixin sharing the fault machine's
    state): applications with ``partial_rollback: true`` only."""

    conf: FaultSettings
    logger: logging.Logger
    clock: Callable[[], float]
    incidents: list[Incident]
    epochs: dict[tuple[str, int], int | None]
    generations: dict[str, int]
    region_rolled: dict[tuple[str, int], int]
    partials: dict[str, PartialRecoveries]  # app -> its coverage and newest plans
    partial_plans: dict[tuple[str, int], RecoveryPlan]  # (app, generation) -> plan
    _since: Callable[[Incident], float]  # GuaranteedRecovery's

    def _note_backup(self, app: str, wid: int, metrics: dict[str, Any]) -> None:
        """A METRIC_RESP's ``backup_from`` (only workers of a partial app report one), and
        the tuples a replayer resent for each generation: the incident of that generation
        records them under ``replayed`` (as a source's own replay)."""
        if "backup_from" not in metrics:
            return
        self.partials.setdefault(app, PartialRecoveries(None)).heard(wid, metrics)
        resent = metrics.get("backup_replayed_tuples")
        if not isinstance(resent, dict) or not resent:
            return
        for i in self.incidents:
            if i.app == app and i.rollback == PARTIAL and wid in i.replayers:
                n = resent.get(str(i.generation))
                if type(n) is int:
                    i.replayed[wid] = n

    def _partial_recovery(
        self,
        topology: Topology,
        physical: PhysicalTopology,
        generation: int,
        incident: Incident,
        replacement: int | None,
        store: Any,
    ) -> PhysicalTopology | None:
        """The physical topology of a partial recovery as ``generation`` (None: not
        partial; the incident's ``fallback`` says why)."""
        if not partial_enabled(topology) or replacement is None:
            return None
        machine = self.partials.setdefault(incident.app, PartialRecoveries(topology))
        machine.topology = topology
        others = self._in_flight(topology, physical, incident, replacement)
        replacements = {replacement} | {i.replacement for i in others if i.replacement is not None}
        predecessors = {replacement: incident.worker}
        predecessors.update({i.replacement: i.worker for i in others if i.replacement is not None})
        gone = {i.worker for i in others if i.replacement is None}
        plan = machine.plan(
            physical, {incident.worker} | {i.worker for i in others}, replacements, generation,
            store, predecessors, {replacement}, gone,
        )  # fmt: skip
        if plan.path != PARTIAL:
            incident.fallback = plan.reason
            self.logger.info(
                "app %s worker %d: no partial rollback (%s): %s rollback",
                incident.app, incident.worker, plan.reason, plan.path,
            )  # fmt: skip
            return None
        incident.rollback = PARTIAL
        incident.region = sorted(plan.workers)
        incident.replayers = {w: list(ms) for w, ms in plan.replayers.items()}
        incident.generation, incident.restore_epoch = generation, plan.epoch
        self.epochs[(incident.app, generation)] = plan.epoch
        self.partial_plans[(incident.app, generation)] = plan
        self.logger.info(
            "app %s worker %d: partial recovery of %s as generation %d from checkpoint %s; "
            "%s replay",
            incident.app, incident.worker, sorted(plan.workers), generation, plan.epoch,
            sorted(plan.replayers),
        )  # fmt: skip
        return plan.physical

    def _in_flight(
        self, topology: Topology, physical: PhysicalTopology, incident: Incident, new: int
    ) -> list[Incident]:
        """The other failures of ``incident``'s failover region whose recovery has not
        finished (not replaced yet, or not yet rolled back).  One recovery plans them
        with this one: a worker dead at the same time is not a sender that can replay,
        and a replacement restored for an earlier failure in the set restores again."""
        ids = {w.worker_id for w in physical.workers}
        region = rollback_set(topology, physical, {incident.worker, new} & ids).workers
        return [
            i
            for i in self.incidents
            if i.app == incident.app
            and i is not incident
            and i.state in IN_FLIGHT
            and (i.worker in region or i.replacement in region)
        ]

    def _covered_by(self, incident: Incident, plan: RecoveryPlan, ids: set[int]) -> Incident | None:
        """A later failure whose recovery (a newer generation) rolls back every live member
        of ``plan`` too: this one's ROLLBACKs would only be undone by it."""
        live = plan.workers & ids
        for i in self.incidents:
            if (
                i.app == incident.app
                and i is not incident
                and i.state != "failed"
                and (i.generation or 0) > plan.generation
                and live <= set(i.region)
            ):
                return i
        return None

    def _partial_rollback(
        self, core: Core, incident: Incident, app: Any
    ) -> Generator[Check, Any, str]:
        """Send the plan's ROLLBACKs (the replacement started restored), await an ack of
        each; a refused replay turns it into a region rollback as a newer generation."""
        name = incident.app
        plan = self.partial_plans.get((name, incident.generation or 0))
        if plan is None:
            return "no partial plan"
        now = core.view.apps.get(name) or app
        newer = self._covered_by(incident, plan, {w.worker_id for w in now.physical.workers})
        if newer is not None:
            self.logger.info(
                "app %s worker %d: generation %d covered by the recovery of worker %d as "
                "generation %s", name, incident.worker, plan.generation, newer.worker,
                newer.generation,
            )  # fmt: skip
            return ""
        sent = self._send_plan(core, name, now, plan, {incident.replacement})
        incident.rolled_back = sorted(w for w in sent.values() if w in plan.workers)
        refused: set[int] = yield self._answers(core, name, sent)
        incident.rolled_back_ms = self._since(incident)
        if not refused:
            return ""
        generation = max(self.generations.get(name, 0), plan.generation) + 1
        topology = now.topology
        try:
            store: Any = open_store(topology.config.get("checkpoint_store"), topology.name)
        except CheckpointError as e:  # start over from the beginning: still exactly once
            self.logger.error("app %s: checkpoint store: %s; rolling back to the start", name, e)
            store = NO_STORE
        current = core.stored_physical(name) or now.physical
        step = self.partials[name].acked(
            plan, min(refused), "REPLAY_REFUSED", generation, store, current
        )
        if step is None:
            return ""
        core.update_physical(name, step.physical)
        self.generations[name] = generation
        self.epochs[(name, generation)] = step.epoch
        incident.rollback, incident.fallback = step.path, step.reason
        incident.region = sorted(step.workers)
        incident.generation, incident.restore_epoch = generation, step.epoch
        self.logger.warning(
            "app %s worker %d: %s; %s rollback of %d workers as generation %d from %s",
            name, incident.worker, step.reason, step.path, len(step.workers), generation,
            step.epoch,
        )  # fmt: skip
        sent = self._send_plan(core, name, now, step, set())
        incident.rolled_back = sorted(sent.values())
        yield self._answers(core, name, sent)
        incident.rolled_back_ms = self._since(incident)
        return step.reason

    def _send_plan(
        self, core: Core, name: str, app: Any, plan: RecoveryPlan, skip: set[int | None]
    ) -> dict[tuple[int, int], int]:
        sent: dict[tuple[int, int], int] = {}
        for wid, ct in plan.controls:
            s = app.statuses.get(wid)
            if wid in skip or (s is not None and s.state == "exited"):
                continue
            core.send_control(name, [wid], ct)
            sent[(wid, plan.generation)] = wid
            if wid in plan.workers:
                self.region_rolled[(name, wid)] = plan.generation
        return sent

    def _answers(self, core: Core, name: str, sent: dict[tuple[int, int], int]) -> Check:
        """A check: the workers that refused to replay, once each one answered (or exited,
        or ``ack_timeout`` passed: a silent worker is the core's catch-up's to handle)."""
        pending = dict(sent)
        deadline = self.clock() + self.conf.ack_timeout
        refused: set[int] = set()

        def check(now: float) -> Any:
            view = core.view.apps.get(name)
            for w, v in list(pending):
                s = view.statuses.get(w) if view is not None else None
                if w in core.acked(name, "REPLAY_REFUSED", v):
                    refused.add(w)
                    del pending[(w, v)]
                elif w in core.acked(name, "ROLLBACK", v) or (
                    s is not None and s.state == "exited"
                ):
                    del pending[(w, v)]
            if not pending or now > deadline or view is None:
                if pending:
                    self.logger.warning("app %s: workers %s did not confirm ROLLBACK", name,
                                        sorted(set(pending.values())))  # fmt: skip
                return refused
            return WAIT

        return check
