"""Autoscaler (paper §4 "Auto scaler", §6.2 Fig. 11): ``ryu-manager apps/autoscaler.py``.

Watches every bolt's workers (METRIC_RESP: queue depth, processing time per
tuple, and the fraction of time they spend processing) and every spark-engine
node's Spark progress (processed versus input rows per second, batch duration
versus the node's ``trigger_ms``).  A node
whose workers stay overloaded for ``up_window`` seconds gets more workers; one
that stays idle for the longer ``down_window`` gets fewer; never outside
``[min_parallelism, max_parallelism]``, never more than ``max_step`` at once,
and not again before ``cooldown`` seconds passed.  The decisions themselves are
in ``controller/autoscaling/autoscaler.py``; this file feeds it and acts.

A scale is a stable update through the controller's reconfiguration executor
(``core.reconfigure``, the same path as ``POST /typhoon/apps/NAME/scale``), so
no tuple is lost.  While any update of an application runs, its nodes are not
judged, and a node whose parallelism changed (by us or by an operator) starts
its windows over after a cooldown.  With ``recommend_only`` the app only logs
what it would do.  Every decision is logged with its reason and kept for
``GET /typhoon/autoscaler`` (or ``/typhoon/apps/NAME/autoscaler``).

Settings: section ``[autoscaler]`` of the Ryu config file, declared once by
``ScaleSettings`` in ``controller/autoscaling/autoscaler.py``
(``controller/settings.py``); the table is in ``docs/autoscaler.md``.

A spark node only scales up: when it stays idle the app logs a "keep" with
the reason (the planner refuses to take workers from a running Spark query).
"""

from __future__ import annotations

import collections
import time
from typing import Any

from controller.app_support import EventTick, TyphoonApp, report_rest, start_ticks
from controller.autoscaling.autoscaler import (
    Decision,
    NodeScaler,
    ScaleSettings,
    Signal,
    WorkerLoad,
    spark_window_signal,
    worker_signal,
)
from controller.events import EventSparkMetrics, EventTopologyChanged, EventWorkerMetrics
from controller.framework.ryu_compat import (
    require_app,
    set_ev_cls,
)
from controller.options import read_settings, register_settings
from controller.services import Services, services
from typhoon.reconfig import ReconfigError, Scale

require_app("controller.core")

register_settings(ScaleSettings)

TICK_S = 0.5
REST = report_rest("autoscaler", missing="no managed node")
KEEP_DECISIONS = 50


class Autoscaler(TyphoonApp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = read_settings(ScaleSettings)
        self.scalers: dict[tuple[str, str], NodeScaler] = {}
        self.shape: dict[tuple[str, str], int] = {}  # parallelism last seen
        self.loads: dict[tuple[str, int], WorkerLoad] = {}
        self.spark: dict[tuple[str, str], tuple[Signal | None, float]] = {}
        self.progress: dict[tuple[str, str], collections.deque] = {}  # judged events per node
        self.decisions: collections.deque = collections.deque(maxlen=KEEP_DECISIONS)
        # (app, node, action) -> decisions ever made (GET /metrics; ``decisions`` keeps the last)
        self.decision_counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        kwargs["wsgi"].register(REST, {"app": self})
        start_ticks(self, TICK_S)
        self.logger.info("autoscaler ready: %s", self.settings)

    @staticmethod
    def core() -> Services:
        """The controller core's services (looked up on use: Ryu may start it after this app)."""
        return services()

    # ----- inputs ----------------------------------------------------------------------------

    @set_ev_cls(EventWorkerMetrics)
    def _metrics(self, ev):
        self.loads.setdefault((ev.app, ev.worker_id), WorkerLoad()).update(ev.metrics, ev.at)

    @set_ev_cls(EventSparkMetrics)
    def _spark(self, ev):
        app = self.core().view.apps.get(ev.app)
        node = app.topology.nodes.get(ev.node) if app is not None else None
        if node is None:
            return
        batch = ev.progress.get("batch", ev.progress.get("batchId"))
        if isinstance(batch, int) and batch < self.settings.spark_warmup:
            return  # a cold query's first batches say nothing about the load
        key = (ev.app, ev.node)
        events = self.progress.setdefault(key, collections.deque(maxlen=32))
        events.append(ev.progress)
        trigger = float(node.args.get("trigger_ms", 0) or 0)
        self.spark[key] = (spark_window_signal(list(events), trigger, self.settings), ev.at)

    @set_ev_cls(EventTopologyChanged)
    def _topology_changed(self, ev):
        if ev.version is None:  # the application is gone
            for d in (self.scalers, self.shape, self.spark, self.progress):
                for key in [k for k in d if k[0] == ev.app]:
                    del d[key]
            for key in [k for k in self.loads if k[0] == ev.app]:
                del self.loads[key]

    # ----- the timer -------------------------------------------------------------------------

    @set_ev_cls(EventTick)
    def _tick(self, ev):
        now = time.monotonic()
        core = self.core()
        for name, app in list(core.view.apps.items()):
            rec = core.reconfiguration(name)
            busy = rec is not None and rec.running
            for node in app.topology.nodes.values():
                if node.kind != "bolt" or (self.settings.nodes and node.name not in
                                           self.settings.nodes):  # fmt: skip
                    continue
                key = (name, node.name)
                scaler = self.scalers.get(key)
                if scaler is None:
                    scaler = self.scalers[key] = NodeScaler(
                        node.name, self.settings, can_shrink=node.engine == "python"
                    )
                    self.logger.info("app %s node %s: managed (parallelism %d)",
                                     name, node.name, node.parallelism)  # fmt: skip
                if self.shape.get(key, node.parallelism) != node.parallelism or busy:
                    scaler.reset(now)  # its metrics describe neither the old nor the new shape
                    if key in self.progress:
                        self.progress[key].clear()  # batches of the old shape
                self.shape[key] = node.parallelism
                if busy:
                    continue
                scaler.observe(self._signal(name, app, node, now), now)
                d = scaler.decide(node.parallelism, now)
                if d is not None:
                    self._act(name, d)

    def _signal(self, name: str, app, node, now: float) -> Signal | None:
        if node.engine == "spark":
            sig, at = self.spark.get((name, node.name), (None, 0.0))
            trigger_s = float(node.args.get("trigger_ms", 0) or 0) / 1000.0
            return sig if now - at <= max(self.settings.stale_s, 3 * trigger_s) else None
        samples = []
        for w in app.physical.workers:
            if w.node != node.name or w.state == "draining":
                continue
            load = self.loads.get((name, w.worker_id))
            if load is not None and load.sample and now - load.sample.at <= self.settings.stale_s:
                samples.append(load.sample)
        return worker_signal(samples, self.settings)

    # ----- acting ----------------------------------------------------------------------------

    def _act(self, name: str, d: Decision) -> None:
        outcome = ""
        if d.target is not None and not d.recommend_only:
            try:
                rec = self.core().reconfigure(name, Scale(d.node, d.target))
                outcome = f"reconfiguration {rec.id} started"
            except ReconfigError as e:
                outcome = f"refused: {e}"
            except Exception as e:  # a planning bug must not stop the autoscaler's loop
                self.logger.exception("app %s node %s: scale failed", name, d.node)
                outcome = f"failed: {e!r}"
        target = d.current if d.target is None else d.target
        self.logger.info(
            "app %s node %s: %s %d -> %d: %s%s",
            name, d.node, d.action, d.current, target, d.reason,
            f" ({outcome})" if outcome else "",
        )  # fmt: skip
        self.decision_counts[(name, d.node, d.action)] += 1
        self.decisions.append(
            {
                "time": time.time(),
                "app": name,
                "node": d.node,
                "action": d.action,
                "from": d.current,
                "to": target,
                "reason": d.reason,
                "outcome": outcome,
            }
        )

    # ----- report ----------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Per application and managed node: its latest signal, windows, and decisions."""
        now = time.monotonic()
        out: dict[str, Any] = {}
        for (name, node), s in sorted(self.scalers.items()):
            out.setdefault(name, {})[node] = {
                "parallelism": self.shape.get((name, node)),
                "signal": s.last.reason if s.last else None,
                "over_for_s": round(now - s.over_since, 2) if s.over_since else 0.0,
                "under_for_s": round(now - s.under_since, 2) if s.under_since else 0.0,
                "cooldown_s": round(max(0.0, s.cooldown_until - now), 2),
                "decisions": [x for x in self.decisions if (x["app"], x["node"]) == (name, node)],
            }
        return out
