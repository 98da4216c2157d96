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
* drained workers exit by themselves (``wait_stopped`` waits for the process).

A step not confirmed in time, or a worker that exits non-zero during it, fails
the update; the tcp run then stops as failed (a half-done update is not undone
on tcp).  :func:`tcp_refusal` names, in one sentence, what tcp refuses.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from typhoon.checkpoint.settings import guarantee_of
from typhoon.reconfig import MAX_PARALLELISM, Plan, ReconfigError, Scale, Step, describe, plan
from typhoon.reconfig.requests import Request
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
    def await_workers(self, worker_ids: list[int]) -> None: ...
    def send(self, worker_id: int, ct: ControlTuple) -> None: ...
    def pump(self, timeout: float) -> None: ...
    def next_version(self) -> int: ...
    def hosts(self) -> list[str]: ...


class StepFailed(Exception):
    """A step was not confirmed; the message says which and why."""


# ----- pure parts ----------------------------------------------------------------------------


def tcp_refusal(topology: Topology, request: Request) -> str | None:
    """One sentence saying why tcp refuses ``request`` on ``topology``; None: it may run."""
    if not isinstance(request, Scale):
        return (
            f"{describe(request)} is not supported on the tcp transport: only 'scale' is "
            "(reroute, swap, insert, remove and move need the sdn controller)"
        )
    guarantee = guarantee_of(topology)
    if guarantee != "none":
        return (
            f"a tcp job under guarantee '{guarantee}' cannot be rescaled: a recovery would "
            "restore key groups where a checkpoint before the move left them while routing "
            "follows the new table (docs/keyed_state.md, Limits)"
        )
    node = topology.nodes.get(request.node)
    if node is None:
        return f"no node named '{request.node}' in '{topology.name}'"
    if node.engine != "python":
        return (
            f"{node.engine} node '{node.name}' cannot be rescaled on tcp: the tcp runner "
            "starts one engine service per host at launch and never changes it"
        )
    if node.stateful and not node.keyed:  # its input remaps: the plan would flush it
        return (
            f"'{node.name}' keeps per-worker state that is not keyed (stateful: true with "
            f"operator {node.operator}), which a tcp rescale cannot move: only keyed state "
            "moves with its key groups on tcp (docs/keyed_state.md)"
        )
    return None


def parse_scale_option(text: str) -> tuple[float, Scale]:
    """``AT:NODE=N`` (``typhoon run --scale``): at AT seconds, scale NODE to N workers."""
    at, sep, rest = text.partition(":")
    node, eq, n = rest.partition("=")
    try:
        seconds, parallelism = float(at), int(n)
    except ValueError:
        seconds, parallelism = -1.0, 0
    if not sep or not eq or not node or seconds < 0 or not 1 <= parallelism <= MAX_PARALLELISM:
        raise ValueError(
            f"--scale '{text}' is not of the form AT:NODE=N (AT seconds >= 0, "
            f"1 <= N <= {MAX_PARALLELISM}), e.g. 5:count=6"
        )
    return seconds, Scale(node, parallelism)


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
    request: Scale
    state: str = "pending"  # pending | done | refused | failed
    error: str = ""
    added: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    # after the update, per worker of each node whose keyed state moved: the key groups
    # it owns and the groups of the keys its keyed state holds
    placement: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    physical: PhysicalTopology | None = None  # the final physical topology

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

    def __init__(self, cluster: Cluster, scheduled: list[tuple[float, Scale]] = ()) -> None:
        self.cluster = cluster
        self.scheduled = sorted(scheduled, key=lambda s: s[0])
        self.pending: queue.Queue[Record] = queue.Queue()
        self.records: list[Record] = []

    def request(self, scale: Scale) -> Record:
        """Queue a rescale; the run loop performs it on its next turn (``record.state``)."""
        rec = Record(len(self.records) + 1, scale)
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
            self.plan = p = plan(
                rec.request,
                c.topology,
                c.physical,
                c.hosts(),
                first_port=0,
                exited=exited,
                min_id=max(c.procs, default=0) + 1,
            )
        except ReconfigError as e:
            rec.state, rec.error = "refused", e.message
            log.warning("rescale %s refused: %s", describe(rec.request), e.message)
            return True
        rec.added, rec.removed = list(p.added), list(p.removed)
        for step in p.steps:
            s0 = time.monotonic()
            try:
                getattr(self, f"_do_{step.action}")(step)
            except StepFailed as e:
                rec.steps.append(_step(step, "failed", s0, str(e)))
                rec.state, rec.error = "failed", f"step '{step.what}' failed: {e}"
                rec.seconds = time.monotonic() - t0
                log.error("rescale %s: %s", describe(rec.request), rec.error)
                return False
            rec.steps.append(_step(step, "done", s0))
        c.physical = p.final  # (a scale-up has no write_final: the same workers, new version)
        try:
            rec.placement = self._placement(keyed_nodes(p))
        except StepFailed as e:
            rec.state, rec.error = "failed", f"the placement after the update: {e}"
            return False
        rec.state, rec.physical = "done", p.final
        rec.seconds = time.monotonic() - t0
        log.info("rescale %s done in %.2f s", describe(rec.request), rec.seconds)
        return True

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

        self._wait(answered, lambda: f"workers {sorted(pending.values())} did not confirm {ctype}")

    def _placement(self, nodes: list[str]) -> dict[str, dict[int, dict[str, Any]]]:
        """Ask the keyed nodes' running workers which groups they own and hold keys of."""
        c = self.c
        asked: dict[int, int] = {}
        for node in nodes:
            for w in c.physical.active_of_node(node):
                if self._ended(w.worker_id) is None:
                    rid = c.next_version()
                    body = {"request_id": rid, "keys": True}
                    c.send(w.worker_id, ControlTuple(Control.METRIC_REQ, body))
                    asked[w.worker_id] = rid

        def replied() -> bool:
            return all(c.replies.get(w, (None,))[0] == rid for w, rid in asked.items())

        self._wait(replied, lambda: f"workers {sorted(asked)} did not report their key groups")
        out: dict[str, dict[int, dict[str, Any]]] = {}
        for w, _ in asked.items():
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
