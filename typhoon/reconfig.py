"""Dynamic topology manager: a reconfiguration request -> the steps of a stable update.

Pure logic (paper §3.2 last part, §3.5, Fig. 6; DESIGN §5): it reads nothing
and sends nothing.  :func:`parse_request` checks a JSON request,
:func:`plan` turns it and the running application into a :class:`Plan`: the
new logical topology, the physical topology *during* the update (new
workers added, removed ones ``draining``: they keep their rules and process,
no route sends to them), the final one, and the ordered steps the
controller's executor runs, each confirmed before the next.

One procedure serves every request (scale, reroute, swap, insert, remove),
because each one is "some workers join, some leave, some routes change":

1. keep the old rules while the update runs (make before break: a stream
   that disappears or changes to/from ``all`` still has its rules);
2. write the new topology and the transition physical topology; agents
   launch the new workers (wait: ``attached``); the controller installs their
   rules (wait: barrier answered);
3. UPSTREAM to staying workers that get new senders, so that none finishes
   before the newcomers' end of stream (acked);
4. stateful receivers (``stateful: true``, key-routed in-memory cache): SIGNAL
   flush before the remap (paper), ROUTING, SIGNAL flush again: what came in
   under the old key mapping leaves the cache before the new mapping fills it,
   so no key's partial state is split across the remap;
5. ROUTING to the staying senders whose routes change (acked);
6. *commit*: the point of no return.  Up to here everything is undone on
   failure; after it the update only goes forward;
7. ROUTING again with ``release``: every sender sends end of stream to the
   receivers it dropped, right after its last tuple (acked);
8. DRAIN the removed workers (acked, or exited cleanly), write the final
   physical topology, wait until their agents stopped them, drop the old rules.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from typhoon.operators import OperatorError, resolve_operator
from typhoon.topology.loader import load_topology_text
from typhoon.topology.model import (
    DEFAULT_STREAM,
    GROUPINGS,
    Grouping,
    Node,
    PhysicalTopology,
    Stream,
    Topology,
    WorkerAssignment,
)
from typhoon.topology.routing import node_index, receivers_of, routes_for, upstream_of
from typhoon.topology.scheduler import reschedule
from typhoon.topology.schema import ID_PATTERN, TopologyError

MAX_PARALLELISM = 1000
KINDS = ("scale", "route", "swap", "insert", "remove")


class ReconfigError(Exception):
    """A request that cannot be planned; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


# ----- requests ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """Change a node's parallelism."""

    node: str
    parallelism: int


@dataclass(frozen=True)
class Reroute:
    """Change a stream's routing policy or key fields (stream: ID, 'SRC->DST' or 'SRC:DST')."""

    stream: int | str
    policy: str
    fields: tuple[str, ...] = ()
    table: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Swap:
    """Replace a node's computation logic: new workers with a new operator or arguments."""

    node: str
    operator: str
    args: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Insert:
    """Put a new node on the stream ``src`` -> ``dst``."""

    node: str
    operator: str
    src: str
    dst: str
    args: dict[str, Any] = field(default_factory=dict, hash=False)
    parallelism: int = 1
    grouping: str = "shuffle"  # of the new stream src -> node
    fields: tuple[str, ...] = ()
    stateful: bool = False


@dataclass(frozen=True)
class Remove:
    """Take a node with one input and one output out; its input goes straight to its output."""

    node: str


Request = Scale | Reroute | Swap | Insert | Remove


def _need(body: dict, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in body:
        raise ReconfigError(f"'{key}' is missing: give {what}")
    value = body[key]
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in _tuple(kind):
        raise ReconfigError(f"'{key}' must be {what}")
    return value


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _name(body: dict, key: str, what: str = "a node name") -> str:
    value = _need(body, key, str, what)
    if not value:
        raise ReconfigError(f"'{key}' must be {what}")
    return value


def _parallelism(body: dict, key: str = "parallelism") -> int:
    n = _need(body, key, int, f"an integer from 1 to {MAX_PARALLELISM}")
    if not 1 <= n <= MAX_PARALLELISM:
        raise ReconfigError(f"'{key}' must be an integer from 1 to {MAX_PARALLELISM}, not {n}")
    return n


def _fields(body: dict) -> tuple[str, ...]:
    if "fields" not in body:
        return ()
    value = body["fields"]
    if not isinstance(value, list) or not all(isinstance(f, str) and f for f in value):
        raise ReconfigError("'fields' must be a list of field names")
    return tuple(value)


def _args(body: dict) -> dict[str, Any]:
    value = body.get("args", {})
    if not isinstance(value, dict):
        raise ReconfigError("'args' must be a JSON object of operator arguments")
    return copy.deepcopy(value)


def parse_request(kind: str, body: Any) -> Request:
    """A checked request from a JSON body; ReconfigError (400) says what is wrong."""
    if kind not in KINDS:
        raise ReconfigError(f"unknown reconfiguration '{kind}' (one of {', '.join(KINDS)})", 404)
    if not isinstance(body, dict):
        raise ReconfigError("request body must be a JSON object")
    allowed = {
        "scale": {"node", "parallelism"},
        "route": {"stream", "policy", "fields", "table"},
        "swap": {"node", "operator", "args"},
        "insert": {"node", "operator", "args", "parallelism", "from", "to", "grouping"}
        | {"fields", "stateful"},
        "remove": {"node"},
    }[kind]
    unknown = sorted(str(k) for k in set(body) - allowed)
    if unknown:
        raise ReconfigError(
            f"unknown field(s) {', '.join(unknown)} for '{kind}' "
            f"(it takes {', '.join(sorted(allowed))})"
        )
    if kind == "scale":
        return Scale(_name(body, "node"), _parallelism(body))
    if kind == "route":
        stream = _need(body, "stream", (int, str), "a stream ID or 'SRC->DST'")
        policy = _name(body, "policy", f"one of {', '.join(GROUPINGS)}")
        table = body.get("table", {})
        if not isinstance(table, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in table.values()
        ):
            raise ReconfigError("'table' must map key values to worker indexes (integers >= 0)")
        return Reroute(stream, policy, _fields(body), tuple(sorted(table.items())))
    if kind == "swap":
        return Swap(_name(body, "node"), _name(body, "operator", "an operator name"), _args(body))
    if kind == "insert":
        grouping = body.get("grouping", "shuffle")
        if not isinstance(grouping, str):
            raise ReconfigError("'grouping' must be a grouping name such as 'shuffle'")
        stateful = body.get("stateful", False)
        if not isinstance(stateful, bool):
            raise ReconfigError("'stateful' must be true or false")
        return Insert(
            _name(body, "node"),
            _name(body, "operator", "an operator name"),
            _name(body, "from"),
            _name(body, "to"),
            _args(body),
            _parallelism(body) if "parallelism" in body else 1,
            grouping,
            _fields(body),
            stateful,
        )
    return Remove(_name(body, "node"))


def describe(request: Request) -> str:
    """One line for status reports and logs."""
    if isinstance(request, Scale):
        return f"scale {request.node} to {request.parallelism}"
    if isinstance(request, Reroute):
        keys = f" on {', '.join(request.fields)}" if request.fields else ""
        return f"route stream {request.stream} by {request.policy}{keys}"
    if isinstance(request, Swap):
        return f"swap {request.node} to {request.operator} {request.args}"
    if isinstance(request, Insert):
        return f"insert {request.node} ({request.operator}) between {request.src} and {request.dst}"
    return f"remove {request.node}"


# ----- the new logical topology --------------------------------------------------------------


def find_stream(topology: Topology, ref: int | str) -> Stream:
    """A stream by ID, 'SRC->DST' or 'SRC:DST'; ReconfigError (404) if there is none."""
    if isinstance(ref, int):
        found = [s for s in topology.streams if s.id == ref]
    else:
        text = ref.strip()
        if text.isdigit():
            return find_stream(topology, int(text))
        sep = "->" if "->" in text else ":"
        src, _, dst = text.partition(sep)
        found = [s for s in topology.streams if s.src == src.strip() and s.dst == dst.strip()]
    if not found:
        have = ", ".join(f"{s.id} ({s.src}->{s.dst})" for s in topology.streams)
        raise ReconfigError(f"no stream {ref!r} in '{topology.name}' (streams: {have})", 404)
    if len(found) > 1:
        raise ReconfigError(f"'{ref}' names {len(found)} streams; give the stream ID")
    return found[0]


def _node(topology: Topology, name: str) -> Node:
    node = topology.nodes.get(name)
    if node is None:
        have = ", ".join(topology.nodes)
        raise ReconfigError(f"no node named '{name}' in '{topology.name}' (nodes: {have})", 404)
    return node


def _bolt(topology: Topology, name: str, verb: str) -> Node:
    node = _node(topology, name)
    if node.kind == "spout":
        raise ReconfigError(
            f"'{name}' is a spout and cannot be {verb} at run time: its workers split the "
            "input by worker index; kill and submit the application again"
        )
    return node


def apply_request(topology: Topology, request: Request) -> tuple[Topology, set[str]]:
    """(new logical topology, nodes whose workers are all replaced); checks the request."""
    t = copy.deepcopy(topology)
    if isinstance(request, Scale):
        node = _bolt(t, request.node, "rescaled")
        if node.parallelism == request.parallelism:
            raise ReconfigError(f"'{node.name}' already has parallelism {node.parallelism}")
        _check_direct_tables(t, node.name, request.parallelism)
        node.parallelism = request.parallelism
        return t, set()
    if isinstance(request, Reroute):
        s = find_stream(t, request.stream)
        policy = request.policy.lower()
        if policy not in GROUPINGS:
            raise ReconfigError(
                f"unknown policy '{request.policy}' (one of {', '.join(GROUPINGS)})"
            )
        g = Grouping(policy, request.fields, {str(k): v for k, v in request.table})
        if g == s.grouping:
            raise ReconfigError(f"stream {s.id} ({s.src}->{s.dst}) already routes that way")
        s.grouping = g
        return t, set()
    if isinstance(request, Swap):
        node = _bolt(t, request.node, "swapped")
        if node.engine != "python":
            raise ReconfigError(f"'{node.name}' runs on {node.engine}: only python nodes swap")
        if (node.operator, node.args) == (request.operator, request.args):
            raise ReconfigError(f"'{node.name}' already runs {node.operator} with these args")
        node.operator, node.args = request.operator, dict(request.args)
        return t, {node.name}
    if isinstance(request, Insert):
        return _insert(t, request), set()
    return _remove(t, request), set()


def _check_direct_tables(t: Topology, node: str, parallelism: int) -> None:
    for s in t.inputs_of(node):
        bad = [k for k, i in s.grouping.table.items() if i >= parallelism]
        if bad:
            raise ReconfigError(
                f"stream {s.id} sends key(s) {', '.join(bad)} to worker indexes that "
                f"parallelism {parallelism} would remove; change its table first"
            )


def _insert(t: Topology, r: Insert) -> Topology:
    if not re.match(ID_PATTERN, r.node):
        raise ReconfigError(f"'{r.node}' is not a valid node name")
    if r.node in t.nodes:
        raise ReconfigError(f"'{t.name}' already has a node named '{r.node}'")
    old = [s for s in t.streams if s.src == r.src and s.dst == r.dst]
    if not old:
        _node(t, r.src), _node(t, r.dst)
        raise ReconfigError(f"no stream from '{r.src}' to '{r.dst}' to insert '{r.node}' into")
    if len(old) > 1:
        raise ReconfigError(f"'{r.src}' sends to '{r.dst}' on several streams; cannot insert")
    s = old[0]
    t.nodes[r.node] = Node(
        r.node, "bolt", r.operator, dict(r.args), r.parallelism, stateful=r.stateful
    )
    policy = r.grouping.lower()
    if policy not in GROUPINGS:
        raise ReconfigError(f"unknown grouping '{r.grouping}' (one of {', '.join(GROUPINGS)})")
    after = Stream(max(x.id for x in t.streams) + 1, r.node, r.dst, s.grouping)
    s.dst, s.grouping = r.node, Grouping(policy, r.fields)  # the sender keeps its stream ID
    t.streams.append(after)
    return t


def _remove(t: Topology, r: Remove) -> Topology:
    node = _bolt(t, r.node, "removed")
    ins, outs = t.inputs_of(node.name), t.outputs_of(node.name)
    if len(ins) != 1 or len(outs) != 1:
        raise ReconfigError(
            f"'{node.name}' has {len(ins)} input and {len(outs)} output streams; only a node "
            "with one of each can be taken out"
        )
    s, after = ins[0], outs[0]
    if any(x.src == s.src and x.dst == after.dst for x in t.streams):
        raise ReconfigError(f"'{s.src}' already sends to '{after.dst}'")
    if after.name != DEFAULT_STREAM:
        raise ReconfigError(f"'{node.name}' emits on a named stream; cannot bypass it")
    s.dst, s.grouping = after.dst, after.grouping  # the receiver keeps its key semantics
    t.streams.remove(after)
    del t.nodes[node.name]
    return t


def topology_document(t: Topology) -> dict[str, Any]:
    """The YAML document of a topology (streams in ID order), for the loader to check."""

    def node(n: Node) -> dict[str, Any]:
        d: dict[str, Any] = {"id": n.name, "operator": n.operator, "parallelism": n.parallelism}
        if n.args:
            d["args"] = n.args
        if n.engine != "python":
            d["engine"] = n.engine
        if n.stateful:
            d["stateful"] = True
        return d

    def stream(s: Stream) -> dict[str, Any]:
        g: dict[str, Any] = {"type": s.grouping.type}
        if s.grouping.fields:
            g["fields"] = list(s.grouping.fields)
        if s.grouping.table:
            g["table"] = dict(s.grouping.table)
        d: dict[str, Any] = {"from": s.src, "to": s.dst, "grouping": g}
        if s.name != DEFAULT_STREAM:
            d["stream"] = s.name
        return d

    return {
        "name": t.name,
        "config": t.config,
        "spouts": [node(n) for n in t.nodes.values() if n.kind == "spout"],
        "bolts": [node(n) for n in t.nodes.values() if n.kind == "bolt"],
        "streams": [stream(s) for s in sorted(t.streams, key=lambda s: s.id)],
    }


def check_topology(t: Topology, old: Topology, allow_imports: bool = False) -> Topology:
    """Run the loader's checks on ``t`` and fill in output fields; keeps ``t``'s stream IDs.

    Without ``allow_imports`` only operators the running topology already used
    may be ``module:Class`` references.  Nodes with new logic are built once,
    so bad argument values fail here and not in a worker.  Running workers
    keep the fields they were started with, so a node whose input fields
    would change under them is refused.
    """
    known = {n.operator for n in old.nodes.values()}
    fresh = [
        n
        for n in t.nodes.values()
        if n.name not in old.nodes
        or (n.operator, n.args) != (old.nodes[n.name].operator, old.nodes[n.name].args)
    ]
    for n in fresh:
        if ":" in n.operator and n.operator not in known and not allow_imports:
            raise ReconfigError(
                f"operator '{n.operator}' would import code; only built-in operators are "
                "allowed here"
            )
    imports = allow_imports or any(":" in op for op in known)
    text = yaml.safe_dump(topology_document(t), sort_keys=False)
    try:
        loaded = load_topology_text(text, "<reconfiguration>", allow_imports=imports)
    except TopologyError as e:
        raise ReconfigError(f"the new topology is not valid: {e.message}") from None
    for n in fresh:
        if ":" in n.operator:
            continue
        try:
            resolve_operator(n.operator)(**n.args)
        except (TypeError, ValueError, OperatorError) as e:
            raise ReconfigError(f"'{n.name}': bad arguments for {n.operator} ({e})") from None
    for name, node in t.nodes.items():
        node.output_fields = loaded.nodes[name].output_fields
        node.line = old.nodes[name].line if name in old.nodes else 0
    for name in t.nodes:
        if name not in old.nodes:
            continue
        before, after = _input_fields(old, name), _input_fields(t, name)
        if before != after:
            raise ReconfigError(
                f"'{name}' would get input fields {after} instead of {before}, which its "
                "running workers cannot read"
            )
        if t.nodes[name].output_fields != old.nodes[name].output_fields and any(
            s.dst in old.nodes for s in t.outputs_of(name)
        ):
            raise ReconfigError(
                f"'{name}' would emit fields {list(t.nodes[name].output_fields)} instead of "
                f"{list(old.nodes[name].output_fields)}, which its receivers cannot read"
            )
    for s in t.streams:
        if s.grouping.type == "sdn" and s.dst in old.nodes:
            if node_index(t, s.dst) != node_index(old, s.dst):
                raise ReconfigError(
                    f"stream {s.id} is load-balanced by the switch to '{s.dst}', whose "
                    "address would change; reroute it first"
                )
    return t


def _input_fields(t: Topology, name: str) -> list[str]:
    ins = t.inputs_of(name)
    return list(t.nodes[ins[0].src].output_fields) if ins else []


# ----- the plan ------------------------------------------------------------------------------

ACTIONS = (
    "keep_rules",  # the old rules stay installed until drop_rules
    "write",  # new logical topology + transition physical topology to the coordinator
    "wait_attached",  # agents launched the new workers and attached their ports
    "wait_rules",  # the controller compiled the written version and every switch holds it
    "control",  # control tuples to workers, each acked (or the worker exited cleanly)
    "commit",  # the point of no return
    "drain",  # DRAIN, acked or exited cleanly
    "write_final",  # the physical topology without the drained workers
    "wait_stopped",  # no agent supervises the drained workers any more
    "drop_rules",  # only the new topology's rules stay
)


@dataclass
class Step:
    action: str
    what: str  # one sentence, for the status report
    workers: list[int] = field(default_factory=list)
    control: str = ""  # control type of a "control" step
    bodies: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # no "version"

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "what": self.what, "workers": list(self.workers)}


@dataclass
class Plan:
    request: Request
    old_topology: Topology
    old_physical: PhysicalTopology
    topology: Topology  # the new logical topology
    physical: PhysicalTopology  # during the update: new workers plus draining ones
    final: PhysicalTopology  # after it
    added: list[int]
    removed: list[int]
    steps: list[Step]

    def summary(self) -> str:
        return (
            f"{describe(self.request)}: +{len(self.added)} -{len(self.removed)} workers, "
            f"{len(self.steps)} steps"
        )


def _flat(d: dict[int, list[int]]) -> set[int]:
    return {w for ws in d.values() for w in ws}


def _route_key(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "version"}


def plan(
    request: Request,
    topology: Topology,
    physical: PhysicalTopology,
    hosts: list[str],
    first_port: int,
    avoid: set[tuple[str, int]] | frozenset = frozenset(),
    exited: set[int] | frozenset = frozenset(),
    allow_imports: bool = False,
    min_id: int = 1,
) -> Plan:
    """Every step of the stable update of ``request`` (module docstring).

    ``exited``: workers whose process already ended (a finished source, say);
    they get no control tuples, and new workers do not wait for them.
    ``min_id``: the lowest worker ID never used by the application.
    """
    if physical.draining():
        raise ReconfigError(
            f"'{topology.name}' still has draining workers from an earlier update", 409
        )
    new_topo, replace = apply_request(topology, request)
    new_topo = check_topology(new_topo, topology, allow_imports)
    try:
        placed = reschedule(
            new_topo, physical, hosts, first_port, replace=replace, avoid=avoid, min_id=min_id
        )
    except ValueError as e:
        raise ReconfigError(f"cannot place the workers: {e}", 409) from None
    kept = {w.worker_id for w in placed.workers}
    removed = [w for w in physical.workers if w.worker_id not in kept]
    draining = [
        WorkerAssignment(w.worker_id, w.node, w.index, w.host, w.port, "draining") for w in removed
    ]
    trans = PhysicalTopology(
        physical.name,
        physical.app_id,
        sorted(placed.workers + draining, key=lambda w: w.worker_id),
        physical.version + 1,
    )
    final = PhysicalTopology(physical.name, physical.app_id, placed.workers, trans.version + 1)
    old_ids = {w.worker_id for w in physical.workers}
    added = [w.worker_id for w in placed.workers if w.worker_id not in old_ids]
    removed_ids = [w.worker_id for w in removed]
    staying = [w.worker_id for w in placed.workers if w.worker_id in old_ids]
    live = [w for w in staying if w not in exited]

    steps = [Step("keep_rules", "keep the current rules while the update runs")]
    steps.append(
        Step("write", f"write the new topology and physical version {trans.version}", added)
    )
    if added:
        steps.append(Step("wait_attached", "agents launch and attach the new workers", added))
    steps.append(Step("wait_rules", "the controller installs the rules of the new workers"))

    # new workers must not wait for senders that already finished
    gone_for_new = []
    for w in added:
        gone = sorted(_flat(upstream_of(new_topo, trans, w)) & set(exited))
        if gone:
            gone_for_new.append((w, {"add": [], "remove": gone}))
    if gone_for_new:
        steps.append(
            Step(
                "control",
                "new workers stop waiting for senders that already finished",
                [w for w, _ in gone_for_new],
                "UPSTREAM",
                gone_for_new,
            )
        )

    upstream = []
    for w in live:
        new_up = _flat(upstream_of(new_topo, trans, w))
        old_up = _flat(upstream_of(topology, physical, w))
        add = sorted(new_up - old_up - set(exited))
        if add:
            upstream.append((w, {"add": add, "remove": []}))
    if upstream:
        steps.append(
            Step(
                "control",
                "staying workers learn their new senders (UPSTREAM)",
                [w for w, _ in upstream],
                "UPSTREAM",
                upstream,
            )
        )

    routing, release, remapped = [], [], set()
    for w in live:
        old_routes = {r.stream: r.to_body() for r in routes_for(topology, physical, w)}
        new_routes = {r.stream: r.to_body() for r in routes_for(new_topo, trans, w)}
        for sid, old_body in old_routes.items():
            if sid not in new_routes:  # the stream is gone: route it nowhere
                new_routes[sid] = {**old_body, "next_hops": [], "local": [], "table": {}}
        changed = [
            _route_key(b)
            for sid, b in sorted(new_routes.items())
            if _route_key(b) != _route_key(old_routes.get(sid, {}))
        ]
        for body in changed:
            routing.append((w, body))
            s = next((x for x in new_topo.streams if x.id == body["stream"]), None)
            old_s = next((x for x in topology.streams if x.id == body["stream"]), None)
            for st in (s, old_s):
                if st is not None:
                    remapped.add(st.dst)
        dropped = sorted(receivers_of(topology, physical, w) - receivers_of(new_topo, trans, w))
        if dropped:
            last = changed[-1] if changed else _route_key(next(iter(new_routes.values())))
            release.append((w, {**last, "release": dropped}))

    stateful = sorted(
        n
        for n in remapped
        if (n in new_topo.nodes and new_topo.nodes[n].stateful)
        or (n in topology.nodes and topology.nodes[n].stateful)
    )
    flush_before = [
        w.worker_id
        for n in (stateful if routing else [])
        for w in physical.of_node(n)
        if w.worker_id not in exited
    ]
    flush_after = [w for w in flush_before if w in staying]
    if flush_before:
        steps.append(
            Step(
                "control",
                f"SIGNAL: stateful {', '.join(stateful)} flush their cache before the remap",
                flush_before,
                "SIGNAL",
                [(w, {}) for w in flush_before],
            )
        )
    if routing:
        steps.append(
            Step(
                "control",
                "ROUTING: senders switch to the new routes",
                sorted({w for w, _ in routing}),
                "ROUTING",
                routing,
            )
        )
    if flush_after:
        steps.append(
            Step(
                "control",
                "SIGNAL: flush what arrived under the old key mapping",
                flush_after,
                "SIGNAL",
                [(w, {}) for w in flush_after],
            )
        )
    steps.append(Step("commit", "commit: from here on the update only goes forward"))
    if release:
        steps.append(
            Step(
                "control",
                "ROUTING with release: senders end the streams of the receivers they dropped",
                sorted({w for w, _ in release}),
                "ROUTING",
                release,
            )
        )
    to_drain = [w for w in removed_ids if w not in exited]
    if to_drain:
        steps.append(Step("drain", "DRAIN: removed workers finish what they hold", to_drain))
    if removed_ids:
        steps.append(Step("write_final", f"write physical version {final.version} without them"))
        steps.append(Step("wait_stopped", "agents stop the drained workers", removed_ids))
    steps.append(Step("drop_rules", "remove the rules nothing uses any more"))
    steps.append(Step("wait_rules", "every switch holds exactly the new rules"))
    return Plan(request, topology, physical, new_topo, trans, final, added, removed_ids, steps)


def estimate_timeout(plan_: Plan, per_step: float = 10.0) -> float:
    """A generous overall bound: every step may take ``per_step`` seconds."""
    return math.ceil(per_step * len(plan_.steps))
