"""Runs a reconfiguration plan (``typhoon.reconfig``) inside the controller, step by step.

The plan says what to do; this module does it against the running system and
waits for every confirmation before the next step: agents' worker statuses
(``attached``) for launches, answered barriers for rules, worker acks for
ROUTING / SIGNAL / UPSTREAM / DRAIN.  A step that is not confirmed within its
timeout fails the update with a report.  Before the plan's *commit* step the
executor then undoes what was done, newest first (routes back, workers told
to forget newcomers, the old topology written again); after it, the update
can only go forward, so the executor finishes the remaining steps as well as
it can (a worker that would not drain is stopped by its agent) and reports
the update ``incomplete``.

It runs as one green thread in the Ryu process and talks to the core only
through a few services (``send_control``, ``acked``, ``rules_ready``,
``set_rules(Source.KEPT, …)``), so it stays readable on its own.
"""

from __future__ import annotations

import itertools
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.rules.composer import Source
from controller.rules.flows import compile_rules
from typhoon.coordinator import Coordinator
from typhoon.manager import Manager, ManagerError
from typhoon.reconfig import Plan, ReconfigError, Step, describe
from typhoon.topology.model import PhysicalTopology
from typhoon.topology.routing import routes_for
from typhoon.wire import Control, ControlTuple

POLL_S = 0.01


class Core(Protocol):
    """What the executor needs from the controller core."""

    coordinator: Coordinator
    view: Any

    def send_control(self, app: str, worker_ids: list[int], ct: ControlTuple) -> int: ...
    def next_control_version(self) -> int: ...
    def acked(self, app: str, what: str, version: int) -> set[int]: ...
    def rules_ready(self, app: str, version: int) -> bool: ...
    def set_rules(self, source: Source, owner: str, value: Any) -> None: ...
    def clear_rules(self, source: Source, owner: str) -> None: ...
    def sleep(self, seconds: float) -> None: ...


class StepFailed(Exception):
    """A step was not confirmed; the message says which and why."""


class Aborted(Exception):
    """The application was killed while the update ran: nothing left to update or undo."""


@dataclass
class StepRecord:
    action: str
    what: str
    workers: list[int]
    state: str = "pending"  # pending | running | done | failed | skipped
    started: float = 0.0
    seconds: float = 0.0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "what": self.what,
            "workers": self.workers,
            "state": self.state,
            "seconds": round(self.seconds, 4),
            "detail": self.detail,
        }


@dataclass
class Reconfiguration:
    """One update of one application: its plan, progress and outcome (``GET .../reconfig``)."""

    id: int
    app: str
    plan: Plan
    state: str = "running"  # running | done | rolled_back | incomplete | aborted
    error: str = ""
    started: float = field(default_factory=time.time)
    finished: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    rollback: list[StepRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.steps:
            self.steps = [StepRecord(s.action, s.what, list(s.workers)) for s in self.plan.steps]

    @property
    def running(self) -> bool:
        return self.state == "running"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "app": self.app,
            "request": describe(self.plan.request),
            "state": self.state,
            "error": self.error,
            "started": self.started,
            "finished": self.finished,
            "seconds": round((self.finished or time.time()) - self.started, 3),
            "version": self.plan.final.version,
            "added": self.plan.added,
            "removed": self.plan.removed,
            "steps": [s.to_dict() for s in self.steps],
            "rollback": [s.to_dict() for s in self.rollback],
        }


class Registry:
    """The latest reconfiguration of every application; at most one runs per application."""

    def __init__(self) -> None:
        self.latest: dict[str, Reconfiguration] = {}
        self._ids = itertools.count(1)

    def get(self, app: str) -> Reconfiguration | None:
        return self.latest.get(app)

    def begin(self, app: str, make_plan: Callable[[], Plan]) -> Reconfiguration:
        """Plan and register a new reconfiguration; 409 while another one of ``app`` runs."""
        current = self.latest.get(app)
        if current is not None and current.running:
            raise ReconfigError(
                f"reconfiguration {current.id} of '{app}' ({describe(current.plan.request)}) "
                "is still running; wait for it to finish",
                409,
            )
        record = Reconfiguration(next(self._ids), app, make_plan())
        self.latest[app] = record
        return record


class Executor:
    """Runs ``record.plan`` (see the module docstring); ``run()`` never raises."""

    def __init__(
        self,
        core: Core,
        manager: Manager,
        record: Reconfiguration,
        step_timeout: float = 30.0,
        log: Any = None,
    ) -> None:
        self.core = core
        self.manager = manager
        self.rec = record
        self.plan = record.plan
        self.app = record.app
        self.timeout = step_timeout
        self.log = log
        self.owner = f"reconfig:{self.app}"
        self.committed = False
        self.undo: list[tuple[str, Any]] = []  # (kind, data), newest last
        self.gone: set[int] = set()  # workers that exited instead of answering
        self.written: PhysicalTopology | None = None
        # what the coordinator holds now: a "write" step's undo writes it back
        self.state: tuple[Any, PhysicalTopology] = (self.plan.old_topology, self.plan.old_physical)

    # ----- driver -----------------------------------------------------------------------------

    def run(self) -> None:
        errors = []
        for step, rec in zip(self.plan.steps, self.rec.steps, strict=True):
            rec.state, rec.started = "running", time.monotonic()
            try:
                self._check_alive()
                self._step(step)
                rec.state = "done"
            except Aborted:
                rec.state = "failed"
                self._finish("aborted", "the application was killed during the update")
                self.core.clear_rules(Source.KEPT, self.owner)
                return
            except Exception as e:  # a bug in a step must still end in a report
                rec.state = "failed"
                rec.detail = str(e) if isinstance(e, (StepFailed, ManagerError)) else repr(e)
                if not isinstance(e, (StepFailed, ManagerError)) and self.log:
                    self.log.error("reconfiguration step failed:\n%s", traceback.format_exc())
                errors.append(f"step '{step.what}' failed: {rec.detail}")
                if not self.committed:
                    break
            finally:
                rec.seconds = time.monotonic() - rec.started
        if not errors:
            self._finish("done")
        elif not self.committed:
            self._roll_back()
            self._finish("rolled_back", "; ".join(errors) + "; every change was undone")
        else:
            self._finish("incomplete", "; ".join(errors))

    def _finish(self, state: str, error: str = "") -> None:
        self.rec.state, self.rec.error, self.rec.finished = state, error, time.time()
        if self.log:
            log = self.log.info if state == "done" else self.log.error
            log("app %s: reconfiguration %d %s %s", self.app, self.rec.id, state, error)

    def _check_alive(self) -> None:
        if self.app not in self.core.view.apps:
            raise Aborted()

    def _wait(self, predicate: Callable[[], bool | str], what: Callable[[], str]) -> None:
        """Until ``predicate()`` is True; a string it returns is the failure (no waiting)."""
        deadline = time.monotonic() + self.timeout
        while True:
            self._check_alive()
            problem = predicate()
            if problem is True:
                return
            if isinstance(problem, str):
                raise StepFailed(problem)
            if time.monotonic() > deadline:
                raise StepFailed(f"{what()} within {self.timeout:g} s")
            self.core.sleep(POLL_S)

    # ----- steps -------------------------------------------------------------------------------

    def _step(self, step: Step) -> None:
        getattr(self, f"_do_{step.action}")(step)

    def _do_keep_rules(self, step: Step) -> None:
        topology = step.topology or self.plan.old_topology
        physical = step.physical or self.plan.old_physical
        cluster = self.core.view.cluster
        self.core.set_rules(Source.KEPT, self.owner, compile_rules(topology, physical, cluster))
        self.undo.append(("kept_rules", None))

    def _do_drop_rules(self, step: Step) -> None:
        self.core.clear_rules(Source.KEPT, self.owner)

    def _do_write(self, step: Step) -> None:
        # even half-written: the state before it is written back
        self.undo.append(("write", self.state))
        if step.physical is not None:  # an unchaining first (typhoon.reconfig.chains)
            topology, physical = step.topology, step.physical
        else:
            topology, physical = self.plan.topology, self.plan.physical
        self.written = self._write(topology, physical)
        self.state = (topology or self.state[0], physical)

    def _do_write_final(self, step: Step) -> None:
        self.written = self._write(None, self.plan.final)

    def _write(self, topology, physical: PhysicalTopology) -> PhysicalTopology:
        current = self.core.coordinator.get_physical(self.app)
        if current is None:
            raise Aborted()
        physical = PhysicalTopology(
            physical.name,
            physical.app_id,
            physical.workers,
            max(physical.version, current.version + 1),
            max(physical.generation, current.generation),
            key_groups={n: list(t) for n, t in physical.key_groups.items()},
            worker_generations=dict(physical.worker_generations),
            unchained=list(physical.unchained),
            kept_chains=[list(g) for g in physical.kept_chains],
        )
        if topology is not None:
            self.core.coordinator.put_topology(topology)
        return self.manager.update_physical(self.app, physical)

    def _do_wait_rules(self, step: Step) -> None:
        version = self.written.version if self.written else self.plan.old_physical.version
        self._wait(
            lambda: self.core.rules_ready(self.app, version),
            lambda: "the switches did not confirm the new rules",
        )

    def _statuses(self) -> dict:
        app = self.core.view.apps.get(self.app)
        return app.statuses if app is not None else {}

    def _do_wait_attached(self, step: Step) -> None:
        def attached():
            statuses = self._statuses()
            for w in step.workers:
                s = statuses.get(w)
                if s is not None and s.state == "exited":
                    return f"new worker {w} exited before it was attached: {s.error or s.exit_code}"
            return all(
                (s := statuses.get(w)) is not None and s.state in ("attached", "running")
                for w in step.workers
            )

        self._wait(attached, lambda: f"workers {step.workers} were not attached")

    def _exited(self, worker: int) -> tuple[bool, int | None]:
        s = self._statuses().get(worker)
        return (s is not None and s.state == "exited", s.exit_code if s else None)

    def _control(self, ctype: str, bodies: list[tuple[int, dict]]) -> None:
        """Send each body to its worker, then wait until each one is acked.

        A worker that exits cleanly instead (a source that finished, a removed
        worker that drained on its release) counts as done and is remembered.
        """
        pending: dict[tuple[int, int], int] = {}
        for w, body in bodies:
            ended, code = self._exited(w)
            if ended and code == 0:
                self.gone.add(w)
            if w in self.gone:
                continue
            v = self.core.next_control_version()
            self.core.send_control(
                self.app, [w], ControlTuple(Control[ctype], {**body, "version": v})
            )
            pending[(w, v)] = w

        def answered():
            for w, v in list(pending):
                if w in self.core.acked(self.app, ctype, v):
                    del pending[(w, v)]
                    continue
                ended, code = self._exited(w)
                if ended and code == 0:
                    self.gone.add(w)
                    del pending[(w, v)]
                elif ended:
                    return f"worker {w} exited (code {code}) before it confirmed {ctype}"
            return not pending

        self._wait(
            answered, lambda: f"workers {sorted(set(pending.values()))} did not confirm {ctype}"
        )

    def _do_control(self, step: Step) -> None:
        if not self.committed:
            self.undo.append((step.control, step))  # a half-done step is undone too
        self._control(step.control, step.bodies)
        self._forget_gone()

    def _forget_gone(self) -> None:
        """New workers must not wait for a sender that finished before it was rerouted."""
        if not self.gone or not self.plan.added:
            return
        bodies = [(w, {"add": [], "remove": sorted(self.gone)}) for w in self.plan.added]
        self._control("UPSTREAM", bodies)

    def _do_commit(self, step: Step) -> None:
        self.committed = True

    def _do_drain(self, step: Step) -> None:
        self._control("DRAIN", [(w, {}) for w in step.workers])

    def _do_wait_stopped(self, step: Step) -> None:
        ids = set(step.workers)

        def stopped():
            agents = self.core.coordinator.agents()
            return not any(ids & set(a.workers.get(self.app, [])) for a in agents.values())

        self._wait(stopped, lambda: f"agents did not stop workers {sorted(ids)}")

    # ----- rollback ----------------------------------------------------------------------------

    def _roll_back(self) -> None:
        """Undo what was done before the commit, newest first; every undo is best effort."""
        old_t, old_p = self.plan.old_topology, self.plan.old_physical
        added = set(self.plan.added)
        while self.undo:
            kind, data = self.undo.pop()
            rec = StepRecord(f"undo {kind}", "", [])
            self.rec.rollback.append(rec)
            t0 = time.monotonic()
            try:
                if kind == "ROUTING":
                    rec.what = "ROUTING: senders go back to their old routes, newcomers released"
                    bodies = []
                    for w in sorted({w for w, _ in data.bodies}):
                        for r in routes_for(old_t, old_p, w):
                            bodies.append((w, {**r.to_body(), "release": sorted(added)}))
                    rec.workers = sorted({w for w, _ in bodies})
                    self._control("ROUTING", [(w, _strip(b)) for w, b in bodies])
                elif kind == "UPSTREAM":
                    rec.what = "UPSTREAM: staying workers forget the newcomers"
                    bodies = [(w, {"add": [], "remove": b["add"]}) for w, b in data.bodies]
                    rec.workers = [w for w, _ in bodies]
                    self._control("UPSTREAM", bodies)
                elif kind == "CHAIN":  # live unchaining: each sender back as it was
                    rec.what = "CHAIN: the edges go back to how they ran"
                    bodies = [(w, {**b, "chained": not b["chained"]}) for w, b in data.bodies]
                    rec.workers = [w for w, _ in bodies]
                    self._control("CHAIN", bodies)
                elif kind == "SWAP":  # swap in place: back to the old operator, in place
                    rec.what = "SWAP: the workers go back to the old operator"
                    bodies = []
                    for w, _ in data.bodies:
                        n = old_t.nodes[old_p.by_id(w).node]
                        bodies.append((w, {"operator": n.operator, "args": dict(n.args)}))
                    rec.workers = [w for w, _ in bodies]
                    self._control("SWAP", bodies)
                elif kind == "SIGNAL":
                    rec.what = "nothing to undo for a cache flush"
                elif kind == "KEYGROUPS":
                    # state that moved stays with its new owner; the routes go back above
                    # (docs/keyed_state.md, Limits)
                    rec.what = "keyed state that moved is not moved back"
                elif kind == "write":
                    rec.what = "write the state before it back; agents stop the new workers"
                    rec.workers = sorted(added)
                    before_t, before_p = data
                    self.written = self._write(before_t, before_p)
                    self.state = data
                    self._do_wait_rules(Step("wait_rules", ""))
                elif kind == "kept_rules":
                    rec.what = "stop keeping the old rules"
                    self.core.clear_rules(Source.KEPT, self.owner)
                rec.state = "done"
            except Exception as e:
                rec.state, rec.detail = "failed", str(e)
            rec.seconds = time.monotonic() - t0


def _strip(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "version"}
