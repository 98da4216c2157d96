"""Read a topology YAML file (Storm Flux vocabulary) into a checked :class:`Topology`.

Flux accepts streams that name undeclared components and finds out at run
time; we resolve every reference, operator and field here, so a file that
loads is a file that can be scheduled.  Every problem becomes one
``TopologyError`` whose text is ``file:line: sentence``, pointing at the YAML
line of the offending element (marks come from ``yaml.compose``).

Operators named ``module:Class`` are imported while loading: only load files
you trust, or pass ``allow_imports=False`` (built-in operators only).
"""

from __future__ import annotations

import difflib
import inspect
import os
from pathlib import Path as FilePath
from typing import Any

from typhoon.operators import (
    BUILTINS,
    OperatorError,
    import_refusal,
    replayable,
    resolve_operator,
)
from typhoon.wire.layout import parse_layout

from .config import DEFAULTS
from .model import DEFAULT_STREAM, GROUPINGS, Grouping, Node, Stream, Topology
from .pair_keys import counting_nodes
from .scheduler import topological_order
from .schema import Document, EnvMode, Path, TopologyError, describe, read_document, show

_KEYED = ("fields", "direct")  # groupings that route by key fields


def load_topology(path: str | os.PathLike[str], *, allow_imports: bool = True) -> Topology:
    """Load and check the topology file at ``path`` (errors name the path as given)."""
    name = os.fspath(path)
    try:
        text = FilePath(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(name, 0, f"cannot read the file ({e})") from e
    return load_topology_text(text, name, allow_imports=allow_imports)


def load_topology_text(
    text: str, filename: str = "<string>", *, allow_imports: bool = True, env: EnvMode = "expand"
) -> Topology:
    """Load and check a topology given as YAML text; ``filename`` is used in errors.

    ``env``: what ``${NAME}`` does (see :func:`~typhoon.topology.schema.read_document`);
    text that did not come from a local file must not use ``expand``.
    """
    return _Builder(read_document(text, filename, env), allow_imports).build()


class _Builder:
    """Checks the references and fields of a well-formed document and builds the model."""

    def __init__(self, document: Document, allow_imports: bool) -> None:
        self.filename, self.doc = document.filename, document.data
        self.line, self.fail = document.line, document.fail
        self.allow_imports = allow_imports
        self.classes: dict[str, type] = {}  # node id -> operator class
        self.paths: dict[str, Path] = {}  # node id -> its path in the document
        self.optional: dict[str, bool] = {}  # node id -> keyed only when key-routed

    def build(self) -> Topology:
        nodes = self.nodes()
        streams = self.streams(nodes)
        topo = Topology(
            self.doc["name"], nodes, streams, dict(self.doc.get("config") or {}), self.filename
        )
        self.check_graph(topo)
        self.check_forward(topo)
        self.compute_fields(topo)
        self.check_watermarks(topo)
        self.check_guarantee(topo)
        self.check_locality(topo)
        self.check_keyed(topo)
        return topo

    def check_keyed(self, topo: Topology) -> None:
        """Keyed state needs every input routed by the same number of key fields."""
        for node in topo.nodes.values():
            if node.keyed and self.optional.get(node.name):
                node.keyed = all(s.grouping.type in _KEYED for s in topo.inputs_of(node.name))
            if not node.keyed:
                continue
            widths = set()
            key_fields = getattr(self.classes[node.name], "key_fields", None)
            for s in topo.inputs_of(node.name):
                wanted = key_fields(node.args, s.src) if key_fields is not None else None
                if s.grouping.type == "fields" and wanted and list(s.grouping.fields) != wanted:
                    raise TopologyError(
                        self.filename,
                        s.line,
                        f"stream '{s.src}' -> '{node.name}' groups on "
                        f"[{', '.join(s.grouping.fields)}], but operator '{node.operator}' of "
                        f"'{node.name}' keeps its state per [{', '.join(wanted)}] (its 'key'); "
                        "group on the same fields",
                    )
                if s.grouping.type not in _KEYED:
                    raise TopologyError(
                        self.filename,
                        s.line,
                        f"stream '{s.src}' -> '{node.name}' uses {s.grouping.type} grouping, but "
                        f"operator '{node.operator}' of '{node.name}' keeps keyed state, which "
                        "needs a fields grouping (each key's tuples must reach the worker that "
                        "owns its state)",
                    )
                widths.add(len(s.grouping.fields))
            if len(widths) > 1:
                raise TopologyError(
                    self.filename,
                    node.line,
                    f"the inputs of '{node.name}' group on different numbers of fields; keyed "
                    "state needs keys of one shape",
                )

    def check_watermarks(self, topo: Topology) -> None:
        """Watermarks come from spouts, from a time field they emit or from their clock."""
        for node in topo.nodes.values():
            spec = node.watermark
            if not spec:
                continue
            at = self.paths[node.name] + ("watermark",)
            if node.kind != "spout":
                raise self.fail(
                    at,
                    f"bolt '{node.name}' has a 'watermark', but watermarks start at spouts "
                    "(a bolt's watermark is the minimum of its inputs')",
                )
            clock = spec.get("clock", "event")
            field = spec.get("time_field")
            if clock == "event" and field is None:
                raise self.fail(
                    at,
                    f"the watermark of spout '{node.name}' needs 'time_field' (the field of its "
                    "tuples that holds the event time) or 'clock: processing'",
                )
            if field is not None and field not in node.output_fields:
                have = ", ".join(node.output_fields) or "no fields"
                raise self.fail(
                    at + ("time_field",),
                    f"the watermark of spout '{node.name}' reads time field '{field}', which "
                    f"'{node.name}' does not produce (it produces: {have})",
                )

    def check_locality(self, topo: Topology) -> None:
        """Pair statistics need a node between two key-routed streams to count them."""
        if "locality" not in topo.config or counting_nodes(topo):
            return
        raise self.fail(
            ("config", "locality"),
            "config 'locality' asks for key-pair statistics, but no node has a key-routed "
            "input (fields or direct) and a key-routed output to count them on",
        )

    def check_guarantee(self, topo: Topology) -> None:
        """A guarantee needs sources that can replay what a crash lost (offset and seek)."""
        # the schema has checked the value (typhoon/topology/config.py)
        guarantee = topo.config.get("guarantee", DEFAULTS.guarantee)
        if guarantee == "none":
            return
        for node in topo.nodes.values():
            if node.kind == "spout" and not replayable(self.classes[node.name]):
                path = self.paths[node.name]
                key = "operator" if "operator" in _get_item(self.doc, path) else "className"
                raise self.fail(
                    path + (key,),
                    f"spout '{node.name}' uses operator '{node.operator}', which cannot replay "
                    f"its input (it does not implement offset() and seek()), so the topology "
                    f"cannot have guarantee '{guarantee}'",
                )

    def nodes(self) -> dict[str, Node]:
        nodes: dict[str, Node] = {}
        for section, kind in (("spouts", "spout"), ("bolts", "bolt")):
            for i, item in enumerate(self.doc.get(section) or []):
                path = (section, i)
                name = item["id"]
                if name in nodes:
                    raise self.fail(
                        path + ("id",),
                        f"duplicate id '{name}' (first declared at line {nodes[name].line})",
                    )
                self.paths[name] = path
                nodes[name] = Node(
                    name,
                    kind,
                    self.operator(path, item, kind),
                    dict(item.get("args") or {}),
                    item.get("parallelism", 1),
                    item.get("engine", "python"),
                    item.get("stateful", False),
                    line=self.line(path),
                    config=dict(item.get("config") or {}),
                    keyed=bool(getattr(self.classes[name], "keyed", False)),
                    watermark=dict(item.get("watermark") or {}),
                )
                self.optional[name] = bool(getattr(self.classes[name], "keyed_optional", False))
        return nodes

    def operator(self, path: Path, item: dict, kind: str) -> str:
        """Resolve the node's operator now, so a typo fails here and not on a worker."""
        where = describe(self.doc, path)
        if "operator" in item and "className" in item:
            raise self.fail(path + ("className",), f"{where} gives both 'operator' and 'className'")
        key = "operator" if "operator" in item else "className"
        if key not in item:
            raise self.fail(path, f"{where} is missing 'operator'")
        name = item[key]
        at = path + (key,)
        if ":" not in name and name not in BUILTINS:
            close = difflib.get_close_matches(name, list(BUILTINS), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else " (or use module:Class)"
            raise self.fail(at, f"{where}: unknown operator '{name}'{hint}")
        refusal = import_refusal(name, allow_imports=self.allow_imports)
        if refusal:
            raise self.fail(at, f"{where}: {refusal}")
        try:
            cls = resolve_operator(name)
        except OperatorError as e:
            raise self.fail(at, f"{where}: {e}") from e
        if cls.kind != kind:
            raise self.fail(at, f"{where} uses '{name}', which is a {cls.kind}, not a {kind}")
        self.classes[item["id"]] = cls
        return name

    def streams(self, nodes: dict[str, Node]) -> list[Stream]:
        streams: list[Stream] = []
        seen: dict[tuple[str, str, str], int] = {}
        for i, item in enumerate(self.doc.get("streams") or []):
            path = ("streams", i)
            for end, word in (("from", "source"), ("to", "destination")):
                if item[end] not in nodes:
                    raise self.fail(
                        path + (end,),
                        f"stream {word} '{item[end]}' is not a declared spout or bolt",
                    )
            src, dst = item["from"], item["to"]
            if nodes[dst].kind == "spout":
                raise self.fail(
                    path + ("to",), f"stream destination '{dst}' is a spout; spouts take no input"
                )
            grouping, stream_name = self.grouping(path, item, nodes[dst])
            edge = (src, dst, stream_name)
            if edge in seen:
                raise self.fail(
                    path,
                    f"stream '{src}' -> '{dst}' on output stream "
                    f"'{stream_name}' is declared twice (first at line {seen[edge]})",
                )
            seen[edge] = self.line(path)
            columns = item.get("columns") or {}
            if columns:
                try:
                    parse_layout(columns)
                except ValueError as e:
                    raise self.fail(path + ("columns",), f"stream '{src}' -> '{dst}': {e}") from e
            streams.append(
                Stream(i + 1, src, dst, grouping, stream_name, self.line(path), dict(columns))
            )
        return streams

    def grouping(self, path: Path, item: dict, dst: Node) -> tuple[Grouping, str]:
        """Normalise a grouping (shorthand or Flux form) and check its own arguments."""
        where = describe(self.doc, path)
        raw = item["grouping"]
        gpath = path + ("grouping",)
        spec = {"type": raw} if isinstance(raw, str) else raw
        gtype = spec["type"].lower()
        if gtype not in GROUPINGS:
            raise self.fail(
                gpath,
                f"{where}: unknown grouping '{spec['type']}' "
                f"(expected one of {', '.join(GROUPINGS)})",
            )
        if "fields" in spec and "args" in spec:
            raise self.fail(gpath, f"{where}: grouping gives both 'fields' and 'args'")
        if "stream" in item and "streamId" in spec:
            raise self.fail(gpath, f"{where} gives both 'stream' and grouping 'streamId'")
        stream_name = item.get("stream", spec.get("streamId", DEFAULT_STREAM))
        fields = tuple(spec.get("fields", spec.get("args", ())))
        if gtype in _KEYED and not fields:
            raise self.fail(
                gpath, f"{where}: {gtype} grouping needs 'fields' naming the key fields"
            )
        if gtype not in _KEYED and fields:
            raise self.fail(gpath, f"{where}: {gtype} grouping takes no fields")
        if gtype != "direct" and "table" in spec:
            raise self.fail(gpath, f"{where}: only a direct grouping takes a 'table'")
        table: dict[str, int] = {}
        if gtype == "direct":
            if not spec.get("table"):
                raise self.fail(
                    gpath,
                    f"{where}: direct grouping needs a 'table' "
                    "mapping key values to worker indexes",
                )
            for key, index in spec["table"].items():
                at = gpath + ("table", str(key))
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    raise self.fail(
                        at,
                        f"{where}: direct table key {show(key)} is not a string or integer; "
                        "quote it",
                    )
                if index >= dst.parallelism:
                    raise self.fail(
                        at,
                        f"{where}: direct table sends key '{key}' to worker "
                        f"{index}, but '{dst.name}' has parallelism {dst.parallelism} "
                        f"(indexes 0-{dst.parallelism - 1})",
                    )
                table[str(key)] = index
        return Grouping(gtype, fields, table), stream_name

    def check_forward(self, topo: Topology) -> None:
        """A ``forward`` stream pairs worker i of its source with worker i of its
        destination (chained in one process when it can be, typhoon/topology/chaining.py)."""
        for s in topo.streams:
            if s.grouping.type != "forward":
                continue
            a, b = topo.nodes[s.src], topo.nodes[s.dst]
            if a.parallelism != b.parallelism:
                raise TopologyError(
                    self.filename,
                    s.line,
                    f"stream '{s.src}' -> '{s.dst}' uses forward grouping, which pairs worker i "
                    f"of '{s.src}' with worker i of '{s.dst}', but their parallelism differs "
                    f"({a.parallelism} and {b.parallelism}); give both the same parallelism or "
                    "use shuffle grouping",
                )

    def check_graph(self, topo: Topology) -> None:
        import networkx as nx  # here, not at the top: a worker imports this module, never calls it

        graph = nx.MultiDiGraph()
        graph.add_nodes_from(topo.nodes)
        for s in topo.streams:
            graph.add_edge(s.src, s.dst, key=s.id)
        try:
            cycle = nx.find_cycle(graph)
        except nx.NetworkXNoCycle:
            cycle = []
        if cycle:
            order = list(topo.nodes)
            names = [edge[0] for edge in cycle]
            start = names.index(min(names, key=order.index))
            names = names[start:] + names[:start]
            line = max(next(s.line for s in topo.streams if s.id == e[2]) for e in cycle)
            raise TopologyError(
                self.filename, line, "streams form a cycle: " + " -> ".join(names + names[:1])
            )
        for node in topo.nodes.values():
            if node.kind == "bolt" and not topo.inputs_of(node.name):
                raise TopologyError(
                    self.filename,
                    node.line,
                    f"bolt '{node.name}' has no input stream; add a stream with 'to: {node.name}'",
                )

    def compute_fields(self, topo: Topology) -> None:
        """Ask each operator for its output fields, sources first, and check keyed groupings.

        A node with several inputs sees the fields of its first input stream.
        """
        for name in topological_order(topo):
            node = topo.nodes[name]
            inputs = topo.inputs_of(name)
            input_fields = list(topo.nodes[inputs[0].src].output_fields) if inputs else []
            for s in inputs:
                produced = topo.nodes[s.src].output_fields
                for f in s.grouping.fields:
                    if f not in produced:
                        have = ", ".join(produced) if produced else "no fields"
                        raise TopologyError(
                            self.filename,
                            s.line,
                            f"stream '{s.src}' -> '{name}' groups on field "
                            f"'{f}', which '{s.src}' does not produce (it produces: {have})",
                        )
            by_src = {s.src: list(topo.nodes[s.src].output_fields) for s in inputs}
            node.output_fields = tuple(self.output_fields(node, input_fields, by_src))
        for s in topo.streams:
            produced = list(topo.nodes[s.src].output_fields)
            if s.columns and list(s.columns) != produced:
                raise TopologyError(
                    self.filename,
                    s.line,
                    f"stream '{s.src}' -> '{s.dst}' declares columns [{', '.join(s.columns)}], "
                    f"but '{s.src}' emits [{', '.join(produced)}]: name each field it emits, "
                    "in that order",
                )

    def output_fields(
        self, node: Node, input_fields: list[str], inputs: dict[str, list[str]]
    ) -> list[str]:
        cls = self.classes[node.name]
        path = self.paths[node.name] + ("args",)
        bad = f"{node.kind} '{node.name}': bad args for operator '{node.operator}'"
        problem = _arg_problem(cls, node.args)
        if problem:
            raise self.fail(path, f"{bad}: {problem}")
        try:
            check_inputs = getattr(cls, "check_inputs", None)
            if check_inputs is not None:  # an operator of several inputs (window_join)
                check_inputs(node.args, inputs)
            return list(cls.output_fields(node.args, input_fields))
        except (ValueError, TypeError) as e:
            raise self.fail(path, f"{bad}: {e}") from e


def _get_item(doc: dict, path: Path) -> dict:
    return doc[path[0]][path[1]]


def _arg_problem(cls: type, args: dict[str, Any]) -> str | None:
    """Match ``args`` against the operator's constructor without running it.

    Catches a misspelt argument at load time instead of when a worker starts.
    """
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for arg in args:
        if arg not in names:
            close = difflib.get_close_matches(str(arg), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            takes = ", ".join(names) if names else "no arguments"
            return f"no argument '{arg}'{hint} (it takes: {takes})"
    for name in names:
        if params[name].default is inspect.Parameter.empty and name not in args:
            return f"argument '{name}' is required"
    return None
