"""Rescaling a running tcp job: the sdn plan (``typhoon.reconfig``), run by the tcp coordinator.

One procedure for both transports: :func:`typhoon.reconfig.plan` computes the
steps, and the control tuples are the ones the controller's executor sends on
sdn (``controller/reconfigure.py``): UPSTREAM, ``KEYGROUPS prepare`` (new
owners hold the moving groups' tuples), ROUTING with ``handoff``, ``KEYGROUPS
finish`` (old owners ship the groups' keyed state through the checkpoint
store once every sender's handoff is in; new owners load it and release what
they held), ROUTING with ``release``, DRAIN.  What differs on tcp:

* no switch: the rule steps (``keep_rules``, ``wait_rules``, ``drop_rules``)
  have nothing to do;
* the coordinator launches the new workers itself (``write``), waits for their
  hello (``wait_attached``) and tells every worker the newcomers' addresses on
  its control connection, ahead of any ROUTING that names them (same
  connection, in order);
* drained workers exit by themselves (``wait_stopped`` waits for the process);
* ``unchain`` / ``chain`` (and a direct route of a chained edge, unchained first):
  ``write`` only records the physical topology; an unchained sender sends on a tcp
  connection to its receiver in the same process (``typhoon/runtime/tcp.py``).

Under a guarantee the workers align the update with their checkpoints as on
sdn (``typhoon/runtime/keyed_cut.py``: a part taken while groups move is not
written; a rollback restores each group on its current owner), so a death
after the update is recovered by the usual tcp recovery
(``typhoon/tcp_recovery.py``).  A worker that exits non-zero *during* the
update leaves the others half-way through it; under a guarantee the
coordinator then restarts every worker in the update's final topology from
the newest checkpoint complete under it (``tcp_recovery.restart``), and the
update ends ``restarted``.  Otherwise, or when a step is not confirmed in
time, the update fails and the tcp run stops as failed (a half-done update is
not undone on tcp).  A swap of a chained node, or of a node
with keyed state (kept across the cut), runs in place
(``typhoon.reconfig.swap_in_place``: write, SWAP, commit; nothing to launch).
:func:`typhoon.tcp_requests.tcp_refusal` names, in one sentence, what tcp refuses.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from typhoon.checkpoint.settings import guarantee_of
from typhoon.reconfig import (
    Plan,
    ReconfigError,
    Scale,
    Step,
    Swap,
    describe,
    plan,
)
from typhoon.reconfig.requests import Request
from typhoon.reconfig.swap_in_place import plan_swap_in_place
from typhoon.tcp_requests import tcp_refusal
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.wire import Control, ControlTuple

log = logging.getLogger(__name__)

POLL_S = 0.01
STEP_TIMEOUT_S = 30.0


class Cluster(Protocol):
    """What the executor needs from :class:`typhoon.tcp_cluster.TcpCluster`."""

    topology: Topology
    physical: PhysicalTopology
    procs: dict[int, Any]
    acks: list[dict[str, Any]]
    replies: dict[int, tuple[int, dict[str, Any]]]

    def launch_workers(self, worker_ids: list[int]) -> None: ...
    def restart(self, topology: Topology, physical: PhysicalTopology, reason: str) -> None: ...
    def await_workers(self, worker_ids: list[int]) -> None: ...
    def connected(self, worker_id: int) -> bool: ...
    def send(self, worker_id: int, ct: ControlTuple) -> None: ...
    def pump(self, timeout: float) -> None: ...
    def next_version(self) -> int: ...
    def hosts(self) -> list[str]: ...


class StepFailed(Exception):
    """A step was not confirmed; the message says which and why."""


# ----- pure parts ----------------------------------------------------------------------------


def keyed_nodes(p: Plan) -> list[str]:
    """Nodes of the plan whose keyed state moved (KEYGROUPS bodies), or the scaled node."""
    moved = {
        w.node
        for s in p.steps
        if s.control == "KEYGROUPS"
        for w in p.physical.workers
        if w.worker_id in s.workers
    }
    if isinstance(p.request, Scale) and p.topology.nodes[p.request.node].keyed:
        moved.add(p.request.node)
    return sorted(moved)


# ----- records and the executor --------------------------------------------------------------


@dataclass
class Record:
    """One rescale of a tcp run, as the run report lists it."""

    id: int
    request: Request  # a Scale, a direct Reroute (a locality move), an Unchain or a Chain
    # pending | done | refused | failed | restarted (a worker died during it, under a
    # guarantee: every worker started again in the final topology from a checkpoint)
    state: str = "pending"
    error: str = ""
    added: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    # after the update, per worker of each node whose keyed state moved: the key groups
    # it owns and the groups of the keys its keyed state holds
    placement: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    physical: PhysicalTopology | None = None  # the final physical topology
    status: int = 0  # a refusal's HTTP status (typhoon.tcp_control answers with it)
    # set once the request is planned (its steps run) or refused: what a caller waits for
    settled: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "request": describe(self.request),
            "state": self.state,
            "error": self.error,
            "added": self.added,
            "removed": self.removed,
            "seconds": round(self.seconds, 3),
            "steps": self.steps,
            "placement": {
                n: {str(w): v for w, v in ws.items()} for n, ws in self.placement.items()
            },
        }


class Rescaler:
    """Rescale requests of one tcp run (thread-safe :meth:`request`, run by the run loop)."""

    def __init__(self, cluster: Cluster, scheduled: list[tuple[float, Request]] = ()) -> None:
        self.cluster = cluster
        self.scheduled = sorted(scheduled, key=lambda s: s[0])
        self.pending: queue.Queue[Record] = queue.Queue()
        self.records: list[Record] = []
        self._lock = threading.Lock()  # the run loop and a control endpoint both request

    def request(self, request: Request) -> Record:
        """Queue a rescale (or a locality move); the run loop performs it on its next turn
        (``record.state``)."""
        with self._lock:
            rec = Record(len(self.records) + 1, request)
            self.records.append(rec)
            self.pending.put(rec)
        return rec

    def turn(self, elapsed: float) -> bool:
        """Run what is due; False once an update failed (the run must stop)."""
        while self.scheduled and self.scheduled[0][0] <= elapsed:
            self.request(self.scheduled.pop(0)[1])
        while not self.pending.empty():
            rec = self.pending.get()
            if not Executor(self.cluster, rec).run():
                return False
        return True

    def failed(self) -> list[str]:
        """One sentence per rescale that failed half-way."""
        bad = [r for r in self.records if r.state == "failed"]
        return [f"rescale {r.id} ({describe(r.request)}): {r.error}" for r in bad]

    def report(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.records]


class Executor:
    """Runs one rescale's plan against the tcp run (module docstring)."""

    def __init__(self, cluster: Cluster, rec: Record, timeout: float | None = None) -> None:
        self.c = cluster
        self.rec = rec
        self.timeout = STEP_TIMEOUT_S if timeout is None else timeout
        self.gone: set[int] = set()  # workers that exited cleanly instead of answering
        self.plan: Plan | None = None

    def run(self) -> bool:
        """True unless the update failed after it started (a refusal is not a failure)."""
        c, rec = self.c, self.rec
        t0 = time.monotonic()
        refusal = tcp_refusal(c.topology, rec.request)
        exited = {w for w, p in c.procs.items() if p.poll() is not None}
        try:
            if refusal is not None:
                raise ReconfigError(refusal, 409)
            self.plan = p = self._plan(exited)
        except ReconfigError as e:
            rec.state, rec.error, rec.status = "refused", e.message, e.status
            rec.settled.set()
            log.warning("rescale %s refused: %s", describe(rec.request), e.message)
            return True
        rec.added, rec.removed = list(p.added), list(p.removed)
        rec.settled.set()
        for step in p.steps:
            s0 = time.monotonic()
            try:
                getattr(self, f"_do_{step.action}")(step)
            except StepFailed as e:
                rec.steps.append(_step(step, "failed", s0, str(e)))
                rec.error = f"step '{step.what}' failed: {e}"
                if self._dead() and guarantee_of(c.topology) != "none":
                    return self._restart(p, t0)
                rec.state = "failed"
                rec.seconds = time.monotonic() - t0
                log.error("rescale %s: %s", describe(rec.request), rec.error)
                return False
            rec.steps.append(_step(step, "done", s0))
        c.physical = p.final  # (a scale-up has no write_final: the same workers, new version)
        return self._finish(p, "done", t0)

    def _plan(self, exited: set[int]) -> Plan:
        c, request = self.c, self.rec.request
        if isinstance(request, Swap):  # only in place: the same workers, no CHAIN, no rules
            in_place = plan_swap_in_place(request, c.topology, c.physical, exited)
            if in_place is None:
                raise ReconfigError(
                    f"{describe(request)} cannot run in place (docs/reconfiguration.md, "
                    "'Swapping a chained node in place' and 'Swapping a node with keyed "
                    "state'), and a swap on the network needs --transport sdn",
                    409,
                )
            return in_place
        return plan(
            request,
            c.topology,
            c.physical,
            c.hosts(),
            first_port=0,
            exited=exited,
            min_id=max(c.procs, default=0) + 1,
        )

    def _finish(self, p: Plan, state: str, t0: float) -> bool:
        rec = self.rec
        try:
            rec.placement = self._placement(keyed_nodes(p))
        except StepFailed as e:
            rec.state, rec.error = "failed", f"the placement after the update: {e}"
            return False
        rec.state, rec.physical = state, self.c.physical
        rec.seconds = time.monotonic() - t0
        log.info("rescale %s %s in %.2f s", describe(rec.request), state, rec.seconds)
        return True

    def _dead(self) -> list[int]:
        return sorted(w for w in self.c.procs if self._ended(w) not in (None, 0))

    def _restart(self, p: Plan, t0: float) -> bool:
        """A worker died during the update under a guarantee: every worker again in the
        final topology, from the newest checkpoint complete under it (tcp_recovery)."""
        rec, dead = self.rec, self._dead()
        why = f"during rescale {rec.id} ({describe(rec.request)}), at {rec.error}"
        try:
            self.c.restart(p.topology, p.final, why)
        except RuntimeError as e:
            rec.state, rec.error = "failed", f"{rec.error}; the restart after it failed: {e}"
            rec.seconds = time.monotonic() - t0
            return False
        rec.error = f"workers {dead} died ({rec.error}); every worker restarted"
        self.gone.clear()
        return self._finish(p, "restarted", t0)

    # ----- waiting -------------------------------------------------------------------------

    def _wait(self, predicate: Callable[[], bool | str], what: Callable[[], str]) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            problem = predicate()
            if problem is True:
                return
            if isinstance(problem, str):
                raise StepFailed(problem)
            if time.monotonic() > deadline:
                raise StepFailed(f"{what()} within {self.timeout:g} s")
            self.c.pump(POLL_S)

    def _ended(self, w: int) -> int | None:
        p = self.c.procs.get(w)
        return None if p is None else p.poll()

    def _control(self, ctype: str, bodies: list[tuple[int, dict]]) -> None:
        """Send each body, then wait until each is acked or its worker exited cleanly."""
        pending: dict[tuple[int, int], int] = {}
        for w, body in bodies:
            if self._ended(w) == 0:
                self.gone.add(w)
            if w in self.gone:
                continue
            v = self.c.next_version()
            if not self.c.connected(w):
                # it closed its control connection: its stream ended (it is exiting) or it
                # died; its exit code below says which
                pending[(w, v)] = w
                continue
            self.c.send(w, ControlTuple(Control[ctype], {**body, "version": v}))
            pending[(w, v)] = w
        seen = 0

        def answered() -> bool | str:
            nonlocal seen
            acks = self.c.acks
            for a in acks[seen:]:
                if a.get("ack") == ctype:
                    pending.pop((a["worker"], a["version"]), None)
            seen = len(acks)
            for w, v in list(pending):
                code = self._ended(w)
                if code == 0:
                    self.gone.add(w)
                    del pending[(w, v)]
                elif code is not None:
                    return f"worker {w} exited (code {code}) before it confirmed {ctype}"
            return not pending

        def late() -> str:
            closed = sorted(w for w in pending.values() if not self.c.connected(w))
            why = f" ({closed} closed their control connection but did not exit)" if closed else ""
            return f"workers {sorted(pending.values())} did not confirm {ctype}{why}"

        self._wait(answered, late)

    def _placement(self, nodes: list[str]) -> dict[str, dict[int, dict[str, Any]]]:
        """Ask the keyed nodes' running workers which groups they own and hold keys of."""
        c = self.c
        asked: dict[int, int] = {}
        for node in nodes:
            for w in c.physical.active_of_node(node):
                # one that closed its connection finished its stream: its final report says
                if self._ended(w.worker_id) is None and c.connected(w.worker_id):
                    rid = c.next_version()
                    body = {"request_id": rid, "keys": True}
                    c.send(w.worker_id, ControlTuple(Control.METRIC_REQ, body))
                    asked[w.worker_id] = rid

        def replied() -> bool:
            # one that died since is left out: the run loop recovers it (tcp_recovery)
            return all(
                c.replies.get(w, (None,))[0] == rid or self._ended(w) is not None
                for w, rid in asked.items()
            )

        self._wait(replied, lambda: f"workers {sorted(asked)} did not report their key groups")
        out: dict[str, dict[int, dict[str, Any]]] = {}
        for w, rid in asked.items():
            if c.replies.get(w, (None,))[0] != rid:
                continue
            keyed = c.replies[w][1].get("keyed", {})
            out.setdefault(c.physical.by_id(w).node, {})[w] = {
                "owned": sorted(int(g) for g in keyed.get("owned", {})),
                "held": sorted(int(g) for g in keyed.get("held_groups", {})),
                # keys a direct table names: 1 routed here, 0 misplaced
                "pinned": dict(keyed.get("held_pinned", {})),
            }
        return out

    # ----- steps ---------------------------------------------------------------------------

    def _do_keep_rules(self, step: Step) -> None:
        """No switch on tcp: nothing to keep."""

    _do_drop_rules = _do_wait_rules = _do_keep_rules

    def _do_write(self, step: Step) -> None:
        p = self.plan
        assert p is not None
        if step.physical is not None:  # an unchaining first (typhoon.reconfig.chains)
            self.c.physical = step.physical  # the same workers, some edges on the network
            return
        self.c.topology, self.c.physical = p.topology, p.physical
        self.c.launch_workers(list(p.added))

    def _do_wait_attached(self, step: Step) -> None:
        try:
            self.c.await_workers(list(step.workers))  # hellos, then everyone's peers
        except RuntimeError as e:
            raise StepFailed(str(e)) from None

    def _do_control(self, step: Step) -> None:
        self._control(step.control, step.bodies)
        p = self.plan
        if self.gone and p is not None and p.added:
            # new workers must not wait for a sender that finished before it was rerouted
            gone = sorted(self.gone)
            self._control("UPSTREAM", [(w, {"add": [], "remove": gone}) for w in p.added])

    def _do_commit(self, step: Step) -> None:
        """From here on the update only goes forward."""

    def _do_drain(self, step: Step) -> None:
        self._control("DRAIN", [(w, {}) for w in step.workers])

    def _do_write_final(self, step: Step) -> None:
        assert self.plan is not None
        self.c.physical = self.plan.final

    def _do_wait_stopped(self, step: Step) -> None:
        if guarantee_of(self.c.topology) != "none":
            # a drained worker stays to roll back until COMPLETE; it never has to (it owns
            # no group, and its links ended ``leaving``): stopped, as sdn's agents stop it
            for w in step.workers:
                if self._ended(w) is None:
                    self.c.procs[w].terminate()

        def stopped() -> bool | str:
            for w in step.workers:
                code = self._ended(w)
                if code:
                    return f"drained worker {w} exited with {code}"
            return all(self._ended(w) is not None for w in step.workers)

        self._wait(stopped, lambda: f"workers {step.workers} did not stop after DRAIN")


def _step(step: Step, state: str, started: float, detail: str = "") -> dict[str, Any]:
    return {
        "action": step.action,
        "what": step.what,
        "workers": list(step.workers),
        "state": state,
        "seconds": round(time.monotonic() - started, 4),
        "detail": detail,
    }
