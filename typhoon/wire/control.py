"""Control tuples (paper Table 2): their types, the schema of each body, encoding.

Every body is validated and its defaults filled in on both ends, so a worker
and the controller never disagree on what a control tuple means.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack

from typhoon.wire.checks import MAX_ID, U16_MAX, U32_MAX, WireError
from typhoon.wire.rows import decode_tuple


class Control(IntEnum):
    ROUTING = 1
    SIGNAL = 2
    METRIC_REQ = 3
    METRIC_RESP = 4
    INPUT_RATE = 5
    ACTIVATE = 6
    DEACTIVATE = 7
    BATCH_SIZE = 8
    DRAIN = 9
    UPSTREAM = 10  # the workers that send to this one changed (runtime reconfiguration)
    FLOW_CONTROL = 11  # the bytes this worker may have in flight (its share of the fabric)
    ROLLBACK = 12  # go back to a global checkpoint as a new generation (guaranteed processing)
    COMPLETE = 13  # every worker of the application finished: a finished worker may exit
    KEYGROUPS = 14  # key groups move between workers with their keyed state (a rescale, a move)
    CHAIN = 15  # a chained edge goes on the network or back to a function call (live unchaining)
    SWAP = 16  # a worker's operator is replaced in its process (swap in place of a chained node)


# Control tuples a worker handles ahead of the data queued before them (docs/flow_control.md,
# "Control traffic apart from data"): each reads or sets a parameter of the worker's current
# state and means the same whatever data it overtakes.  Every other kind keeps its place in
# the arrival order: ROUTING, SIGNAL, UPSTREAM and DRAIN are steps of the stable update
# protocol (a SIGNAL flushes state only after the tuples that arrived before it), ROLLBACK
# and COMPLETE of the guarantee protocol, ACTIVATE and DEACTIVATE start and stop a spout
# in order with the ROUTING that precedes them.
URGENT_CONTROL = frozenset(
    {Control.METRIC_REQ, Control.FLOW_CONTROL, Control.BATCH_SIZE, Control.INPUT_RATE}
)


# every grouping a route may carry (forward: a move re-points it to the partner's newcomer)
POLICIES = frozenset(
    {"shuffle", "fields", "all", "global", "direct", "local_or_shuffle", "sdn", "forward"}
)


@dataclass(frozen=True)
class ControlTuple:
    """A control tuple (paper Table 2); ``body`` follows the schema of its type."""

    type: Control
    body: dict[str, Any]


_Check = Callable[[Any], Any]
_REQUIRED = object()
_OMITTED = object()  # optional key that stays absent when not given (no default filled in)
_MAX_U64 = 2**64 - 1


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(lo: int, hi: int) -> _Check:
    def check(v: Any) -> int:
        if not _is_int(v) or not lo <= v <= hi:
            raise ValueError(f"expected an int in {lo}..{hi}, got {v!r}")
        return int(v)

    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def _nonneg_float(v: Any) -> float:
    if not (_is_int(v) or isinstance(v, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"expected a finite number >= 0, got {v!r}")
    return float(v)


def _choice(options: frozenset[str]) -> _Check:
    def check(v: Any) -> str:
        if not isinstance(v, str) or v not in options:
            raise ValueError(f"expected one of {sorted(options)}, got {v!r}")
        return v

    return check


def _list_of(item: _Check) -> _Check:
    def check(v: Any) -> list[Any]:
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"expected a list, got {type(v).__name__}")
        return [item(x) for x in v]

    return check


def _str_key_dict(value: _Check) -> _Check:
    def check(v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise ValueError(f"expected a dict, got {type(v).__name__}")
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise ValueError(f"dict keys must be str, got {k!r}")
            out[k] = value(x)
        return out

    return check


_worker_id = _int(1, MAX_ID)
_u64 = _int(0, _MAX_U64)
_metric_int = _int(-(2**63), _MAX_U64)  # what msgpack can carry


def _metric_value(v: Any) -> Any:
    if isinstance(v, dict):
        return _metrics(v)
    if isinstance(v, (str, float)):
        return v
    return _metric_int(v)


_metrics = _str_key_dict(_metric_value)

MAX_ARGS_DEPTH = 8  # an operator's arguments are plain data, nested this deep at most


def _plain(v: Any, depth: int = 0) -> Any:
    """Plain data (what a topology file's ``args`` can hold), as lists and str-keyed dicts."""
    if depth > MAX_ARGS_DEPTH:
        raise ValueError(f"nested deeper than {MAX_ARGS_DEPTH}")
    if v is None or isinstance(v, (bool, str, float)):
        return v
    if _is_int(v):
        return _metric_int(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x, depth + 1) for x in v]
    if isinstance(v, dict):
        if any(not isinstance(k, str) for k in v):
            raise ValueError("dict keys must be str")
        return {k: _plain(x, depth + 1) for k, x in v.items()}
    raise ValueError(f"not plain data: {type(v).__name__}")


def _args(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"expected a dict, got {type(v).__name__}")
    out: dict[str, Any] = _plain(v)
    return out


def _operator_name(v: Any) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= 200:
        raise ValueError(f"expected an operator name (1..200 characters), got {v!r}")
    return v


def wire_metrics(value: dict[str, Any], path: str = "") -> tuple[dict[str, Any], list[str]]:
    """``value`` as METRIC_RESP can carry it, and the paths of what it cannot.

    A worker's metrics include what its operator reports; a value the schema refuses
    would make the reply raise and the worker die.  Lists and tuples become maps keyed
    by index, booleans ints, keys strings; ``None`` and any other value are left out
    and named (the caller counts them)."""
    out: dict[str, Any] = {}
    dropped: list[str] = []
    for k, v in value.items():
        key = str(k)
        here = f"{path}.{key}" if path else key
        if isinstance(v, (list, tuple)):
            v = {str(i): x for i, x in enumerate(v)}
        if isinstance(v, dict):
            out[key], more = wire_metrics(v, here)
            dropped += more
        elif isinstance(v, bool):
            out[key] = int(v)
        elif isinstance(v, (str, float)) or (_is_int(v) and -(2**63) <= v <= _MAX_U64):
            out[key] = v
        else:
            dropped.append(here)
    return out, dropped


_SCHEMAS: dict[Control, dict[str, tuple[_Check, Any]]] = {
    Control.ROUTING: {
        "stream": (_int(0, U16_MAX), _REQUIRED),
        "policy": (_choice(POLICIES), _REQUIRED),
        "next_hops": (_list_of(_worker_id), _REQUIRED),
        "fields": (_list_of(_int(0, U16_MAX)), []),
        "table": (_str_key_dict(_worker_id), {}),
        "version": (_u64, _REQUIRED),
        "local": (_list_of(_worker_id), []),
        "lb_node": (_int(0, 0xFF), 0),
        # receivers this sender will never send to again: end of stream goes to each of
        # them right after the route is installed (stable removal, docs/design.md §5)
        "release": (_list_of(_worker_id), _OMITTED),
        # sdn policy: true = frames go to the node's load-balancer address and the switch
        # picks the worker; absent = keep the stream's current mode (the LB app sets it)
        "balanced": (_bool, _OMITTED),
        # fields, direct: receiving worker ID per key group (typhoon/topology/keygroups.py)
        "groups": (_list_of(_int(-1, MAX_ID)), []),  # -1: the group's worker is gone
        # the key groups of the receivers move (migration ID): after the new route is
        # installed, a handoff punctuation goes to each receiver of the old route
        "handoff": (_u64, _OMITTED),
    },
    Control.SIGNAL: {"version": (_u64, _REQUIRED)},
    # keys: also which key groups the worker owns and holds keys of (a rescale's check)
    Control.METRIC_REQ: {"request_id": (_u64, _REQUIRED), "keys": (_bool, _OMITTED)},
    Control.METRIC_RESP: {
        "request_id": (_u64, _REQUIRED),
        "worker": (_worker_id, _REQUIRED),
        "metrics": (_metrics, _REQUIRED),
    },
    Control.INPUT_RATE: {"rate": (_nonneg_float, _REQUIRED)},
    Control.ACTIVATE: {},
    Control.DEACTIVATE: {},
    Control.BATCH_SIZE: {
        "size": (_int(1, U32_MAX), _REQUIRED),
        "max_delay_ms": (_nonneg_float, _REQUIRED),
    },
    Control.DRAIN: {"version": (_u64, _REQUIRED)},
    # bytes of truesize the worker may have in flight (typhoon.port_budgets)
    Control.FLOW_CONTROL: {"budget": (_int(0, U32_MAX), _REQUIRED)},
    # a recovery: restore the global checkpoint ``epoch`` (-1: the start) as ``generation``
    Control.ROLLBACK: {
        "generation": (_int(1, U32_MAX), _REQUIRED),
        "epoch": (_int(-1, 2**62), _REQUIRED),
        # upstream backup: this worker stays; it replays its output buffers to these
        # receivers, which went back (typhoon/checkpoint/partial.py)
        "replay": (_list_of(_worker_id), _OMITTED),
        # whose link each of them takes over (a replacement: its dead predecessor's)
        "replay_from": (_list_of(_worker_id), _OMITTED),
    },
    Control.COMPLETE: {},
    # key groups move with their keyed state (typhoon/runtime/migration.py): ``prepare``
    # tells each worker what leaves it (out: group -> new owner), what comes (in: group ->
    # old owner; held until its state arrives) and whose handoffs to await before the state
    # leaves ([sender, stream] pairs); ``finish`` is acked once the worker's part is done
    Control.KEYGROUPS: {
        "version": (_u64, _REQUIRED),
        "migration": (_u64, _REQUIRED),
        "phase": (_choice(frozenset({"prepare", "finish"})), _REQUIRED),
        "out": (_str_key_dict(_worker_id), {}),
        "in": (_str_key_dict(_worker_id), {}),
        "expect": (_list_of(_list_of(_int(0, U16_MAX))), []),
        # single keys a direct grouping's table moves (the table's spelling of the key)
        "keys_out": (_str_key_dict(_worker_id), {}),
        "keys_in": (_str_key_dict(_worker_id), {}),
        # every key the node's new direct tables name -> routed to this worker
        "pins": (_str_key_dict(_bool), _OMITTED),
        # a worker move (``typhoon move``): all of this worker's state, its operator's
        # snapshot and plain timers too, goes to the worker named (out); or comes from it
        # (in: every tuple here waits for it, docs/reconfiguration.md "Moving a worker")
        "operator_out": (_worker_id, _OMITTED),
        "operator_in": (_worker_id, _OMITTED),
    },
    # live unchaining (typhoon/runtime/chain.py): the chain's upstream worker sends to
    # ``receiver`` (the next worker of its process) over the network (chained false) or by
    # function call again (true: acked once the receiver holds everything sent as frames)
    Control.CHAIN: {
        "version": (_u64, _REQUIRED),
        "receiver": (_worker_id, _REQUIRED),
        "chained": (_bool, _REQUIRED),
    },
    # swap in place (typhoon/runtime/operator_swap.py): the worker's operator ends as at its
    # end of input and this one (built-in name or module:Class, with these args) goes on
    Control.SWAP: {
        "version": (_u64, _REQUIRED),
        "operator": (_operator_name, _REQUIRED),
        "args": (_args, {}),
    },
    # senders that start (add) or stopped without end of stream (remove) sending to a worker
    Control.UPSTREAM: {
        "add": (_list_of(_worker_id), []),
        "remove": (_list_of(_worker_id), []),
        "version": (_u64, _REQUIRED),
        # false: a sender in ``add`` whose end of stream already came stays finished
        # (a replacement told who sends to it, not a sender routing to it again)
        "reopen": (_bool, True),
    },
}


def _normalize(ctype: Control, body: Any) -> dict[str, Any]:
    """Validated copy of ``body`` with defaults filled in; ValueError if invalid."""
    if not isinstance(body, dict):
        raise ValueError(f"{ctype.name} body must be a dict, got {type(body).__name__}")
    schema = _SCHEMAS[ctype]
    unknown = [k for k in body if k not in schema]
    if unknown:
        raise ValueError(f"{ctype.name}: unknown keys {unknown!r}")
    out = {}
    for key, (check, default) in schema.items():
        if key in body:
            try:
                out[key] = check(body[key])
            except ValueError as e:
                raise ValueError(f"{ctype.name}.{key}: {e}") from None
        elif default is _REQUIRED:
            raise ValueError(f"{ctype.name}: missing key {key!r}")
        elif default is not _OMITTED:
            out[key] = type(default)(default)  # fresh copy of a mutable default
    return out


def encode_control(ct: ControlTuple) -> bytes:
    """Validate, then serialize as msgpack ``[type, body]`` (defaults filled in)."""
    ctype = Control(ct.type)
    data: bytes = msgpack.packb([int(ctype), _normalize(ctype, ct.body)], use_bin_type=True)
    return data


def decode_control(data: bytes) -> ControlTuple:
    """Inverse of :func:`encode_control`; malformed or invalid bodies are WireErrors."""
    value = decode_tuple(data)
    if len(value) != 2:
        raise WireError("a control tuple must be a 2-element msgpack array")
    ctype, body = value
    try:
        if not _is_int(ctype):
            raise ValueError(f"control tuple type must be an int, got {ctype!r}")
        ctype = Control(ctype)
        return ControlTuple(ctype, _normalize(ctype, body))
    except ValueError as e:
        raise WireError(str(e)) from None
