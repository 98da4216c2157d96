"""Fault detector (paper §4, §6.2 Fig. 10): ``ryu-manager apps/fault_detector.py``.

A worker's TAP vanishes from its bridge when its process dies, and the switch
says so within milliseconds (OFPPortStatus, raised by the core as
``EventWorkerDown``).  The app then, in this order:

1. sends ROUTING to the dead worker's senders with routes that leave it out
   (``controller/fault_detector.py``), right in the event handler: every tuple a sender
   writes to the dead port until then is lost, so this is the step timed
   (``reroute_ms``, from the port event to the last PacketOut written);
   the load-balancer app drops the worker from its select group on the same
   event; the senders' acks are awaited in a green thread (``reroute_acked_ms``);
2. waits (``confirm_timeout``) for the agent's exit status: a worker that
   ended with code 0 finished its input and is left alone; otherwise the
   manager writes a physical topology without it and with a replacement of the
   same node and index (fresh ID, placed by the scheduler's ``reschedule``), and
   one UPSTREAM tells the receivers to expect the replacement instead;
3. once the agent reports the replacement attached and the switches hold its
   rules, sends ROUTING with it to the senders (a replaced source is ACTIVATEd).

The fallback: a worker whose METRIC_RESP stopped arriving for
``heartbeat_timeout`` seconds is handled the same way (its agent stops it when
the new physical topology leaves it out), unless a receiver of it is silent or
being failed over too: a sender waiting for a hung receiver's credit does not
answer either, and only the receiver is dead.  Silence counts only while
other workers are heard (``controller/fault_detector.py``, ``Heartbeats``): a stalled
controller has heard nobody.  A worker its agent saw crash
(non-zero exit) stays watched, so a missed port event is still caught.  With
``port_events = false`` the heartbeat is the only detector: the Storm-like
baseline the benchmarks compare port events against (paper Fig. 10).

Updates of an application the reconfiguration executor is changing are left
to the executor, and so are workers that end normally: a port that goes down
after the worker's METRIC_RESP said ``done``, or whose agent reports exit code
0, is an end of stream.

Every decision is logged with its reason; ``GET /typhoon/faults`` lists the
incidents with their times.

Settings: section ``[fault_detector]`` of the Ryu config file, declared once by
``FaultSettings`` in ``controller/fault_detector.py``
(``controller/settings.py``); the table is in ``docs/fault_detector.md``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from controller.app_support import EventTick, list_rest, start_ticks
from controller.events import EventWorkerDown, EventWorkerMetrics
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
)
from controller.options import read_settings, register_settings
from controller.ryu_compat import (
    RyuApp,
    WSGIApplication,
    hub,
    ofproto_v1_3,
    require_app,
    set_ev_cls,
)
from controller.services import Services, services
from controller.settings import CoreSettings
from typhoon.checkpoint import CheckpointError, open_store
from typhoon.checkpoint.progress import guaranteed, recovery_point
from typhoon.topology.routing import Route, routes_for
from typhoon.wire import Control, ControlTuple

require_app("controller.core")

register_settings(FaultSettings)

TICK_S = 0.5
REST = list_rest("faults")
POLL_S = 0.01
LIVE = ("attached", "running")


class FaultDetector(RyuApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"wsgi": WSGIApplication}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conf = read_settings(FaultSettings)
        self.incidents: list[Incident] = []
        self.handled: set[tuple[str, int]] = set()  # (app, worker) already failed over
        self.pending: dict[str, set[int]] = {}  # app -> replacements not routed to yet
        self.generations: dict[str, int] = {}  # app -> newest recovery generation
        # (app, worker) whose METRIC_RESP said its input is done: its port going down is an end
        self.done: set[tuple[str, int]] = set()
        # replies come every metrics_interval: a longer gap without any means we were deaf
        quiet = 2 * read_settings(CoreSettings).metrics_interval
        self.heartbeats = Heartbeats(self.conf.heartbeat_timeout, quiet)
        self.unheard_logged = 0.0
        kwargs["wsgi"].register(REST, {"app": self})
        start_ticks(self, TICK_S)
        self.threads.append(hub.spawn(self._resume_recoveries))
        self.logger.info(
            "fault detector ready: heartbeat_timeout=%g s confirm_timeout=%g s replace=%s "
            "port_events=%s",
            self.conf.heartbeat_timeout, self.conf.confirm_timeout, self.conf.replace,
            self.conf.port_events,
        )  # fmt: skip

    @staticmethod
    def core() -> Services:
        """The controller core's services (looked up on use: Ryu may start it after this app)."""
        return services()

    # ----- detection -----------------------------------------------------------------------

    @set_ev_cls(EventWorkerDown)
    def _worker_down(self, ev):
        if not self.conf.port_events:
            self.logger.info(
                "app %s worker %d: port %s/%s %s; port_events = false: left to the heartbeat",
                ev.app, ev.worker_id, ev.host, ev.port, ev.reason,
            )  # fmt: skip
            return
        self.fail(ev.app, ev.worker_id, f"port {ev.host}/{ev.port} {ev.reason}", ev.at)

    @set_ev_cls(EventWorkerMetrics)
    def _metrics(self, ev):
        self.heartbeats.seen(ev.app, ev.worker_id, ev.at)
        if ev.metrics.get("done"):
            self.done.add((ev.app, ev.worker_id))

    @set_ev_cls(EventTick)
    def _tick(self, ev):
        if self.conf.heartbeat_timeout <= 0:
            return
        try:
            self._check_heartbeats()
        except Exception:  # a bug here must not stop detection by port events
            self.logger.exception("heartbeat check failed")

    def report(self) -> list[dict[str, Any]]:
        """What died, why, and how long each step took (``GET /typhoon/faults``)."""
        return [i.to_dict() for i in self.incidents]

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        core = self.core()
        for name in {a for a, _ in self.heartbeats.last} - set(core.view.apps):
            self.heartbeats.forget(name)
        self.done = {k for k in self.done if k[0] in core.view.apps}
        for name, app in core.view.apps.items():
            watched = []
            if app.state.get("active") and not app.state.get("drain"):
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

    # ----- step 1: reroute at once ---------------------------------------------------------

    def fail(self, name: str, wid: int, reason: str, at: float, unheard_s: float = 0.0) -> None:
        """React to worker ``wid`` of ``name`` being dead since ``at`` (monotonic)."""
        core = self.core()
        app = core.view.apps.get(name)
        why_not = self._why_not(name, wid, app, core)
        if why_not:
            self.logger.info("app %s worker %d: %s; %s: nothing to do", name, wid, reason, why_not)
            return
        w = app.physical.by_id(wid)
        wall = time.time() - (time.monotonic() - at)
        incident = Incident(name, wid, w.node, reason, at, wall, unheard_s=unheard_s)
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
        sent = self._send_routes(core, name, routes)
        incident.reroute_ms = (time.monotonic() - at) * 1000
        self.logger.info(
            "app %s worker %d (%s[%d]) is down (%s): treated as dead, ROUTING without it to "
            "senders %s written %.1f ms after detection",
            name, wid, w.node, w.index, reason, incident.senders, incident.reroute_ms,
        )  # fmt: skip
        hub.spawn(self._follow_up, incident, sent)

    def _why_not(self, name: str, wid: int, app: Any, core: Any) -> str:
        """A reason to leave this worker alone, or ''."""
        if app is None:
            return "the application is gone"
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
        if senders and all(self._finished(name, s, app) for s in senders):
            return "every sender of it finished: it ends after their end of stream"
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

    def _follow_up(self, incident: Incident, sent: dict[tuple[int, int], int]) -> None:
        """The slow part, off the event loop: acks, the replacement, its rejoin."""
        try:
            self._follow_up_steps(incident, sent)
        except Exception as e:  # report it in the incident, never kill the app
            incident.state, incident.detail = "failed", f"{type(e).__name__}: {e}"
            self.logger.exception(
                "app %s worker %d: failover failed", incident.app, incident.worker
            )

    def _follow_up_steps(self, incident: Incident, sent: dict[tuple[int, int], int]) -> None:
        core, name, wid = self.core(), incident.app, incident.worker
        problem = self._acked(core, name, "ROUTING", sent)
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
        code = self._exit_code(core, name, wid)
        incident.exit_code = code
        if code == 0:
            incident.state = "finished"
            self.logger.info(
                "app %s worker %d exited with code 0: it finished its input, not replaced "
                "(the reroute only dropped a receiver that had ended)",
                name, wid,
            )  # fmt: skip
            return
        new = self._replace(core, incident)
        if new is not None:
            self._rejoin(core, incident, new)

    def _exit_code(self, core: Any, name: str, wid: int) -> int | None:
        """The agent's exit code for ``wid``, waiting up to ``confirm_timeout``; None if unknown."""
        deadline = time.monotonic() + self.conf.confirm_timeout
        while time.monotonic() < deadline:
            app = core.view.apps.get(name)
            s = app.statuses.get(wid) if app else None
            if s is not None and s.state == "exited":
                return s.exit_code
            hub.sleep(POLL_S)
        return None

    def _replace(self, core: Any, incident: Incident) -> int | None:
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
        plan = failover(
            topology, physical, wid, place.hosts, place.first_port,
            avoid=place.avoid, min_id=place.min_id, pending=pending,
        )  # fmt: skip
        progress = core.job_progress(name)
        if progress is not None and progress.completed_generation == physical.generation:
            incident.state, incident.detail = "finished", "the job was complete: not replaced"
            self.logger.info("app %s worker %d: %s", name, wid, incident.detail)
            return None
        if guaranteed(topology):
            after = max(physical.generation, self.generations.get(name, 0))
            plan = dataclasses.replace(
                plan, physical=self._recovery(topology, plan.physical, after, incident)
            )
            self.generations[name] = plan.physical.generation
        core.update_physical(name, plan.physical)
        pending.add(plan.replacement)
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
        problem = self._acked(core, name, "UPSTREAM", self._send(core, name, "UPSTREAM", bodies))
        if problem:
            self.logger.warning("app %s: receivers did not confirm UPSTREAM: %s", name, problem)
        return plan.replacement

    def _rejoin(self, core: Any, incident: Incident, new: int) -> None:
        """Once ``new`` is attached and its rules are in, its senders route to it again."""
        name = incident.app
        deadline = time.monotonic() + self.conf.attach_timeout
        while True:
            app = core.view.apps.get(name)
            if app is None:
                incident.state, incident.detail = "failed", "the application was killed"
                return
            s = app.statuses.get(new)
            if s is not None and s.state == "exited":
                incident.state = "failed"
                incident.detail = f"replacement {new} exited: {s.error or s.exit_code}"
                self.logger.error("app %s: %s", name, incident.detail)
                self.pending.get(name, set()).discard(new)
                return
            if s is not None and s.state in LIVE and core.rules_ready(name, app.physical.version):
                break
            if time.monotonic() > deadline:
                incident.state = "failed"
                incident.detail = f"replacement {new} not attached in {self.conf.attach_timeout} s"
                self.logger.error("app %s: %s", name, incident.detail)
                return
            hub.sleep(POLL_S)
        pending = self.pending.setdefault(name, set())
        pending.discard(new)
        gone = {w for a, w in self.handled if a == name}
        plan = rejoin(app.topology, app.physical, new, pending, gone)
        sent = self._send(core, name, "UPSTREAM", {new: plan.upstream})
        problem = self._acked(core, name, "UPSTREAM", sent)
        if problem:
            self.logger.warning("app %s worker %d: UPSTREAM not confirmed: %s", name, new, problem)
        routes = {
            s: r
            for s, r in plan.routes.items()
            if (st := app.statuses.get(s)) is None or st.state != "exited"
        }
        problem = self._acked(core, name, "ROUTING", self._send_routes(core, name, routes))
        w = app.physical.by_id(new)
        if w.node in {n.name for n in app.topology.spouts()}:
            core.send_control(name, [new], ControlTuple(Control.ACTIVATE, {}))
        if incident.generation is not None:
            problem = self._rollback(core, incident, app, new) or problem
        incident.rejoined_ms = self._since(incident)
        incident.state = "rejoined"
        incident.detail = problem
        self.logger.info(
            "app %s worker %d attached: senders %s route to it again (%s), %.1f ms after the "
            "detection of worker %d",
            name, new, sorted(routes), problem or "confirmed", incident.rejoined_ms,
            incident.worker,
        )  # fmt: skip

    # ----- guaranteed processing: every worker back to the last global checkpoint ----------

    def _recovery(self, topology: Any, physical: Any, after: int, incident: Incident) -> Any:
        """The replacement's physical topology starts a new generation (after every one
        used so far) from the newest global checkpoint whose parts all verify (a corrupt
        one: the one before)."""
        generation = after + 1
        try:
            store = open_store(topology.config.get("checkpoint_store"), topology.name)
            epoch = recovery_point(physical, store)
        except CheckpointError as e:
            # no store: start over from the beginning, which is still exactly once
            self.logger.error(
                "app %s: checkpoint store: %s; rolling back to the start", topology.name, e
            )
            epoch = None
        incident.generation, incident.restore_epoch = generation, epoch
        self.logger.info(
            "app %s worker %d: recovery as generation %d from checkpoint %s",
            topology.name, incident.worker, generation, epoch,
        )  # fmt: skip
        return dataclasses.replace(physical, generation=generation, restore_epoch=epoch)

    def _resume_recoveries(self) -> None:
        """After a controller restart: a guaranteed app whose physical topology is in a
        recovery generation may have a replacement nobody routes to yet (the restart
        came between its start and its rejoin).  Once every worker is attached, every
        sender gets its routes from the physical topology again (harmless if they are
        already those); the core then rolls back whoever is in an older generation."""
        hub.sleep(1.0)  # the core reads the coordinator first
        core = self.core()
        for name, app in list(core.view.apps.items()):
            if not guaranteed(app.topology) or app.physical.generation == 0:
                continue
            self.generations[name] = max(self.generations.get(name, 0), app.physical.generation)
            try:
                self._reroute_all(core, name)
            except Exception:  # never kill the app over one application
                self.logger.exception("app %s: resuming its recovery failed", name)

    def _reroute_all(self, core: Any, name: str) -> None:
        deadline = time.monotonic() + self.conf.attach_timeout
        while True:
            app = core.view.apps.get(name)
            if app is None:
                return
            if app.all_attached() and core.rules_ready(name, app.physical.version):
                break
            if time.monotonic() > deadline:
                self.logger.warning("app %s: not every worker attached; routes not resent", name)
                return
            hub.sleep(0.1)
        routes = {
            w.worker_id: routes_for(app.topology, app.physical, w.worker_id)
            for w in app.physical.workers
            if w.active and app.topology.outputs_of(w.node)
        }
        problem = self._acked(core, name, "ROUTING", self._send_routes(core, name, routes))
        self.logger.info(
            "app %s: generation %d after a controller restart: routes resent to %s (%s)",
            name, app.physical.generation, sorted(routes), problem or "confirmed",
        )  # fmt: skip

    def _rollback(self, core: Any, incident: Incident, app: Any, new: int) -> str:
        """ROLLBACK to every live worker but the replacement (which started restored)."""
        name, gen = incident.app, incident.generation
        epoch = -1 if incident.restore_epoch is None else incident.restore_epoch
        sent = {}
        for w in app.physical.workers:
            s = app.statuses.get(w.worker_id)
            if w.worker_id == new or (s is not None and s.state == "exited"):
                continue
            body = {"generation": gen, "epoch": epoch}
            core.send_control(name, [w.worker_id], ControlTuple(Control.ROLLBACK, body))
            sent[(w.worker_id, gen)] = w.worker_id
        problem = self._acked(core, name, "ROLLBACK", sent)
        incident.rolled_back_ms = self._since(incident)
        self.logger.info(
            "app %s: workers %s rolled back to checkpoint %s as generation %d (%s), %.1f ms "
            "after the detection of worker %d",
            name, sorted(sent.values()), incident.restore_epoch, gen, problem or "confirmed",
            incident.rolled_back_ms, incident.worker,
        )  # fmt: skip
        return problem

    # ----- control tuples ------------------------------------------------------------------

    def _send_routes(
        self, core: Any, name: str, routes: dict[int, list[Route]]
    ) -> dict[tuple[int, int], int]:
        bodies = [(s, r.to_body()) for s, rs in routes.items() for r in rs]
        return self._send(core, name, "ROUTING", bodies)

    def _send(self, core: Any, name: str, ctype: str, bodies: Any) -> dict[tuple[int, int], int]:
        """One control tuple per (worker, body), each with a fresh version: what to await."""
        items = bodies.items() if isinstance(bodies, dict) else bodies
        sent = {}
        for w, body in items:
            v = core.next_control_version()
            core.send_control(name, [w], ControlTuple(Control[ctype], {**body, "version": v}))
            sent[(w, v)] = w
        return sent

    def _acked(self, core: Any, name: str, ctype: str, sent: dict[tuple[int, int], int]) -> str:
        """Wait until every sent tuple is acked; '' or what is missing after ``ack_timeout``.

        A worker that exited meanwhile counts as done: it reads nothing any more.
        """
        deadline = time.monotonic() + self.conf.ack_timeout
        pending = dict(sent)
        while pending:
            app = core.view.apps.get(name)
            if app is None:
                return "the application is gone"
            for w, v in list(pending):
                s = app.statuses.get(w)
                if w in core.acked(name, ctype, v) or (s is not None and s.state == "exited"):
                    del pending[(w, v)]
            if pending and time.monotonic() > deadline:
                return f"workers {sorted(set(pending.values()))} did not confirm {ctype}"
            if pending:
                hub.sleep(POLL_S)
        return ""

    def _finished(self, name: str, wid: int, app: Any) -> bool:
        """Its METRIC_RESP said ``done``, or its agent saw it exit with code 0."""
        s = app.statuses.get(wid)
        return (name, wid) in self.done or (
            s is not None and s.state == "exited" and s.exit_code == 0
        )

    @staticmethod
    def _since(incident: Incident) -> float:
        return (time.monotonic() - incident.detected) * 1000
