"""The fault detector's state machine (``apps/fault_detector.py`` is its Ryu shell).

Fed with events (a worker's port went down, a METRIC_RESP, a timer) and the
time, it decides and acts through the controller's services
(``controller/services.py``); the decisions themselves are the pure functions
of ``controller/recovery/fault_detector.py``.  A dead worker is handled in steps:

1. ``fail``: ROUTING without it to its senders, at once, in the event handler
   (every tuple written to the dead port until then is lost);
2. a task (``controller/waits.py``) awaits the senders' acks and the agent's
   exit status, writes the physical topology with a replacement, tells the
   receivers (UPSTREAM) and awaits their acks;
3. once the replacement is attached and its rules are in: UPSTREAM to the
   replacement first (its senders as they are now), then ROUTING with it to
   its senders, ACTIVATE for a source, ROLLBACK under a processing guarantee.

This module detects and does step 1; steps 2 and 3 are ``controller/recovery/fault_failover.py``
(the recovery generation, ROLLBACK and resuming after a controller restart are in
``controller/recovery/fault_recovery.py``), what the machine needs of the controller is
``controller/recovery/fault_core.py``.

The waits are checks the app's timer asks (``step``), never sleeps, so every
change happens on the app's event loop and the unit tests drive it with a
fake clock and a fake core.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from controller.recovery.acks import send_routes
from controller.recovery.fault_core import Core
from controller.recovery.fault_detector import (
    LIVE,
    FaultSettings,
    Heartbeats,
    Incident,
    crashed,
    held_up_by_receivers,
    reroute,
    senders_to,
)
from controller.recovery.fault_failover import Failover
from controller.rules.composer import Source
from controller.rules.dead_addresses import dead_address_rules
from controller.waits import Task, Tasks
from typhoon.sink_rates import WINDOW_S, SinkWatch, downstream_sinks

ENDING = "every sender of it finished: it ends after their end of stream, or its exit says"


class FaultMachine(Failover):
    """Detection (port events, heartbeats) and the immediate reroute; the rest is its
    parents' (``Failover``, ``GuaranteedRecovery``, ``RegionRecovery``)."""

    def __init__(
        self,
        conf: FaultSettings,
        core: Core,
        metrics_interval: float,
        logger: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
        scope: Callable[[Any], bool] | None = None,
    ) -> None:
        self.conf = conf
        # which applications (their view) this machine recovers; None: every one
        self.scope = scope
        self.core = core
        self.logger = logger
        self.clock = clock
        self.tasks = Tasks(clock, logger)
        self.incidents: list[Incident] = []
        self.handled: set[tuple[str, int]] = set()  # (app, worker) already failed over
        self.pending: dict[str, set[int]] = {}  # app -> replacements not routed to yet
        self.generations: dict[str, int] = {}  # app -> newest recovery generation
        self.epochs: dict[tuple[str, int], int | None] = {}  # (app, generation) -> its epoch
        # app -> replacements whose senders' and own ROUTING is not confirmed yet (a
        # rollback waits for them: fault_recovery.py)
        self.joining: dict[str, set[int]] = {}
        self.rolled: dict[str, int] = {}  # app -> newest generation rolled back to
        self.region_rolled: dict[tuple[str, int], int] = {}  # (app, worker) -> the same
        self.partials: dict[str, Any] = {}  # app -> PartialRecoveries (partial_recovery.py)
        self.partial_plans: dict[tuple[str, int], Any] = {}  # (app, generation) -> its plan
        # (app, worker) whose METRIC_RESP said its input is done: its port going down is an end
        self.done: set[tuple[str, int]] = set()
        # replies come every metrics_interval: a longer gap without any means we were deaf
        self.heartbeats = Heartbeats(conf.heartbeat_timeout, 2 * metrics_interval)
        self.unheard_logged = 0.0
        self.dead: dict[str, set[int]] = {}  # app -> dead workers whose address drops count
        self.ending: set[tuple[str, int]] = set()  # down after every sender finished: exit?
        self.sink_watch = SinkWatch()  # the sinks' progress: each incident's cost to them

    # ----- events --------------------------------------------------------------------------

    def worker_down(self, app: str, wid: int, host: str, port: int, reason: str, at: float) -> None:
        if not self.conf.port_events:
            self.logger.info(
                "app %s worker %d: port %s/%s %s; port_events = false: left to the heartbeat",
                app, wid, host, port, reason,
            )  # fmt: skip
            return
        self.fail(app, wid, f"port {host}/{port} {reason}", at)

    def metrics(self, app: str, wid: int, metrics: dict[str, Any], at: float) -> None:
        self.heartbeats.seen(app, wid, at)
        self._note_replays(app, wid, metrics)
        self._note_backup(app, wid, metrics)
        self._note_sink(app, wid, metrics, at)
        if metrics.get("done"):
            self.done.add((app, wid))

    def _note_sink(self, app: str, wid: int, metrics: dict[str, Any], at: float) -> None:
        view = self.core.view.apps.get(app)
        if view is None:
            return
        node = next((w.node for w in view.physical.workers if w.worker_id == wid), None)
        if node is not None and not view.topology.outputs_of(node):
            self.sink_watch.note(app, wid, node, metrics, at)

    def judge_sinks(self) -> None:
        """Each recent incident's sinks: their rate before, lowest since, and when they
        were back at 80% of it (``typhoon/sink_rates.py``)."""
        now = self.clock()
        self.sink_watch.forget(self.core.view.apps)
        for i in self.incidents:
            if i.back_at_80_ms is not None or i.state == "failed":
                continue
            if now - i.detected > self.sink_watch.give_up_s + WINDOW_S:
                continue
            view = self.core.view.apps.get(i.app)
            if view is None:
                continue
            if not i.sinks:
                i.sinks = sorted(downstream_sinks(view.topology, i.node))
            back = self.sink_watch.judge(i.app, set(i.sinks), i.detected, now)
            if back is not None:
                i.sink_rate_before, i.sink_rate_lowest = back.before, back.lowest
                if back.after_s is not None:
                    i.back_at_80_ms = back.after_s * 1000

    def tick(self) -> None:
        """The slow timer: heartbeats; dead addresses of applications that are gone; how
        far each incident's sinks are back."""
        try:
            self.judge_sinks()
        except Exception:  # a bug here must not stop detection
            self.logger.exception("judging the sinks' recovery failed")
        for name in set(self.dead) - set(self.core.view.apps):
            del self.dead[name]
            self.core.clear_rules(Source.EXTRA, f"dead-addresses:{name}")
        if self.conf.heartbeat_timeout <= 0:
            return
        try:
            self.check_heartbeats()
        except Exception:  # a bug here must not stop detection by port events
            self.logger.exception("heartbeat check failed")

    def step(self) -> None:
        """The fast timer: resume every task whose wait is over."""
        self.tasks.advance()

    def report(self) -> list[dict[str, Any]]:
        """What died, why, and how long each step took (``GET /typhoon/faults``)."""
        return [i.to_dict() for i in self.incidents]

    # ----- detection -----------------------------------------------------------------------

    def check_heartbeats(self) -> None:
        """Fail every watched worker silent for longer than ``heartbeat_timeout``."""
        now = self.clock()
        core = self.core
        for name in {a for a, _ in self.heartbeats.last} - set(core.view.apps):
            self.heartbeats.forget(name)
        self.done = {k for k in self.done if k[0] in core.view.apps}
        for name, app in core.view.apps.items():
            watched = []
            in_scope = self.scope is None or self.scope(app)
            if in_scope and app.state.get("active") and not app.state.get("drain"):
                watched = [
                    w.worker_id
                    for w in app.physical.workers
                    if w.active
                    and (s := app.statuses.get(w.worker_id)) is not None
                    and (s.state in LIVE or crashed(s.state, s.exit_code))
                ]
            self.heartbeats.watch(name, watched, now)
        stale: dict[str, dict[int, float]] = {}
        if self.heartbeats.unheard_s > self.unheard_logged:
            self.logger.warning(
                "no METRIC_RESP from any worker for %.2f s more than usual (the controller did "
                "not run or hear): not counted as anybody's silence",
                self.heartbeats.unheard_s - self.unheard_logged,
            )
            self.unheard_logged = self.heartbeats.unheard_s
        for name, wid, silent in self.heartbeats.stale(now):
            stale.setdefault(name, {})[wid] = silent
        for name, silent in stale.items():
            app = core.view.apps.get(name)
            held: set[int] = set()
            gone: set[int] = set()  # on a lost host: dead, whatever its senders and receivers
            if app is not None:
                host = {w.worker_id: w.host for w in app.physical.workers}
                lost = self.lost_hosts({host[w] for w in silent if w in host})
                gone = {w for w in silent if host.get(w) in lost}
                for wid in sorted(gone):
                    self.logger.warning(
                        "app %s worker %d: host %s is lost (its switch is gone, its agent "
                        "silent): neither a receiver's back-pressure nor its senders' end "
                        "explains its silence", name, wid, host[wid],
                    )  # fmt: skip
                # dead workers and their replacements until the incident is over: a sender
                # may still wait for the dead one's credit after it was routed elsewhere
                suspect = {
                    w
                    for i in self.incidents
                    if i.app == name and i.state in ("rerouting", "replacing")
                    for w in (i.worker, i.replacement)
                    if w is not None
                } | self.pending.get(name, set())
                held = held_up_by_receivers(app.topology, app.physical, silent, suspect) - gone
            for wid, secs in sorted(silent.items()):
                if wid in held:  # waits for a hung receiver's credit: judge it again later
                    self.heartbeats.restart(name, wid, now)
                    self.logger.info(
                        "app %s worker %d: no METRIC_RESP for %.1f s, but a receiver of it is "
                        "silent or being replaced (credit back-pressure): not treated as dead",
                        name, wid, secs,
                    )  # fmt: skip
                    continue
                unheard = self.heartbeats.excused.get((name, wid), 0.0)
                self.heartbeats.forget(name, wid)
                reason = f"no METRIC_RESP for {secs:.1f} s"
                self.fail(name, wid, reason, now, unheard, died=wid in gone)

    def fail(
        self, name: str, wid: int, reason: str, at: float, unheard_s: float = 0.0, died=False
    ) -> None:
        """React to worker ``wid`` of ``name`` being dead since ``at`` (monotonic).

        ``died``: its agent saw it exit with a failure, or its host is lost (no exit status
        will come), whatever its senders did."""
        core = self.core
        app = core.view.apps.get(name)
        why_not = self._why_not(name, wid, app, core, died)
        if why_not == ENDING and (name, wid) not in self.ending:
            # it may be ending after its senders' end of stream, or have died while it still
            # worked on their last tuples (a Spark batch, a queue): its exit status decides
            self.ending.add((name, wid))
            self.tasks.start(self._after_exit(name, wid, reason, at, unheard_s), self._lost(wid))
        if why_not:
            self.logger.info("app %s worker %d: %s; %s: nothing to do", name, wid, reason, why_not)
            return
        w = app.physical.by_id(wid)
        wall = time.time() - (self.clock() - at)
        incident = Incident(name, wid, w.node, reason, at, wall, host=w.host, unheard_s=unheard_s)
        self.incidents.append(incident)
        self.handled.add((name, wid))
        self.heartbeats.forget(name, wid)
        routes = reroute(app.topology, app.physical, wid, self.pending.get(name, set()))
        # a sender that exited (finished, or died too) has nobody to read the PacketOut
        routes = {
            s: r
            for s, r in routes.items()
            if (st := app.statuses.get(s)) is None or st.state != "exited"
        }
        incident.senders = sorted(routes)
        sent = send_routes(core, name, routes)
        self._count_drops_to(name, app, wid)
        incident.reroute_ms = (self.clock() - at) * 1000
        self.logger.info(
            "app %s worker %d (%s[%d]) is down (%s): treated as dead, ROUTING without it to "
            "senders %s written %.1f ms after detection",
            name, wid, w.node, w.index, reason, incident.senders, incident.reroute_ms,
        )  # fmt: skip
        self.tasks.start(self._follow_up(incident, sent), self._failed(incident))

    def _after_exit(self, name: str, wid: int, reason: str, at: float, unheard_s: float) -> Task:
        code = yield self._exit_code(self.core, name, wid, self.conf.heartbeat_timeout)
        self.ending.discard((name, wid))
        if code not in (0, None):
            why = f"{reason}; exited with {code} before its own end of stream"
            self.fail(name, wid, why, at, unheard_s, died=True)

    def _lost(self, wid: int) -> Callable[[Exception], None]:
        return lambda e: self.logger.error("worker %d: exit not followed", wid, exc_info=e)

    def _why_not(self, name: str, wid: int, app: Any, core: Core, died: bool = False) -> str:
        """A reason to leave this worker alone, or ''."""
        if app is None:
            return "the application is gone"
        if self.scope is not None and not self.scope(app):
            return "no processing guarantee (apps/fault_detector.py fails such workers over)"
        if (name, wid) in self.handled:
            return "already handled"
        try:
            w = app.physical.by_id(wid)
        except KeyError:
            return "not in the physical topology (removed on purpose)"
        if not w.active:
            return "draining: a reconfiguration removes it"
        status = app.statuses.get(wid)
        if status is None or status.state == "starting":
            # its port may show down while the agent adds it; a failed start is reported by
            # the agent (exit status), and a crashed worker stays watched by the heartbeat
            return "not attached yet"
        if app.state.get("drain"):
            return "the application is draining"
        if self._finished(name, wid, app):
            return "it finished its input (end of stream)"
        senders = senders_to(app.topology, app.physical, app.physical.by_id(wid).node)
        if not died and senders and all(self._finished(name, s, app) for s in senders):
            return ENDING
        record = core.reconfiguration(name)
        if record is not None and record.running:
            return f"reconfiguration {record.id} is running and owns the workers"
        # the view lags the coordinator by a poll: a kill removes workers before it shows
        current = core.stored_physical(name)
        if current is None:
            return "the application was killed"
        if wid not in {x.worker_id for x in current.workers if x.active}:
            return "the current physical topology no longer runs it"
        return ""

    def _count_drops_to(self, name: str, app: Any, wid: int) -> None:
        """A drop rule for the dead worker's address on every bridge: what its senders
        still write to it is counted apart (``controller/rules/dead_addresses.py``)."""
        dead = self.dead.setdefault(name, set())
        dead.add(wid)
        hosts = self.core.view.cluster.hosts
        rules = dead_address_rules(app.physical.app_id, sorted(dead), hosts)
        self.core.set_rules(Source.EXTRA, f"dead-addresses:{name}", rules)

    def _finished(self, name: str, wid: int, app: Any) -> bool:
        """Its METRIC_RESP said ``done``, or its agent saw it exit with code 0."""
        s = app.statuses.get(wid)
        return (name, wid) in self.done or (
            s is not None and s.state == "exited" and s.exit_code == 0
        )
