"""Steps 2 and 3 of a failover: replace the dead worker, then route to the replacement.

A part of the fault detector's state machine (``controller/recovery/fault_detector_machine.py``
detects and reroutes at once; this is the slow part it starts as a task): await the
senders' acks and the agent's exit status, write the physical topology with a
replacement, tell its receivers, and once it is attached route its senders to it
(under a guarantee, after a new recovery generation and ROLLBACK:
``controller/recovery/fault_recovery.py``).  Each wait is a check (``controller/waits.py``)
the machine's fast timer asks, never a sleep.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any

from controller.recovery.acks import send_each, send_routes
from controller.recovery.fault_core import Core
from controller.recovery.fault_detector import (
    LIVE,
    Incident,
    failover,
    lost_hosts,
    rejoin,
    silent_host,
)
from controller.recovery.fault_recovery import GuaranteedRecovery
from controller.waits import WAIT, Check, Task
from typhoon.checkpoint.progress import guaranteed
from typhoon.wire import Control, ControlTuple


class Failover(GuaranteedRecovery):
    """The replacing half of ``FaultMachine`` (a mixin: it shares the machine's state)."""

    handled: set[tuple[str, int]]  # (app, worker) already failed over
    pending: dict[str, set[int]]  # app -> replacements not routed to yet

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

    def lost_hosts(self, hosts: Iterable[str]) -> set[str]:
        """Which of ``hosts`` lost power (:func:`lost_hosts`); asks the coordinator for each
        host whose switch is not connected."""
        core, hosts = self.core, set(hosts)
        connected = core.connected_hosts()
        beats: dict[str, float | None] = {}
        for h in hosts - connected:
            agent = core.agent(h)
            beats[h] = None if agent is None else agent.heartbeat
        return lost_hosts(hosts, connected, beats, time.time(), self.conf.agent_timeout)

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
        lost = self.lost_hosts(place.hosts)  # no replacement goes to any of them
        if host in lost or core.agent(host) is None:
            incident.detail = (
                f"host {host} is lost (its switch is gone, its agent silent): replaced elsewhere"
                if host in lost
                else f"host {host} is gone (no agent): replaced elsewhere"
            )
            self.logger.warning("app %s worker %d: %s", name, wid, incident.detail)
            closed = [host]
        closed = sorted({*closed, *lost})
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
