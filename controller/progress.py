"""What the core makes of a worker's METRIC_RESP beyond storing it.

A guaranteed job's progress (``typhoon/checkpoint/progress.py``): each new
global checkpoint is recorded in the coordinator, a worker that missed a
recovery gets its ROLLBACK again, and COMPLETE goes out once every worker
finished.  A spout ACTIVATEd at the start that still says it is inactive
gets its ACTIVATE again (a PacketOut is not acknowledged: level-triggered,
like the rules).  A Spark node's StreamingQueryListener progress is summed for
``GET /metrics`` and raised as an event for the apps.  A mixin of
:class:`controller.core.TyphoonController`, which holds the state it uses.
"""

from __future__ import annotations

import json
import time

from controller.events import EventSparkMetrics
from typhoon.checkpoint.progress import JobProgress, guaranteed
from typhoon.wire import Control, ControlTuple

# a spout that reports itself inactive this long after its ACTIVATE went out lost it
ACTIVATE_GRACE_S = 2.0


def lost_activation(
    activated: tuple[float, frozenset[int]] | None,
    worker_id: int,
    metrics: dict,
    now: float,
    grace: float = ACTIVATE_GRACE_S,
) -> bool:
    """Whether ``worker_id`` is one of the spouts ACTIVATEd at ``activated`` = (when,
    which) and, ``grace`` seconds later, its METRIC_RESP still says it is inactive.

    Only the spouts activated when the application started count: a replacement
    spout is ACTIVATEd by the fault detector once its routes are confirmed, and
    must not get an ACTIVATE before them.
    """
    if activated is None:
        return False
    at, workers = activated
    return worker_id in workers and now - at >= grace and metrics.get("active") == 0


class WorkerProgress:
    """Guaranteed jobs' checkpoints and completion, and Spark progress, from METRIC_RESPs."""

    def _guarantee_progress(self, app: str, worker_id: int, metrics: dict) -> None:
        """Record each new global checkpoint; COMPLETE once every worker finished."""
        view = self.view.apps.get(app)
        if view is None or not guaranteed(view.topology):
            return
        progress = self.progress.setdefault(app, JobProgress())
        progress.heard(worker_id, metrics)
        physical = view.physical
        behind = progress.behind(worker_id, metrics, physical, time.monotonic())
        if behind is not None and view.all_attached():
            # a recovery this worker has not heard of (a ROLLBACK lost, or a controller
            # restarted in the middle of one): level-triggered, like the rules
            self.send_control(app, [worker_id], ControlTuple(Control.ROLLBACK, behind))
        epoch = progress.global_epoch(physical)
        if epoch is not None and (progress.recorded is None or epoch > progress.recorded):
            progress.recorded = epoch
            state = self.coordinator.get_app_state(app) or {}
            self.coordinator.put_app_state(
                app,
                {
                    **state,
                    # plan: the physical version (key-group tables) the epoch was taken under
                    "checkpoint": {"epoch": epoch, "time": time.time(), "plan": physical.version},
                },
            )
        first = progress.completed_generation != physical.generation
        workers = progress.to_complete(worker_id, metrics, physical)
        if workers:
            if first:
                self.logger.info("app %s: every worker finished; COMPLETE", app)
            self.send_control(app, workers, ControlTuple(Control.COMPLETE, {}))

    def _activation_progress(self, app: str, worker_id: int, metrics: dict) -> None:
        """ACTIVATE again a spout of the start whose ACTIVATE was lost on the way."""
        now = time.monotonic()
        activated = self.activated.get(app)
        view = self.view.apps.get(app)
        if view is None or not view.state.get("active") or view.state.get("drain"):
            return
        if lost_activation(activated, worker_id, metrics, now):
            self.activated[app] = (now, activated[1])  # at most once per grace period
            self.logger.warning(
                "app %s: spout worker %d still inactive %.1f s after ACTIVATE; sending it again",
                app, worker_id, now - activated[0],
            )  # fmt: skip
            self.send_control(app, [worker_id], ControlTuple(Control.ACTIVATE, {}))

    def _spark_progress(self, app: str, worker_id: int, spark: dict, now: float) -> None:
        """Spark StreamingQueryListener progress carried in a spark node's METRIC_RESP."""
        try:
            events = json.loads(spark.get("events") or "[]")
            node = str(spark["node"])
        except (ValueError, KeyError, TypeError):
            self.channel.drop("malformed_spark_metrics")
            return
        for progress in events if isinstance(events, list) else []:
            if isinstance(progress, dict):
                self.spark_totals.add(app, node, progress)
                self.send_event_to_observers(EventSparkMetrics(app, node, progress, now))
