"""Live debugger (paper §4, §6.2 Fig. 12, Table 5): ``ryu-manager apps/live_debugger.py``.

``typhoon debug attach NAME WORKER`` asks this app (REST, controller/debugging/debug_rest.py)
to observe one worker's input, output or both.  The app writes a session key
for the worker's host; that host's agent starts a debug worker and plugs its
TAP into the bridge; when the switch reports the new port up, the app adds a
mirror output toward it to the rules that carry the observed traffic
(``controller/rules/mirror.py``, applied by the core as a rule overlay, so mirrors
follow topology changes).  The switch copies the frames: the observed worker
serializes and sends nothing extra.  The debug worker decodes, filters and
samples the copies and posts them back here, to a per-session ring buffer the
CLI reads.  Detach (or any ending) drops the overlay, so the next reconcile puts
the original rules back, and deletes the key, so the agent stops the worker.

Settings: section ``[live_debugger]`` of the Ryu config file, declared once by
``Limits`` in ``controller/debugging/debugger.py``
(``controller/settings.py``); the table is in ``docs/live_debugger.md``.
"""

from __future__ import annotations

import hmac
import secrets
import time
from typing import Any

from controller.app_support import EventTick, TyphoonApp, start_ticks
from controller.debugging.debug_rest import DebugRest
from controller.debugging.debugger import DebugError, DebugSessions, Limits, Session, resolve_worker
from controller.events import EventTopologyChanged
from controller.framework.ryu_compat import (
    MAIN_DISPATCHER,
    hub,
    ofp_event,
    require_app,
    set_ev_cls,
)
from controller.options import read_settings, register_settings
from controller.rules.cookies import describe
from controller.rules.meters import meter_id, sampling_meter
from controller.rules.mirror import apply_mirrors, mirrored
from controller.services import Services, Source, services
from controller.settings import CoreSettings
from typhoon.reconfig import ReconfigError
from typhoon.reconfig.requests import Unchain
from typhoon.topology.chaining import observed_calls

require_app("controller.core")

register_settings(Limits)

OWNER = "live_debugger"
TICK_S = 0.2
SWITCH_STATS_S = 1.0  # how often the meters' and debug ports' counters are read
UNCHAIN_S = 60.0  # longest an attach waits for the edges it watches to be unchained


def limits_from_conf() -> Limits:
    """The ``[live_debugger]`` settings (an empty ``report_url``: records come through the
    coordinator, ``typhoon/debug/transport.py``)."""
    return read_settings(Limits)


class LiveDebugger(TyphoonApp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sessions = DebugSessions(limits_from_conf())
        self.cleaned = False
        self.stats_asked = 0.0
        kwargs["wsgi"].register(
            DebugRest,
            {"debugger": self, "core": self, "token": read_settings(CoreSettings).api_token},
        )
        start_ticks(self, TICK_S)
        self.logger.info("live debugger ready: %s", self.sessions.limits)

    @staticmethod
    def core() -> Services:
        """The controller core's services (looked up on use: Ryu may start it after this app)."""
        return services()

    # ----- requests (from debug_rest) ------------------------------------------------------

    def attach(self, name: str, request: dict[str, Any]) -> dict[str, Any]:
        app = self.core().view.apps.get(name)
        if app is None:
            raise DebugError(404, f"no application named '{name}'")
        w = resolve_worker(app.physical, request.get("worker"))
        status = app.statuses.get(w.worker_id)
        if status is None or status.state not in ("attached", "running"):
            state = status.state if status else "not started"
            raise DebugError(409, f"worker {w.worker_id} is {state}: nothing to observe")
        host = self.core().view.cluster.hosts.get(w.host)
        if host is None:
            raise DebugError(409, f"worker {w.worker_id} is on unknown host {w.host}")
        direction = request.get("direction", "out")
        calls = observed_calls(app.topology, app.physical, w.worker_id, str(direction))
        if calls:  # function calls carry no frame to copy: unchain them live first
            app = self._unchain(name, w)
        session = self.sessions.plan(
            name, app.topology, app.physical, w, host.dpid, self._ports_on(w.host), request,
            secrets.token_hex(3), secrets.token_hex(16), time.monotonic(),
        )  # fmt: skip
        self.core().put_debug_session(session.spec)
        s = session.spec
        self.logger.info(
            "session %s: attach to %s worker %d (%s[%d]) %s, filter %r, sample %g%%, ring %d: "
            "asked the agent of %s for a debug worker on port %d",
            s.session, name, w.worker_id, w.node, w.index, s.direction, s.filter, s.sample,
            session.ring_size, s.host, s.port,
        )  # fmt: skip
        return {**session.to_dict(), "unchained": sorted(b for _, b in calls)}

    def _unchain(self, name: str, w: Any) -> Any:
        """Put the chained edges of ``w``'s node in ``w``'s chain instance on the network
        (``typhoon unchain NAME NODE --worker W``, a stable update; they stay so after
        the session) and return the application's view once the update is done."""
        what = f"watching worker {w.worker_id} needs its chained edges on the network"
        try:
            record = self.core().reconfigure(name, Unchain(w.node, w.worker_id))
        except ReconfigError as e:
            raise DebugError(e.status, f"{what}, and unchaining them failed: {e.message}") from None
        deadline = time.monotonic() + UNCHAIN_S
        while record.running and time.monotonic() < deadline:
            hub.sleep(0.05)
        if record.state != "done":
            state = "is still running" if record.running else f"ended {record.state}"
            raise DebugError(409, f"{what}, and unchaining them {state}: {record.error}")
        self.logger.info("%s: unchained %s live for the debugger", name, w.node)
        app = self.core().view.apps.get(name)
        if app is None:
            raise DebugError(404, f"no application named '{name}'")
        return app

    def list_sessions(self, name: str) -> list[dict[str, Any]]:
        found = [s.to_dict() for s in self.sessions.sessions.values() if s.spec.app == name]
        if not found and name not in self.core().view.apps:
            raise DebugError(404, f"no application named '{name}'")
        return found

    def session_status(self, name: str, sid: str) -> dict[str, Any]:
        session = self.sessions.get(name, sid)
        session.last_read = time.monotonic()
        return session.to_dict()

    def detach(self, name: str, sid: str) -> dict[str, Any]:
        session = self.sessions.get(name, sid)
        self.end(session, "detached on request")
        return session.to_dict()

    def read(self, name: str, sid: str, after: int, limit: int) -> dict[str, Any]:
        session = self.sessions.get(name, sid)
        session.last_read = time.monotonic()
        return session.read(after, limit)

    def receive(self, sid: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
        """A batch from a debug worker; 410 tells it the session ended."""
        session = self.sessions.sessions.get(sid)
        if session is None:
            raise DebugError(404, f"no debug session '{sid}'")
        if not hmac.compare_digest(key.encode(), session.spec.key.encode()):
            raise DebugError(403, "wrong session key")
        self._ingest(session, body)
        if session.state == "ended":
            raise DebugError(410, f"session {sid} ended: {session.reason}")
        return {"ok": True}

    def _ingest(self, session: Session, body: dict[str, Any]) -> None:
        """One batch (records, statistics, error) from the session's debug worker."""
        records = body.get("records", [])
        if not isinstance(records, list) or not isinstance(body.get("stats", {}), dict):
            raise DebugError(400, "'records' must be a list and 'stats' an object")
        session.heard = time.monotonic()
        session.ingest([r for r in records if isinstance(r, dict)])
        session.stats = body.get("stats") or session.stats
        if body.get("error"):
            session.error = str(body["error"])
            self.end(session, f"debug worker failed: {session.error}")

    def _collect(self, session: Session) -> None:
        """Batches the debug worker wrote to the coordinator, and a failure it reported."""
        batches, session.next_batch, error = self.core().take_debug_batches(
            session.id, session.next_batch
        )
        for body in batches:
            try:
                self._ingest(session, body)
            except DebugError as e:
                self.logger.warning("session %s: bad batch skipped: %s", session.id, e.message)
        if error and session.state != "ended":
            session.error = error
            self.end(session, error)

    # ----- events --------------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev):
        msg, ofp = ev.msg, ev.msg.datapath.ofproto
        session = self.sessions.at_port(msg.datapath.id, msg.desc.port_no)
        if session is None:
            return
        deleted = msg.reason == ofp.OFPPR_DELETE
        up = not deleted and not msg.desc.state & ofp.OFPPS_LINK_DOWN
        if up and session.state == "starting":
            session.state = "mirroring"
            self.refresh_mirrors()
            s = session.spec
            self.logger.info(
                "session %s: debug port %s/%d is up: copying to it from %d rules%s",
                s.session, s.host, s.port, session.mirrored_rules,
                "" if session.mirrored_rules else " (the worker has no data rules yet)",
            )  # fmt: skip
        elif deleted or (not up and session.state != "starting"):
            # a port may be added down and come up a moment later: only then is down final
            self.end(session, "the debug worker's port went away (its process ended)")

    @set_ev_cls(EventTopologyChanged)
    def _topology_changed(self, ev):
        for session in self.sessions.active():
            if session.spec.app != ev.app:
                continue
            app = self.core().view.apps.get(ev.app)
            if ev.version is None or app is None:
                self.end(session, "the application was killed")
                continue
            try:
                w = app.physical.by_id(session.spec.worker)
            except KeyError:
                self.end(session, "the observed worker was removed from the topology")
                continue
            if w.host != session.spec.host:
                self.end(session, f"the observed worker moved from {session.spec.host} to {w.host}")
        # nothing else to do: the core re-applied the overlay with the new view already

    @set_ev_cls(EventTick)
    def _tick(self, ev):
        now = time.monotonic()
        if not self.cleaned:
            self._remove_leftovers()
        for session in self.sessions.active():
            self._collect(session)
        for session, reason in self.sessions.expired(now):
            self.end(session, reason)
        for session in self.sessions.active():
            if session.state == "mirroring" and self.core().synced():
                session.state = "live"
                self.logger.info(
                    "session %s: mirror rules confirmed by the switch: live", session.id
                )
        if now - self.stats_asked >= SWITCH_STATS_S:
            self.stats_asked = now
            live = ("mirroring", "live")
            hosts = {s.spec.host for s in self.sessions.active() if s.state in live}
            for host in sorted(hosts):
                self.core().request_meter_stats(host)
                self.core().request_stats(host, groups=False)
        for session in self.sessions.purge(now):
            self.core().delete_debug_batches(session.id)  # a last batch written after the end
            self.logger.info("session %s: forgotten (%s)", session.id, session.reason)

    @set_ev_cls(ofp_event.EventOFPMeterStatsReply, MAIN_DISPATCHER)
    def _meter_stats(self, ev):
        dpid = ev.msg.datapath.id
        for stat in ev.msg.body:
            for session in self.sessions.active():
                if session.dpid == dpid and meter_id(session.spec.port) == stat.meter_id:
                    left_out = sum(b.packet_band_count for b in stat.band_stats)
                    session.meter_counted(stat.packet_in_count, left_out)

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def _port_stats(self, ev):
        dpid = ev.msg.datapath.id
        for stat in ev.msg.body:
            session = self.sessions.at_port(dpid, stat.port_no)
            if session is not None:
                session.port_counted(stat.tx_packets, stat.tx_dropped)

    # ----- actions -------------------------------------------------------------------------

    def end(self, session: Session, reason: str) -> None:
        """Stop mirroring for ``session`` and release its debug worker; log why."""
        was = session.state
        if not self.sessions.end(session, reason, time.monotonic()):
            return
        if was in ("mirroring", "live"):
            self.refresh_mirrors()
        self.core().delete_debug_session(session.spec.host, session.id)
        self.core().delete_debug_batches(session.id)
        self.logger.info(
            "session %s: ended (%s): mirrors removed, debug worker on %s released; stats %s",
            session.id, reason, session.spec.host, session.stats or "none",
        )  # fmt: skip

    def refresh_mirrors(self) -> None:
        """(Re)install the mirror overlay for the sessions whose port is up; none: drop it."""
        mirroring = [s for s in self.sessions.sessions.values() if s.state in ("mirroring", "live")]
        if mirroring:
            # one recompute gives the overlay (it reads the sessions) and the meters it
            # uses, and the core sends meter adds before flow mods, meter deletes after;
            # the very first time the overlay is not registered yet: meters, then rules
            meters: dict[str, set] = {}
            for s in mirroring:  # an unmetered session (``--rate all``) adds no meter
                on_host = meters.setdefault(s.spec.host, set())
                if s.spec.rate is not None:
                    on_host.add(sampling_meter(s.spec.port, s.spec.rate))
            by_host = {h: frozenset(m) for h, m in meters.items()}
            self.core().set_rules(Source.METERS, OWNER, by_host)
            self.core().set_rules(Source.OVERLAY, OWNER, self._overlay)
        else:
            self.core().clear_rules(Source.OVERLAY, OWNER)  # the rules first, then their meters
            self.core().clear_rules(Source.METERS, OWNER)

    def _overlay(self, host: str, rules: frozenset) -> frozenset:
        """The core calls this on every recompute: mirror outputs on ``host``'s rules."""
        view = self.core().view
        ports = {
            (name, w.worker_id): w.port for name, a in view.apps.items() for w in a.physical.workers
        }
        taps = []
        for session, tap in self.sessions.mirrors(ports):
            if session.spec.host != host:
                continue
            carried = mirrored(rules, tap)
            if len(carried) != session.mirrored_rules:  # attached, or the topology changed
                self.logger.info(
                    "session %s: mirroring %d rules on %s: %s", session.id, len(carried),
                    host, ", ".join(describe(r.cookie) for r in carried) or "none",
                )  # fmt: skip
            session.mirrored_rules = len(carried)
            taps.append(tap)
        return apply_mirrors(rules, taps)

    def _ports_on(self, host: str) -> set[int]:
        """Switch ports of ``host`` that workers hold (any app, draining ones too)."""
        ports = {
            w.port
            for a in self.core().view.apps.values()
            for w in a.physical.workers
            if w.host == host
        }
        agent = self.core().agent(host)
        return ports | set(agent.used_ports if agent else ())

    def _remove_leftovers(self) -> None:
        """Sessions do not outlive the controller: delete keys an earlier run left behind."""
        self.cleaned = True
        self.core().forget_debug_batches(set(self.sessions.sessions))
        for key in self.core().forget_debug_sessions(set(self.sessions.sessions)):
            self.logger.info("removed %s: a debug session of an earlier controller run", key)
