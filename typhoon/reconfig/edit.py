"""The new logical topology of a request, checked like a topology file.

:func:`apply_request` edits a copy of the running topology; :func:`check_topology`
runs the loader's checks on it (through a regenerated YAML document) while
keeping the stream IDs the running workers know, and refuses what running
workers could not follow (other input fields, a moved load-balancer address).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from typhoon.operators import OperatorError, import_refusal, resolve_operator
from typhoon.reconfig.requests import (
    Insert,
    Move,
    ReconfigError,
    Remove,
    Request,
    Reroute,
    Scale,
    Swap,
)
from typhoon.topology.chaining import plan_chains
from typhoon.topology.loader import load_topology_text
from typhoon.topology.model import DEFAULT_STREAM, GROUPINGS, Grouping, Node, Stream, Topology
from typhoon.topology.routing import node_index
from typhoon.topology.schema import ID_PATTERN, TopologyError


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


def scaled_together(topology: Topology, name: str) -> list[str]:
    """``name``, or every node of its chain (a chain's forward edges pair worker i with
    worker i, so the chain scales as a whole: new instances are new processes)."""
    chain = next((c for c in plan_chains(topology) if name in c), [name])
    spouts = [n for n in chain if topology.nodes[n].kind == "spout"]
    if spouts:
        raise ReconfigError(
            f"scaling '{name}' scales its whole chain ({', '.join(chain)}: forward pairs worker "
            f"i with worker i), but '{spouts[0]}' is a spout, which cannot be rescaled at run "
            "time; kill and submit the application again",
            409,
        )
    return chain


def apply_request(topology: Topology, request: Request) -> tuple[Topology, set[str]]:
    """(new logical topology, nodes whose workers are all replaced); checks the request."""
    t = copy.deepcopy(topology)
    if isinstance(request, Scale):
        node = _bolt(t, request.node, "rescaled")
        if node.parallelism == request.parallelism:
            raise ReconfigError(f"'{node.name}' already has parallelism {node.parallelism}")
        for name in scaled_together(t, node.name):
            _check_direct_tables(t, name, request.parallelism)
            t.nodes[name].parallelism = request.parallelism
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
    if isinstance(request, Move):  # the logical topology stays; typhoon.reconfig.move
        return t, set()
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
        if s.columns:
            d["columns"] = dict(s.columns)
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
        refusal = import_refusal(n.operator, known, allow_imports)
        if refusal:
            raise ReconfigError(refusal)
    imports = allow_imports or any(":" in op for op in known)
    text = yaml.safe_dump(topology_document(t), sort_keys=False)
    try:
        loaded = load_topology_text(text, "<reconfiguration>", allow_imports=imports, env="keep")
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
