"""Decisions of the fault detector (``apps/fault_detector.py``), pure and switch-free.

A dead worker is handled in two phases, each a function of the topologies
only, so the unit tests need no switch and the app stays a thin shim:

1. ``failover``: routes of the dead worker's predecessors without it (sent at
   once, before anything else, because every tuple routed to a dead port is
   lost), the physical topology with a replacement (fresh worker ID, the dead
   one's node and index) that the manager writes so an agent launches it, and
   the receivers that must wait for the replacement's end of stream instead of
   the dead worker's (one UPSTREAM with both, so a receiver never sees its
   last sender leave and ends its input).
2. ``rejoin``: once the replacement is attached, its predecessors' routes with it.

``Heartbeats`` is the slow fallback: a worker whose METRIC_RESP stopped
arriving for ``timeout`` seconds is reported as dead even if no port event came;
``held_up_by_receivers`` spares the senders a hung receiver silenced, unless
``lost_hosts`` says their host is gone (switch and agent both silent: a power cut).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from controller.settings import setting
from typhoon.topology.config import DEFAULTS
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.topology.routing import Route, routes_for
from typhoon.topology.scheduler import reschedule


@dataclass(frozen=True)
class FaultSettings:
    """The ``[fault_detector]`` section (``controller/settings.py``)."""

    section: ClassVar[str] = "fault_detector"

    heartbeat_timeout: float = setting(
        5.0,
        "seconds without METRIC_RESP before a worker counts as dead (0: fallback off); "
        "keep it well above `[typhoon] metrics_interval`",
    )
    confirm_timeout: float = setting(
        2.0, "seconds to wait for the agent's exit status before replacing anyway"
    )
    ack_timeout: float = setting(
        5.0, "seconds senders and receivers get to confirm a ROUTING / UPSTREAM"
    )
    attach_timeout: float = setting(30.0, "seconds a replacement gets to be attached")
    agent_timeout: float = setting(
        5.0,
        "seconds without an agent's heartbeat after which a host whose switch is gone too "
        "counts as lost (a power cut): its workers are judged dead, none are placed there",
    )
    replace: bool = setting(True, "start replacements (false: only reroute around dead workers)")
    port_events: bool = setting(
        True, "react to port events (false: `heartbeat_timeout` alone detects)"
    )


@dataclass
class Failover:
    """What to do the moment a worker is known dead."""

    dead: int
    routes: dict[int, list[Route]]  # predecessor -> its routes without the dead worker
    receivers: list[int]  # told (UPSTREAM) to expect the replacement instead of the dead one
    physical: PhysicalTopology  # dead worker gone, its replacement added (version + 1)
    replacement: int  # ID of the new worker


@dataclass
class Rejoin:
    """What to do once the replacement is attached."""

    worker: int
    routes: dict[int, list[Route]]  # predecessor (and the replacement) -> its routes
    # UPSTREAM body for the replacement: its senders as they are now.  It was started
    # from the physical topology its agent read, which can predate other replacements
    # (several workers die at once): it would wait for a dead sender's anchors and EOS.
    upstream: dict[str, Any]


def senders_to(topology: Topology, physical: PhysicalTopology, node: str) -> list[int]:
    """Active workers of every node that sends to ``node``."""
    srcs = {s.src for s in topology.inputs_of(node)}
    return sorted(w.worker_id for n in srcs for w in physical.active_of_node(n))


def receivers_from(topology: Topology, physical: PhysicalTopology, node: str) -> list[int]:
    """Active workers of every node that ``node`` sends to."""
    dsts = {s.dst for s in topology.outputs_of(node)}
    return sorted(w.worker_id for n in dsts for w in physical.active_of_node(n))


def without(physical: PhysicalTopology, worker_ids: Collection[int]) -> PhysicalTopology:
    """``physical`` minus some workers (same version: a view for computing routes)."""
    kept = [w for w in physical.workers if w.worker_id not in worker_ids]
    return replace(physical, workers=kept)


def reroute(
    topology: Topology, physical: PhysicalTopology, dead: int, pending: Collection[int] = ()
) -> dict[int, list[Route]]:
    """Sender -> its routes without ``dead`` and without replacements not attached yet."""
    node = physical.by_id(dead).node
    reachable = without(physical, {dead, *pending})
    return {p: routes_for(topology, reachable, p) for p in senders_to(topology, reachable, node)}


def failover(
    topology: Topology,
    physical: PhysicalTopology,
    dead: int,
    hosts: list[str],
    first_port: int,
    *,
    avoid: Collection[tuple[str, int]] = (),
    min_id: int = 1,
    pending: Collection[int] = (),
    closed: Collection[str] = (),
) -> Failover:
    """Plan the reaction to ``dead``; ``pending`` are replacements not attached yet.

    Routes leave out the dead worker and every pending replacement (a sender
    must not write to a port nobody listens on yet).  The replacement is placed
    by the scheduler's ``reschedule`` like any new worker of a reconfiguration:
    a fresh ID above every used one, never the dead worker's (host, port), whose
    TAP may not be gone from the bridge yet.  ``closed`` hosts get no replacement
    (:func:`silent_host`).
    """
    w = physical.by_id(dead)
    if not w.active:
        raise ValueError(f"worker {dead} is draining: the reconfiguration owns it")
    routes = reroute(topology, physical, dead, pending)
    receivers = receivers_from(topology, without(physical, {dead, *pending}), w.node)
    new = reschedule(
        topology,
        without(physical, {dead}),
        hosts,
        first_port,
        avoid={*avoid, (w.host, w.port)},
        min_id=min_id,
        closed=closed,
    )
    added = [x.worker_id for x in new.workers if x.node == w.node and x.index == w.index]
    if len(added) != 1:
        raise ValueError(f"the scheduler gave {w.node}[{w.index}] no single new worker")
    return Failover(dead, routes, receivers, new, added[0])


def silent_host(reason: str, exit_code: int | None, host: str) -> list[str]:
    """``[host]`` when the dead worker's agent is down too, so no replacement goes there.

    A port that went down means the worker's process is gone (its TAP went with
    it), and a running agent reports that exit within its poll interval.  No
    exit status within ``confirm_timeout`` then means the agent, or the whole
    machine, is down: a replacement placed there would never start.  After a
    heartbeat timeout the process may still be alive (hung), so nothing is said.
    """
    return [host] if exit_code is None and reason.startswith("port") else []


def lost_hosts(
    hosts: Iterable[str],
    connected: Collection[str | None],
    heartbeats: Mapping[str, float | None],
    now: float,
    timeout: float,
) -> set[str]:
    """The ``hosts`` that lost power (or their network): the switch is not connected and
    the agent has written no heartbeat for ``timeout`` seconds (``None``: its record is
    gone, or it never had one).

    Either sign alone proves nothing: switches reconnect after a controller restart while
    their workers run on, and an agent restarts while its workers and switch stay up.
    Both together mean nothing on the host can be reached: a worker there that falls
    silent is dead, not waiting for a receiver's credit, and a replacement placed there
    would never start.  ``now`` and the heartbeats are wall-clock times (``time.time()``
    on the agent's host: the hosts' clocks must agree to well within ``timeout``).
    """
    return {
        h
        for h in hosts
        if h not in connected and ((beat := heartbeats.get(h)) is None or now - beat > timeout)
    }


def rejoin(
    topology: Topology,
    physical: PhysicalTopology,
    worker: int,
    pending: Collection[int] = (),
    gone: Collection[int] = (),
) -> Rejoin:
    """Plan bringing the attached replacement ``worker`` into routing.

    Other replacements still starting (``pending``) stay out of the routes; they
    route to ``worker`` once they rejoin themselves.  The replacement gets its own
    routes too, and its senders as an UPSTREAM (``gone``: dead workers it may still
    expect); ``reopen`` false, so a sender whose end of stream already came is not
    awaited again.
    """
    node = physical.by_id(worker).node
    reachable = without(physical, set(pending) - {worker})
    routes = {p: routes_for(topology, reachable, p) for p in senders_to(topology, reachable, node)}
    if topology.outputs_of(node):
        routes[worker] = routes_for(topology, reachable, worker)
    senders = senders_to(topology, physical, node)
    remove = sorted(set(gone) - set(senders))
    return Rejoin(worker, routes, {"add": senders, "remove": remove, "reopen": False})


def held_up_by_receivers(
    topology: Topology,
    physical: PhysicalTopology,
    silent: Collection[int],
    suspect: Collection[int] = (),
) -> set[int]:
    """The ``silent`` workers whose silence a receiver of theirs explains.

    A sender that waits for a receiver's credit reads no control tuple until
    the wait ends (the transport's credit timeout), so a receiver that hangs
    without its port going down silences its senders too.  Those are not dead:
    only workers none of whose receivers is silent or ``suspect`` (a dead worker
    or its replacement while the failover runs) are.  The others get a new
    window once the receiver is handled.
    """
    silent = set(silent)
    blamed = silent | set(suspect)
    held = set()
    for wid in silent:
        try:
            node = physical.by_id(wid).node
        except KeyError:
            continue
        dsts = {s.dst for s in topology.outputs_of(node)}
        receivers = {w.worker_id for w in physical.workers if w.node in dsts}
        if receivers & blamed:
            held.add(wid)
    return held


def no_recovery(topology: Topology, conf: FaultSettings) -> str:
    """Why a controller with these settings cannot keep ``topology``'s guarantee, in
    one sentence (a submission is refused with it), or '' if it can or none is asked."""
    guarantee = topology.config.get("guarantee", DEFAULTS.guarantee)
    if guarantee in (None, "none"):
        return ""
    head = f"application '{topology.name}' asks for guarantee {guarantee}, but this controller"
    if not conf.replace:
        return (
            f"{head} does not replace dead workers ([fault_detector] replace = false); "
            "set it to true"
        )
    if not conf.port_events and conf.heartbeat_timeout <= 0:
        return (
            f"{head} detects no dead worker ([fault_detector] port_events = false and "
            "heartbeat_timeout = 0); turn one of them on"
        )
    return ""


# a worker's states (its agent's status) in which it reads and writes tuples
LIVE = ("attached", "running")


def crashed(state: str, exit_code: int | None) -> bool:
    """A worker its agent saw exit with an error: it will send no METRIC_RESP any more,
    so the heartbeat keeps watching it (and catches it if no port event did)."""
    return state == "exited" and exit_code not in (0, None)


@dataclass
class Heartbeats:
    """Last METRIC_RESP time of each worker; ``stale`` names the silent ones.

    A worker is only judged once it was seen (or watched) for ``timeout``
    seconds, so a worker that just started is not declared dead before its
    first reply could arrive.

    Silence counts only while the controller hears others.  It is measured up
    to the last reply heard from any worker, not up to now, and a gap longer
    than ``quiet`` in which no reply at all was heard is forgiven to everyone:
    a controller that did not run (a blocking call on its event loop, CPU
    starvation) or whose switch connections stalled read nobody's replies,
    and after it the queued replies arrive in any order.  So a worker is
    declared dead only after others were heard for ``timeout`` seconds without
    it; a cluster-wide hang is left to port events and the agents' exit codes.
    """

    timeout: float
    quiet: float = 1.0  # the longest normal gap between two replies from anyone
    last: dict[tuple[str, int], float] = field(default_factory=dict)
    heard: float | None = None  # the last reply from any worker
    unheard_s: float = 0.0  # gaps without any reply, forgiven so far
    excused: dict[tuple[str, int], float] = field(default_factory=dict)  # ... since its reply

    def seen(self, app: str, worker: int, at: float) -> None:
        """A METRIC_RESP from ``worker``, read at ``at``."""
        if self.heard is not None and at - self.heard > self.quiet:
            gap = at - self.heard - self.quiet  # nobody was heard: nobody was silent
            self.unheard_s += gap
            for k, t in self.last.items():
                self.last[k] = min(t + gap, at)
                self.excused[k] = self.excused.get(k, 0.0) + self.last[k] - t
        self.last[(app, worker)] = at
        self.excused.pop((app, worker), None)
        self.heard = at if self.heard is None else max(self.heard, at)

    def restart(self, app: str, worker: int, now: float) -> None:
        """Give ``worker`` a new allowance (no reply was heard)."""
        self.last[(app, worker)] = now
        self.excused.pop((app, worker), None)

    def watch(self, app: str, workers: Iterable[int], now: float) -> None:
        """Track these workers of ``app`` (first watch counts as a reply); forget others."""
        workers = set(workers)
        for key in [k for k in self.last if k[0] == app and k[1] not in workers]:
            del self.last[key]
            self.excused.pop(key, None)
        for w in workers:
            self.last.setdefault((app, w), now)

    def forget(self, app: str, worker: int | None = None) -> None:
        for key in [k for k in self.last if k[0] == app and worker in (None, k[1])]:
            del self.last[key]
            self.excused.pop(key, None)

    def stale(self, now: float) -> list[tuple[str, int, float]]:
        """(app, worker, seconds silent) of every worker silent for longer than the timeout."""
        if self.heard is None:  # nobody heard yet: nobody can be told apart
            return []
        until = min(now, self.heard)
        return sorted(
            (app, w, until - t) for (app, w), t in self.last.items() if until - t > self.timeout
        )


@dataclass
class Incident:
    """One dead worker and what the detector did about it (``GET /typhoon/faults``).

    Times are the controller's monotonic clock; ``*_ms`` are measured from
    ``detected`` (the port event, or the moment the heartbeat ran out).
    """

    app: str
    worker: int
    node: str
    reason: str  # "port deleted", "port link_down", "no METRIC_RESP for 5.0 s"
    detected: float
    detected_wall: float  # time.time() of ``detected``, to compare with other machines' clocks
    state: str = "rerouting"  # rerouting | replacing | rejoined | finished | failed
    senders: list[int] = field(default_factory=list)
    reroute_ms: float | None = None  # ROUTING PacketOuts to every sender written
    reroute_acked_ms: float | None = None  # every sender confirmed the new routes
    replacement: int | None = None
    replaced_ms: float | None = None  # physical topology with the replacement written
    rejoined_ms: float | None = None  # replacement attached and routed to again
    exit_code: int | None = None
    detail: str = ""
    host: str = ""  # where the dead worker ran
    # heartbeat only: time added to its silence allowance because nobody was heard
    unheard_s: float = 0.0
    # guaranteed processing: the generation every worker rolls back as, to this epoch
    # (None: from the start); rolled_back: the live workers sent ROLLBACK (the
    # replacement starts restored); rolled_back_ms: every one of them confirmed it
    generation: int | None = None
    restore_epoch: int | None = None
    rolled_back: list[int] = field(default_factory=list)
    rolled_back_ms: float | None = None
    # region failover (controller/recovery/region_recovery.py): "region" when only the failed
    # worker's failover region rolls back, "global" when that region is the whole job;
    # region: its workers (the replacement included); replayed: source worker -> tuples
    # it emitted again after its rollback (from its METRIC_RESP)
    rollback: str = ""
    region: list[int] = field(default_factory=list)
    replayed: dict[int, int] = field(default_factory=dict)
    # partial rollback (controller/recovery/partial_recovery.py): "partial" in ``rollback``, region:
    # the failed worker and its downstream closure; replayers: sender -> members it resent
    # its output buffers to; fallback: why a partial app took the region path instead
    replayers: dict[int, list[int]] = field(default_factory=dict)
    fallback: str = ""
    # what the failure cost the results (typhoon/sink_rates.py): sinks: the sink nodes
    # the dead worker's node reaches; sink_rate_before: their tuples/s before (median of
    # 1 s windows); sink_rate_lowest: their lowest 1 s window since; back_at_80_ms: from
    # the detection to the first 1 s window at >= 80% of before (None: not yet, or never)
    sinks: list[str] = field(default_factory=list)
    sink_rate_before: float | None = None
    sink_rate_lowest: float | None = None
    back_at_80_ms: float | None = None

    def to_dict(self) -> dict[str, object]:
        d = dict(self.__dict__)
        for k, v in d.items():
            if isinstance(v, float) and (k.endswith("_ms") or k.startswith("sink_rate")):
                d[k] = round(v, 2)
        return d
