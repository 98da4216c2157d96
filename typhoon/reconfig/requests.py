"""Reconfiguration requests: what a user may ask of a running application, checked.

:func:`parse_request` turns a JSON body (REST, CLI) into one of the request
dataclasses or raises :class:`ReconfigError` with one sentence and the HTTP
status to answer with.  Pure: nothing here reads a topology.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from typhoon.topology.model import GROUPINGS

MAX_PARALLELISM = 1000
KINDS = ("scale", "route", "swap", "insert", "remove", "move", "unchain", "chain")


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


@dataclass(frozen=True)
class Move:
    """Move one running worker, with its state, to another host (paper §8: pause and resume
    elsewhere); ``typhoon.reconfig.move``."""

    worker: int
    host: str


@dataclass(frozen=True)
class Unchain:
    """Put the chained edges of ``node`` on the network while every process stays
    (only the chain instance of ``worker`` when given); ``typhoon.reconfig.unchain``."""

    node: str
    worker: int | None = None


@dataclass(frozen=True)
class Chain:
    """Run the live-unchained edges of ``node`` as function calls again."""

    node: str
    worker: int | None = None


Request = Scale | Reroute | Swap | Insert | Remove | Move | Unchain | Chain


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
        "move": {"worker", "host"},
        "unchain": {"node", "worker"},
        "chain": {"node", "worker"},
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
    if kind == "move":
        worker = _need(body, "worker", int, "a worker ID (typhoon status NAME lists them)")
        if worker < 1:
            raise ReconfigError(f"'worker' must be a worker ID (1 or more), not {worker}")
        return Move(worker, _name(body, "host", "a host name of the cluster"))
    if kind in ("unchain", "chain"):
        worker = None
        if "worker" in body:
            worker = _need(body, "worker", int, "a worker ID (typhoon status NAME lists them)")
            if worker < 1:
                raise ReconfigError(f"'worker' must be a worker ID (1 or more), not {worker}")
        return (Unchain if kind == "unchain" else Chain)(_name(body, "node"), worker)
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
    if isinstance(request, Move):
        return f"move worker {request.worker} to {request.host}"
    if isinstance(request, (Unchain, Chain)):
        verb = "unchain" if isinstance(request, Unchain) else "chain again"
        return f"{verb} {request.node}" + (
            "" if request.worker is None else f" at {request.worker}"
        )
    return f"remove {request.node}"
