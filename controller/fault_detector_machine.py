"""The fault detector's state machine (``apps/fault_detector.py`` is its Ryu shell).

Fed with events (a worker's port went down, a METRIC_RESP, a timer) and the
time, it decides and acts through the controller's services
(``controller/services.py``); the decisions themselves are the pure functions
of ``controller/fault_detector.py``.  A dead worker is handled in steps:

1. ``fail``: ROUTING without it to its senders, at once, in the event handler
   (every tuple written to the dead port until then is lost);
2. a task (``controller/waits.py``) awaits the senders' acks and the agent's
   exit status, writes the physical topology with a replacement, tells the
   receivers (UPSTREAM) and awaits their acks;
3. once the replacement is attached and its rules are in: UPSTREAM to the
   replacement first (its senders as they are now), then ROUTING with it to
   its senders, ACTIVATE for a source, ROLLBACK under a processing guarantee
   (the recovery generation, ROLLBACK and resuming after a controller restart
   are in ``controller/fault_recovery.py``).

The waits are checks the app's timer asks (``step``), never sleeps, so every
change happens on the app's event loop and the unit tests drive it with a
fake clock and a fake core.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Generator
from typing import Any, Protocol

from controller import acks
from controller.acks import send_each, send_routes
from controller.composer import Source
from controller.dead_addresses import dead_address_rules
from controller.fault_detector import (
    FaultSettings,
    Heartbeats,
    Incident,
    crashed,
    failover,
    held_up_by_receivers,
    rejoin,
    reroute,
    senders_to,
    silent_host,
)
from controller.fault_recovery import GuaranteedRecovery
from controller.waits import WAIT, Check, Task, Tasks
from typhoon.checkpoint.progress import guaranteed
from typhoon.wire import Control, ControlTuple

LIVE = ("attached", "running")


ENDING = "every sender of it finished: it ends after their end of stream, or its exit says"


class Core(acks.Core, Protocol):
    """What the machine needs of the controller (``controller/services.py`` has it)."""

    def rules_ready(self, app: str, version: int) -> bool: ...
    def reconfiguration(self, app: str) -> Any: ...
    def stored_topology(self, app: str) -> Any: ...
    def stored_physical(self, app: str) -> Any: ...
    def placement(self, app: str) -> Any: ...
    def update_physical(self, app: str, physical: Any) -> Any: ...
    def job_progress(self, app: str) -> Any: ...
    def agent(self, host: str) -> Any: ...
    def set_rules(self, source: Any, owner: str, value: Any) -> None: ...
    def clear_rules(self, source: Any, owner: str) -> None: ...


class FaultMachine(GuaranteedRecovery):
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
        # (app, worker) whose METRIC_RESP said its input is done: its port going down is an end
        self.done: set[tuple[str, int]] = set()
        # replies come every metrics_interval: a longer gap without any means we were deaf
        self.heartbeats = Heartbeats(conf.heartbeat_timeout, 2 * metrics_interval)
        self.unheard_logged = 0.0
        self.dead: dict[str, set[int]] = {}  # app -> dead workers whose address drops count
        self.ending: set[tuple[str, int]] = set()  # down after every sender finished: exit?

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
        if metrics.get("done"):
            self.done.add((app, wid))

    def tick(self) -> None:
        """The slow timer: heartbeats; dead addresses of applications that are gone."""
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
            held = set()
            if app is not None:
                # dead workers and their replacements until the incident is over: a sender
                # may still wait for the dead one's credit after it was routed elsewhere
                suspect = {
                    w
                    for i in self.incidents
                    if i.app == name and i.state in ("rerouting", "replacing")
                    for w in (i.worker, i.replacement)
                    if w is not None
                } | self.pending.get(name, set())
                held = held_up_by_receivers(app.topology, app.physical, silent, suspect)
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
                self.fail(name, wid, f"no METRIC_RESP for {secs:.1f} s", now, unheard)

    def fail(
        self, name: str, wid: int, reason: str, at: float, unheard_s: float = 0.0, died=False
    ) -> None:
        """React to worker ``wid`` of ``name`` being dead since ``at`` (monotonic).

        ``died``: its agent saw it exit with a failure, whatever its senders did."""
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

    # ----- steps 2 and 3: replace, then route to the replacement ---------------------------

    def _failed(self, incident: Incident) -> Callable[[Exception], None]:
        def report(e: Exception) -> None:  # in the incident; never kill the app
            incident.state, incident.detail = "failed", f"{type(e).__name__}: {e}"
            self.logger.error(
                "app %s worker %d: failover failed", incident.app, incident.worker, exc_info=e
            )

        return report

    def _follow_up(self, incident: Incident, sent: dict[tuple[int, int], int]) -> Task:
        """The slow part, off the event handler: acks, the replacement, its rejoin."""
        core, name, wid = self.core, incident.app, incident.worker
        problem = yield self._acked(core, name, "ROUTING", sent)
        incident.reroute_acked_ms = self._since(incident)
        if problem:
            self.logger.warning("app %s worker %d: reroute not confirmed: %s", name, wid, problem)
        else:
            self.logger.info(
                "app %s worker %d: senders %s confirmed the reroute (or exited) %.1f ms after "
                "detection",
                name, wid, incident.senders, incident.reroute_acked_ms,
            )  # fmt: skip
        if not self.conf.replace:
            incident.state = "rerouted"
            self.logger.info("app %s worker %d: not replaced (replace = false)", name, wid)
            return
        code = yield self._exit_code(core, name, wid)
        incident.exit_code = code
        if code == 0:
            incident.state = "finished"
            self.logger.info(
                "app %s worker %d exited with code 0: it finished its input, not replaced "
                "(the reroute only dropped a receiver that had ended)",
                name, wid,
            )  # fmt: skip
            return
        new = yield from self._replace(core, incident)
        if new is not None:
            yield from self._rejoin(core, incident, new)

    def _exit_code(self, core: Core, name: str, wid: int, timeout: float | None = None) -> Check:
        """The agent's exit code for ``wid`` within ``timeout`` (``confirm_timeout``); None
        if unknown."""
        deadline = self.clock() + (self.conf.confirm_timeout if timeout is None else timeout)

        def check(now: float) -> Any:
            if now >= deadline:
                return None
            app = core.view.apps.get(name)
            s = app.statuses.get(wid) if app else None
            if s is not None and s.state == "exited":
                return s.exit_code
            return WAIT

        return check

    def _replace(self, core: Core, incident: Incident) -> Generator[Check, Any, int | None]:
        """Write the physical topology with a replacement; UPSTREAM to the receivers."""
        name, wid = incident.app, incident.worker
        record = core.reconfiguration(name)
        if record is not None and record.running:
            incident.state = "failed"
            incident.detail = f"reconfiguration {record.id} started meanwhile: not replaced"
            self.logger.warning("app %s worker %d: %s", name, wid, incident.detail)
            return None
        topology = core.stored_topology(name)
        physical = core.stored_physical(name)
        if topology is None or physical is None:
            incident.state, incident.detail = "failed", "the application was killed"
            return None
        place = core.placement(name)
        pending = self.pending.setdefault(name, set())
        host = physical.by_id(wid).host
        closed = silent_host(incident.reason, incident.exit_code, host)
        if core.agent(host) is None:  # its agent's record is gone: the machine is lost
            closed = [host]
            incident.detail = f"host {host} is gone (no agent): replaced elsewhere"
            self.logger.warning("app %s worker %d: %s", name, wid, incident.detail)
        plan = failover(
            topology, physical, wid, place.hosts, place.first_port,
            avoid=place.avoid, min_id=place.min_id, pending=pending, closed=closed,
        )  # fmt: skip
        progress = core.job_progress(name)
        if progress is not None and progress.completed_generation == physical.generation:
            incident.state, incident.detail = "finished", "the job was complete: not replaced"
            self.logger.info("app %s worker %d: %s", name, wid, incident.detail)
            return None
        if guaranteed(topology):
            after = max(physical.generation, self.generations.get(name, 0))
            plan = dataclasses.replace(
                plan,
                physical=self._recovery(topology, plan.physical, after, incident, plan.replacement),
            )
            self.generations[name] = plan.physical.generation
        core.update_physical(name, plan.physical)
        pending.add(plan.replacement)
        self.joining.setdefault(name, set()).add(plan.replacement)
        new = plan.physical.by_id(plan.replacement)
        incident.replacement, incident.state = plan.replacement, "replacing"
        incident.replaced_ms = self._since(incident)
        self.logger.info(
            "app %s worker %d: exit code %s; replacement worker %d (%s[%d]) on %s port %d "
            "written as physical version %d, %.1f ms after detection",
            name, wid, incident.exit_code, new.worker_id, new.node, new.index, new.host,
            new.port, plan.physical.version, incident.replaced_ms,
        )  # fmt: skip
        bodies = {r: {"add": [new.worker_id], "remove": [wid]} for r in plan.receivers}
        sent = send_each(core, name, "UPSTREAM", bodies)
        problem = yield self._acked(core, name, "UPSTREAM", sent)
        if problem:
            self.logger.warning("app %s: receivers did not confirm UPSTREAM: %s", name, problem)
        return plan.replacement

    def _rejoin(self, core: Core, incident: Incident, new: int) -> Task:
        """Once ``new`` is attached and its rules are in, its senders route to it again."""
        name = incident.app
        deadline = self.clock() + self.conf.attach_timeout

        def attached(now: float) -> Any:
            app = core.view.apps.get(name)
            if app is None:
                incident.state, incident.detail = "failed", "the application was killed"
                return None
            s = app.statuses.get(new)
            if s is not None and s.state == "exited":
                incident.state = "failed"
                incident.detail = f"replacement {new} exited: {s.error or s.exit_code}"
                self.logger.error("app %s: %s", name, incident.detail)
                self.pending.get(name, set()).discard(new)
                return None
            if s is not None and s.state in LIVE and core.rules_ready(name, app.physical.version):
                return app
            if now > deadline:
                incident.state = "failed"
                incident.detail = f"replacement {new} not attached in {self.conf.attach_timeout} s"
                self.logger.error("app %s: %s", name, incident.detail)
                return None
            return WAIT

        app = yield attached
        if app is None:
            self.joining.get(name, set()).discard(new)
            return
        pending = self.pending.setdefault(name, set())
        pending.discard(new)
        gone = {w for a, w in self.handled if a == name}
        plan = rejoin(app.topology, app.physical, new, pending, gone)
        sent = send_each(core, name, "UPSTREAM", {new: plan.upstream})
        problem = yield self._acked(core, name, "UPSTREAM", sent)
        if problem:
            self.logger.warning("app %s worker %d: UPSTREAM not confirmed: %s", name, new, problem)
        routes = {
            s: r
            for s, r in plan.routes.items()
            if (st := app.statuses.get(s)) is None or st.state != "exited"
        }
        problem = yield self._acked(core, name, "ROUTING", send_routes(core, name, routes))
        self.joining.get(name, set()).discard(new)  # routed to, and routing with its peers
        w = app.physical.by_id(new)
        if incident.generation is not None:
            problem = (yield from self._rollback(core, incident, app, new)) or problem
        if w.node in {n.name for n in app.topology.spouts()}:
            # after the rollback: a replaced source's first tuples carry its generation's
            # mark, which rolls its receivers back before every replacement is routed to
            core.send_control(name, [new], ControlTuple(Control.ACTIVATE, {}))
        incident.rejoined_ms = self._since(incident)
        incident.state = "rejoined"
        incident.detail = "; ".join(x for x in (incident.detail, problem) if x)
        self.logger.info(
            "app %s worker %d attached: senders %s route to it again (%s), %.1f ms after the "
            "detection of worker %d",
            name, new, sorted(routes), problem or "confirmed", incident.rejoined_ms,
            incident.worker,
        )  # fmt: skip

    def _count_drops_to(self, name: str, app: Any, wid: int) -> None:
        """A drop rule for the dead worker's address on every bridge: what its senders
        still write to it is counted apart (``controller/dead_addresses.py``)."""
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
