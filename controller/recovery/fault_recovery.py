"""Failover under a processing guarantee: recovery generations, ROLLBACK, and resuming.

A part of the fault detector's state machine (``controller/recovery/fault_detector_machine.py``):
under ``at_least_once`` or ``exactly_once`` a replacement starts a new generation
from the newest global checkpoint that verifies, and every other live worker
rolls back to it (``docs/guarantees.md``).  After a controller restart, an
application found in a recovery generation gets its routes sent again once every
worker is attached.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any

from controller.recovery.acks import all_acked, send_routes
from controller.recovery.fault_core import Core
from controller.recovery.fault_detector import FaultSettings, Incident
from controller.recovery.partial_recovery import PARTIAL, PartialRecovery
from controller.recovery.region_recovery import RegionRecovery
from controller.waits import WAIT, Check, Task, Tasks
from typhoon.checkpoint import CheckpointError, open_store
from typhoon.checkpoint.progress import guaranteed, recovery_point
from typhoon.checkpoint.regions import REGION, roll_back
from typhoon.topology.routing import routes_for
from typhoon.wire import Control, ControlTuple

RESUME_AFTER_S = 1.0  # after a start, the core reads the coordinator first


class GuaranteedRecovery(RegionRecovery, PartialRecovery):
    """The recovery half of ``FaultMachine`` (a mixin: it shares the machine's state)."""

    conf: FaultSettings
    core: Core
    logger: logging.Logger
    clock: Callable[[], float]
    tasks: Tasks
    generations: dict[str, int]  # app -> newest recovery generation
    epochs: dict[tuple[str, int], int | None]  # (app, generation) -> the epoch it restores
    rolled: dict[str, int]  # app -> newest generation its workers were rolled back to
    joining: dict[str, set[int]]  # app -> replacements whose ROUTING is not confirmed yet
    incidents: list[Incident]

    def _recovery(
        self, topology: Any, physical: Any, after: int, incident: Incident, replacement: int
    ) -> Any:
        """The replacement's physical topology starts a new generation (after every one
        used so far) for the failed worker's failover region, from the newest checkpoint
        of that region's workers whose parts all verify (a corrupt one: the one before);
        the other regions stay in theirs (``controller/recovery/region_recovery.py``)."""
        generation = after + 1
        rollback = self._rollback_set(topology, physical, incident, replacement)
        try:
            store = open_store(topology.config.get("checkpoint_store"), topology.name)
            partial = self._partial_recovery(
                topology, physical, generation, incident, replacement, store
            )
            if partial is not None:  # the failed worker and its downstream closure only
                return partial
            epoch = recovery_point(physical, store, set(rollback.workers))
        except CheckpointError as e:
            # no store: start over from the beginning, which is still exactly once
            self.logger.error(
                "app %s: checkpoint store: %s; rolling back to the start", topology.name, e
            )
            epoch = None
        incident.generation, incident.restore_epoch = generation, epoch
        self.epochs[(topology.name, generation)] = epoch
        self.logger.info(
            "app %s worker %d: %s recovery of %d workers (%d regions) as generation %d from "
            "checkpoint %s",
            topology.name, incident.worker, rollback.path, len(rollback.workers),
            rollback.regions, generation, epoch,
        )  # fmt: skip
        return roll_back(physical, rollback.workers, generation, epoch)

    def _rollback(
        self, core: Core, incident: Incident, app: Any, new: int
    ) -> Generator[Check, Any, str]:
        """ROLLBACK to every live worker, once every replacement of the app is routed to.

        Several failures at once (two stages, a whole host) recover side by side, each
        as a generation of its own.  A rollback before another replacement is routed to
        would replay tuples of that replacement's key groups while its senders still
        leave them unrouted, and that replacement's own, older ROLLBACK would then be
        ignored by workers already in the newer generation: lost.  So each recovery
        waits until every replacement of the app is routed to and routes with its
        peers (``joining``), and rolls every live worker back to
        the newest generation (and its epoch) once; a replacement already in it ignores
        the ROLLBACK, one started in an older generation restores again."""
        name = incident.app
        deadline = self.clock() + self.conf.attach_timeout
        yield lambda now: True if not self.joining.get(name) or now > deadline else WAIT
        if incident.rollback == REGION:
            return (yield from self._region_rollback(core, incident, app))
        if incident.rollback == PARTIAL:
            return (yield from self._partial_rollback(core, incident, app))
        gen = max(self.generations.get(name, 0), incident.generation or 0)
        if self.rolled.get(name, 0) >= gen:
            self.logger.info(
                "app %s worker %d: generation %d covered by the rollback to generation %d",
                name, incident.worker, incident.generation, self.rolled[name],
            )  # fmt: skip
            return ""
        epoch_of = self.epochs.get((name, gen), incident.restore_epoch)
        epoch = -1 if epoch_of is None else epoch_of
        started = {i.replacement for i in self.incidents if i.app == name and i.generation == gen}
        sent = {}
        # the view now, not ``app``: another failover (a second worker of a dead machine)
        # may have taken a worker out since, and send_control addresses the view's workers
        now = core.view.apps.get(name) or app
        for w in now.physical.workers:
            s = now.statuses.get(w.worker_id)
            if s is not None and s.state == "exited":
                continue
            if w.worker_id in started:
                continue  # started restored, in this generation
            body = {"generation": gen, "epoch": epoch}
            core.send_control(name, [w.worker_id], ControlTuple(Control.ROLLBACK, body))
            sent[(w.worker_id, gen)] = w.worker_id
        incident.rolled_back = sorted(sent.values())
        self.rolled[name] = gen
        problem = yield self._acked(core, name, "ROLLBACK", sent)
        incident.rolled_back_ms = self._since(incident)
        self.logger.info(
            "app %s: workers %s rolled back to checkpoint %s as generation %d (%s), %.1f ms "
            "after the detection of worker %d",
            name, sorted(sent.values()), incident.restore_epoch, gen, problem or "confirmed",
            incident.rolled_back_ms, incident.worker,
        )  # fmt: skip
        return problem

    def resume_recoveries(self) -> None:
        """After a controller restart: a guaranteed app whose physical topology is in a
        recovery generation may have a replacement nobody routes to yet (the restart
        came between its start and its rejoin).  Once every worker is attached, every
        sender gets its routes from the physical topology again (harmless if they are
        already those); the core then rolls back whoever is in an older generation."""
        self.tasks.start(self._resume(), lambda e: self.logger.error("resume failed: %s", e))

    def _resume(self) -> Task:
        start = self.clock()
        yield lambda now: True if now >= start + RESUME_AFTER_S else WAIT
        core = self.core
        for name, app in list(core.view.apps.items()):
            if not guaranteed(app.topology) or app.physical.generation == 0:
                continue
            self.generations[name] = max(self.generations.get(name, 0), app.physical.generation)
            try:
                yield from self._reroute_all(core, name)
            except Exception:  # never kill the app over one application
                self.logger.exception("app %s: resuming its recovery failed", name)

    def _reroute_all(self, core: Core, name: str) -> Task:
        deadline = self.clock() + self.conf.attach_timeout

        def ready(now: float) -> Any:
            app = core.view.apps.get(name)
            if app is None:
                return "gone"
            if app.all_attached() and core.rules_ready(name, app.physical.version):
                return "ready"
            if now > deadline:
                self.logger.warning("app %s: not every worker attached; routes not resent", name)
                return "timeout"
            return WAIT

        if (yield ready) != "ready":
            return
        app = core.view.apps[name]
        routes = {
            w.worker_id: routes_for(app.topology, app.physical, w.worker_id)
            for w in app.physical.workers
            if w.active and app.topology.outputs_of(w.node)
        }
        problem = yield self._acked(core, name, "ROUTING", send_routes(core, name, routes))
        self.logger.info(
            "app %s: generation %d after a controller restart: routes resent to %s (%s)",
            name, app.physical.generation, sorted(routes), problem or "confirmed",
        )  # fmt: skip

    def _acked(self, core: Core, name: str, ctype: str, sent: dict[tuple[int, int], int]) -> Check:
        return all_acked(core, name, ctype, sent, self.clock() + self.conf.ack_timeout)

    def _since(self, incident: Incident) -> float:
        return (self.clock() - incident.detected) * 1000
