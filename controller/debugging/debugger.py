"""Debug sessions of the live debugger: validation, ports, states, ring buffers.

Plain Python (no Ryu, no switch): the app in ``apps/live_debugger.py`` feeds it
requests, port events and the clock, and performs what it returns (write or
delete the session key, re-apply the mirror overlay, log the reason).

A session's life::

    starting   key written; the agent of the observed worker's host starts the
               debug worker and plugs its TAP in at the session's port
    mirroring  the switch reported that port up: mirror outputs are being installed
    live       the switches confirmed the rules (barrier): every copy now arrives
    ended      detached, timed out, debug worker gone, application or worker gone;
               mirrors removed at once, records kept ``keep_ended`` seconds

The ring buffer (last N records, memory taken only while a session exists,
paper Table 5) lives here, in the controller, where the CLI reads it.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

from controller.rules.mirror import EVERY_FRAME, MirrorTap
from controller.settings import setting
from typhoon.debug.filter import FilterError, check_fields, parse
from typhoon.debug.spec import DIRECTIONS, DebugSpec, debug_tap_name
from typhoon.operators import BUILTINS, import_refusal
from typhoon.topology.chaining import ChainedError, refuse_observing
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment

MAX_OFPORT = 0xFEFF  # highest port OVS assigns on request
MIRRORED_STATES = ("mirroring", "live")
_NODE_INDEX = re.compile(r"(?P<node>[A-Za-z0-9_.-]+?)(?:\[(?P<i1>\d+)\]|:(?P<i2>\d+))?")


class DebugError(Exception):
    """A request the debugger refuses: HTTP-like status and one sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    """The ``[live_debugger]`` section (``controller/settings.py``)."""

    section: ClassVar[str] = "live_debugger"

    max_sessions: int = setting(4, "sessions running at once")
    ring_size: int = setting(1000, "records kept per session unless `--last` says")
    max_ring_size: int = setting(100_000, "largest `--last` accepted")
    port_base: int = setting(65000, "first switch port for debug workers (up to 65279)")
    start_timeout: float = setting(20.0, "seconds for the debug worker's port to come up")
    idle_timeout: float = setting(120.0, "end a session nobody read for this long (0: never)")
    keep_ended: float = setting(60.0, "seconds an ended session stays readable")
    max_rate: int = setting(
        10_000, "records/s a debug worker sends to the controller; the rest are counted"
    )
    mirror_rate: int = setting(
        200, "frames/s the switch copies to a debug worker unless the attach says (`--rate`)"
    )
    max_mirror_rate: int = setting(10_000, "largest `--rate` accepted")
    allow_every_frame: bool = setting(
        True,
        "`--rate all` is accepted: no meter, the switch copies every frame of the observed "
        "worker (paper Fig. 12); what the debug port cannot take is dropped and counted",
    )
    # empty: through the coordinator, which every agent host reaches
    report_url: str = setting(
        "",
        "where debug workers POST their records; empty: they write them to the coordinator, "
        "which works from every agent host",
        shown="empty (the coordinator)",
    )
    silent_timeout: float = setting(
        10.0, "end a session whose debug worker sent nothing (not even statistics) this long"
    )
    allow_imports: bool = setting(
        False,
        "`--operator module:Class` may name code the application does not run (imported by "
        "the debug worker on the observed worker's host); off: built-in bolts and the "
        "application's own operators only",
    )


def resolve_worker(physical: PhysicalTopology, text: Any) -> WorkerAssignment:
    """A worker from its id (7, "7"), ``node[index]``, ``node:index`` or a 1-worker node."""
    if isinstance(text, int) and not isinstance(text, bool):
        wid = text
    elif isinstance(text, str) and text.strip().isdigit():
        wid = int(text)
    elif isinstance(text, str) and (m := _NODE_INDEX.fullmatch(text.strip())):
        workers = physical.of_node(m["node"])
        if not workers:
            raise DebugError(404, f"no node named '{m['node']}' in '{physical.name}'")
        index = m["i1"] or m["i2"]
        if index is None:
            if len(workers) != 1:
                raise DebugError(
                    400, f"node '{m['node']}' has {len(workers)} workers: say {m['node']}[0] etc."
                )
            return workers[0]
        found = [w for w in workers if w.index == int(index)]
        if not found:
            raise DebugError(404, f"node '{m['node']}' has no worker with index {index}")
        return found[0]
    else:
        raise DebugError(400, "'worker' must be a worker id or NODE[INDEX]")
    try:
        return physical.by_id(wid)
    except (KeyError, ValueError, StopIteration):
        raise DebugError(404, f"no worker {wid} in '{physical.name}'") from None


def mirror_rate(value: Any, limits: Limits) -> int | None:
    """The ``rate`` of an attach request: frames/s for the session's meter, or None for
    ``"all"`` (no meter: every frame copied) when ``allow_every_frame`` permits."""
    if value == EVERY_FRAME:
        if not limits.allow_every_frame:
            raise DebugError(
                403,
                "'rate': 'all' (every frame, no meter) is off on this controller "
                "([live_debugger] allow_every_frame = false): give a number of frames per second",
            )
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= limits.max_mirror_rate
    ):
        raise DebugError(
            400,
            f"'rate' must be an integer number of frames per second in "
            f"1..{limits.max_mirror_rate} (max_mirror_rate), or '{EVERY_FRAME}' for every frame",
        )
    return value


def observed_fields(topology: Topology, node: str, direction: str) -> set[str]:
    """The field names of the tuples a session on ``node`` sees (for checking filters)."""
    fields: set[str] = set()
    if direction in ("out", "both"):
        fields |= set(topology.nodes[node].output_fields)
    if direction in ("in", "both"):
        for s in topology.inputs_of(node):
            fields |= set(topology.nodes[s.src].output_fields)
    return fields


@dataclass
class Session:
    spec: DebugSpec
    dpid: int
    ring_size: int
    created: float
    last_read: float
    state: str = "starting"
    reason: str = ""
    ended_at: float | None = None
    mirrored_rules: int = 0
    error: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    # the switch's side (controller/rules/meters.py): frames its meter let through / left out,
    # and copies the debug port could not take (read every second while mirroring)
    switch: dict[str, int] = field(default_factory=dict)
    ring: deque[dict[str, Any]] = field(default_factory=deque)
    received: int = 0  # records ever received; the n of the newest one
    heard: float | None = None  # when the debug worker last sent a batch (records or stats)
    next_batch: int = 0  # the next batch to read from the coordinator (debug/transport.py)

    @property
    def id(self) -> str:
        return self.spec.session

    def tap(self, worker_port: int) -> MirrorTap:
        s = self.spec
        return MirrorTap(s.app_id, s.worker, worker_port, s.direction, s.port, s.rate)

    def meter_counted(self, packets_in: int, left_out: int) -> None:
        """The session's meter counters: frames it let through to the debug port and
        frames it left out (sampling)."""
        self.switch["switch_copied"] = packets_in - left_out
        self.switch["switch_sampled"] = left_out

    def port_counted(self, tx_packets: int, tx_dropped: int) -> None:
        """The debug port's counters: copies it could not take (``switch_dropped``); with
        no meter (``--rate all``) they also say what the switch copied, none sampled."""
        self.switch["switch_dropped"] = tx_dropped
        if self.spec.rate is None:
            self.switch["switch_copied"] = tx_packets + tx_dropped
            self.switch["switch_sampled"] = 0

    def ingest(self, records: list[dict[str, Any]]) -> None:
        """Number the records (1, 2, ...) and keep the newest ``ring_size``."""
        if self.ring.maxlen != self.ring_size:
            self.ring = deque(self.ring, maxlen=self.ring_size)
        for r in records:
            self.received += 1
            self.ring.append({"n": self.received, **r})

    def read(self, after: int, limit: int) -> dict[str, Any]:
        """Records numbered above ``after`` (oldest first); ``skipped``: fell out of the ring."""
        first = self.ring[0]["n"] if self.ring else self.received + 1
        start = max(0, after + 1 - first)
        records = list(itertools.islice(self.ring, start, start + max(0, limit)))
        return {
            "session": self.id,
            "state": self.state,
            "reason": self.reason,
            "records": records,
            "next": records[-1]["n"] if records else max(after, first - 1),
            "skipped": max(0, first - after - 1),
            "received": self.received,
        }

    def to_dict(self) -> dict[str, Any]:
        """What REST shows (never the session key)."""
        s = self.spec
        return {
            "session": self.id,
            "app": s.app,
            "worker": s.worker,
            "direction": s.direction,
            "filter": s.filter,
            "sample": s.sample,
            "rate": EVERY_FRAME if s.rate is None else s.rate,
            "operator": s.operator,
            "host": s.host,
            "port": s.port,
            "tap": s.tap,
            "state": self.state,
            "reason": self.reason,
            "error": self.error,
            "ring_size": self.ring_size,
            "received": self.received,
            "mirrored_rules": self.mirrored_rules,
            "stats": {**self.stats, **self.switch},
        }


class DebugSessions:
    """Every session the controller runs, keyed by id."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.sessions: dict[str, Session] = {}

    def active(self) -> list[Session]:
        return [s for s in self.sessions.values() if s.state != "ended"]

    def get(self, app: str, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is None or s.spec.app != app:
            raise DebugError(404, f"no debug session '{sid}' of '{app}'")
        return s

    def plan(
        self,
        name: str,
        topology: Topology,
        physical: PhysicalTopology,
        w: WorkerAssignment,
        dpid: int,
        used_ports: set[int],
        request: dict[str, Any],
        session_id: str,
        key: str,
        now: float,
    ) -> Session:
        """Validate an attach request on worker ``w`` and build its session (``starting``).

        ``used_ports``: the switch ports of ``w``'s host that workers hold.
        """
        lim = self.limits
        fields = {"worker", "direction", "filter", "sample", "last", "rate", "operator"}
        unknown = set(request) - fields
        if unknown:
            raise DebugError(400, f"unknown field(s): {', '.join(sorted(unknown))}")
        if len(self.active()) >= lim.max_sessions:
            raise DebugError(
                429, f"{lim.max_sessions} debug sessions already run (max_sessions): detach one"
            )
        if session_id in self.sessions:
            raise DebugError(409, f"session id {session_id} is taken")
        direction = request.get("direction", "out")
        if direction not in DIRECTIONS:
            raise DebugError(400, f"'direction' must be one of {', '.join(DIRECTIONS)}")
        try:  # a chained edge carries no frames to watch (typhoon/topology/chaining.py)
            refuse_observing(topology, physical, w.worker_id, direction)
        except ChainedError as e:
            raise DebugError(409, str(e)) from None
        text = request.get("filter") or ""
        if not isinstance(text, str):
            raise DebugError(400, "'filter' must be a string")
        try:
            check_fields(parse(text), observed_fields(topology, w.node, direction))
        except FilterError as e:
            raise DebugError(400, f"bad filter: {e}") from None
        sample = request.get("sample", 100.0)
        if (
            isinstance(sample, bool)
            or not isinstance(sample, (int, float))
            or not 0 < sample <= 100
        ):
            raise DebugError(400, "'sample' must be a percentage in (0, 100]")
        ring = request.get("last", lim.ring_size)
        if (
            isinstance(ring, bool)
            or not isinstance(ring, int)
            or not 1 <= ring <= lim.max_ring_size
        ):
            raise DebugError(400, f"'last' must be an integer in 1..{lim.max_ring_size}")
        rate = mirror_rate(request.get("rate", lim.mirror_rate), lim)
        operator = self._operator(topology, request.get("operator") or "")
        port = self._free_port(w.host, used_ports)
        spec = DebugSpec(
            session=session_id,
            app=name,
            app_id=physical.app_id,
            worker=w.worker_id,
            direction=direction,
            host=w.host,
            port=port,
            tap=debug_tap_name(session_id),
            report_url=lim.report_url,
            key=key,
            filter=text,
            sample=float(sample),
            rate=rate,
            operator=operator,
            workers={x.worker_id: (x.node, x.index) for x in physical.workers},
            fields={n.name: list(n.output_fields) for n in topology.nodes.values()},
            max_rate=lim.max_rate,
        )
        session = Session(spec, dpid, ring, now, now, ring=deque(maxlen=ring))
        self.sessions[session_id] = session
        return session

    def _operator(self, topology: Topology, name: Any) -> str:
        """The ``operator`` of a request, checked without importing anything here: a
        built-in bolt, or a ``module:Class`` the import gate lets through (the debug
        worker imports it, and says so if it is no bolt)."""
        if not isinstance(name, str):
            raise DebugError(400, "'operator' must be an operator name (built-in or module:Class)")
        if not name:
            return ""
        used = {n.operator for n in topology.nodes.values()}
        refusal = import_refusal(name, used, self.limits.allow_imports)
        if refusal:
            raise DebugError(
                403,
                f"{refusal} (or the application's own operators; [live_debugger] "
                "allow_imports = true in the controller's config allows any)",
            )
        if ":" not in name and name not in BUILTINS:
            raise DebugError(400, f"unknown operator '{name}' (a built-in bolt or module:Class)")
        if ":" not in name and BUILTINS[name].kind != "bolt":
            raise DebugError(400, f"operator '{name}' is a spout, not a bolt")
        return name

    def _free_port(self, host: str, used: set[int]) -> int:
        taken = used | {s.spec.port for s in self.active() if s.spec.host == host}
        for port in range(self.limits.port_base, MAX_OFPORT + 1):
            if port not in taken:
                return port
        raise DebugError(503, f"no free debug port on {host} from {self.limits.port_base}")

    def mirrors(self, worker_ports: dict[tuple[str, int], int]) -> list[tuple[Session, MirrorTap]]:
        """The sessions whose debug port is up, with their tap (on ``session.spec.host``).

        ``worker_ports``: (app, worker id) -> its current port; a session whose
        worker is not there any more mirrors nothing (the app ends it).
        """
        out = []
        for s in self.sessions.values():
            port = worker_ports.get((s.spec.app, s.spec.worker))
            if s.state in MIRRORED_STATES and port is not None:
                out.append((s, s.tap(port)))
        return out

    def end(self, session: Session, reason: str, now: float) -> bool:
        """Mark ended; False if it already was (nothing to undo)."""
        if session.state == "ended":
            return False
        session.state, session.reason, session.ended_at = "ended", reason, now
        return True

    def at_port(self, dpid: int, port: int) -> Session | None:
        """The session (not ended) whose debug worker sits on this switch port, if any."""
        for s in self.active():
            if s.dpid == dpid and s.spec.port == port:
                return s
        return None

    def expired(self, now: float) -> list[tuple[Session, str]]:
        """Sessions to end now, with the reason."""
        lim = self.limits
        out = []
        for s in self.active():
            if s.state == "starting" and now - s.created > lim.start_timeout:
                out.append((s, f"debug worker did not come up within {lim.start_timeout:g} s"))
            elif (
                s.state in MIRRORED_STATES
                and lim.silent_timeout > 0
                and now - (s.heard or s.created) > lim.silent_timeout
            ):
                out.append((s, f"the debug worker on {s.spec.host} sent nothing for "
                               f"{lim.silent_timeout:g} s: see its log on {s.spec.host} "
                               f"(WORKDIR/debug/{s.id}.log of the agent)"))  # fmt: skip
            elif lim.idle_timeout > 0 and now - s.last_read > lim.idle_timeout:
                out.append((s, f"no client read the session for {lim.idle_timeout:g} s"))
        return out

    def purge(self, now: float) -> list[Session]:
        """Forget ended sessions older than ``keep_ended``."""
        old = [
            s
            for s in self.sessions.values()
            if s.ended_at is not None and now - s.ended_at > self.limits.keep_ended
        ]
        for s in old:
            del self.sessions[s.id]
        return old
