"""Region failover: a failure rolls back only the failover regions it touched.

A part of the fault detector's recovery (``controller/recovery/fault_recovery.py``), for
guaranteed applications whose workers fall into more than one failover region
(``typhoon/checkpoint/regions.py``: the connected components of the worker
graph).  The replacement's region restores the newest checkpoint complete for
that region's workers, as a generation of its own; the workers of every other
region are not told anything and go on in their generation.  The physical
topology records each worker's generation and epoch, so a replacement, the
core's catch-up ROLLBACK and COMPLETE all compare a worker with its own region.
When the failed worker's region is the whole job, the path is the global one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from controller.recovery.fault_detector import Incident
from typhoon.checkpoint.regions import RollbackSet, replayed_since, rollback_set
from typhoon.wire import Control, ControlTuple

if TYPE_CHECKING:
    from controller.recovery.fault_core import Core
    from controller.waits import Check


class RegionRecovery:
    """The region half of ``GuaranteedRecovery`` (a mixin sharing the machine's state)."""

    logger: logging.Logger
    clock: Callable[[], float]
    epochs: dict[tuple[str, int], int | None]
    incidents: list[Incident]
    region_rolled: dict[tuple[str, int], int]  # (app, worker) -> newest generation sent

    def _rollback_set(
        self, topology: Any, physical: Any, incident: Incident, replacement: int | None
    ) -> RollbackSet:
        """The workers a failure of ``incident.worker`` rolls back in ``physical`` (which
        holds its replacement, not the dead worker), recorded in the incident."""
        failed = {incident.worker} | ({replacement} if replacement is not None else set())
        rollback = rollback_set(topology, physical, failed)
        incident.rollback = rollback.path
        incident.region = sorted(rollback.workers)
        return rollback

    def _region_rollback(
        self, core: Core, incident: Incident, app: Any
    ) -> Generator[Check, Any, str]:
        """ROLLBACK to the live workers of the failed worker's region only.

        Another failure in the same region meanwhile (its replacement was written as
        a newer generation, from a checkpoint at least as new) is covered by one
        rollback to the newest generation; a failure in another region never shares
        a worker with this one and is rolled back on its own."""
        name = incident.app
        now = core.view.apps.get(name) or app
        ids = {w.worker_id for w in now.physical.workers}
        region = rollback_set(now.topology, now.physical, set(incident.region) & ids).workers
        if not region:
            self.logger.warning(
                "app %s worker %d: no worker of its region is left: nothing to roll back",
                name, incident.worker,
            )  # fmt: skip
            return ""
        related = [
            i
            for i in self.incidents
            if i.app == name and i.generation is not None and set(i.region) & region
        ]
        gen = max(i.generation for i in related if i.generation is not None)
        epoch_of = self.epochs.get((name, gen), incident.restore_epoch)
        started = {i.replacement for i in related if i.generation == gen}
        body = {"generation": gen, "epoch": -1 if epoch_of is None else epoch_of}
        sent: dict[tuple[int, int], int] = {}
        for w in now.physical.workers:
            wid = w.worker_id
            s = now.statuses.get(wid)
            if wid not in region or wid in started or (s is not None and s.state == "exited"):
                continue
            if self.region_rolled.get((name, wid), 0) >= gen:
                continue  # covered by the rollback of another failure of this region
            core.send_control(name, [wid], ControlTuple(Control.ROLLBACK, body))
            self.region_rolled[(name, wid)] = gen
            sent[(wid, gen)] = wid
        incident.rolled_back = sorted(sent.values())
        if not sent:
            self.logger.info(
                "app %s worker %d: generation %s covered by the rollback of its region to "
                "generation %d",
                name, incident.worker, incident.generation, gen,
            )  # fmt: skip
            return ""
        problem = yield self._acked(core, name, "ROLLBACK", sent)
        incident.rolled_back_ms = self._since(incident)
        self.logger.info(
            "app %s: region of worker %d (%d of %d workers) rolled back to checkpoint %s as "
            "generation %d: workers %s (%s), %.1f ms after detection; the other regions go on",
            name, incident.worker, len(region), len(ids), epoch_of, gen, sorted(sent.values()),
            problem or "confirmed", incident.rolled_back_ms,
        )  # fmt: skip
        return problem

    def _note_replays(self, app: str, wid: int, metrics: dict[str, Any]) -> None:
        """A source's METRIC_RESP says how many tuples it emitted again after each of its
        rollbacks: each incident whose ROLLBACK it got records its count
        (``typhoon.checkpoint.regions.replayed_since``)."""
        if not metrics.get("replayed"):
            return
        for i in self.incidents:
            if i.app != app or i.generation is None or wid not in i.rolled_back:
                continue
            n = replayed_since(metrics["replayed"], i.generation)
            if n is not None:
                i.replayed[wid] = n
