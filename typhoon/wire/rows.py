"""Tuples and row batches as msgpack: strict both ways, never pickle.

A data frame's entry is one row batch, encoded in one call, so a frame costs one
serialization, not one per tuple; a control tuple is one encoded ``[type, body]``.

Every decoder of received bytes goes through :func:`decode_value` or
:func:`unpack_rows`: plain msgpack types only (every extension type is refused,
the timestamp type -1 too), nesting at most :data:`MAX_DEPTH` deep, and any
failure is a :class:`WireError`.  Nothing here recurses on received data, so no
input can end in a RecursionError (docs/security-notes-wire.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

import msgpack

from typhoon.wire.checks import WireError

# A Packer is ~3x faster than packb (no per-call setup) but not thread-safe.
_local = threading.local()
_unpackb = msgpack.unpackb

# Deepest nesting a received value may have (the outer array of a tuple is level 1).
# Far below what every consumer handles: Python's recursion limit (1000), msgpack's
# Packer (511) when a worker sends the value on, json in the debug records.
MAX_DEPTH = 100
# Every msgpack array or map has exactly one header byte among these (fixmap, fixarray,
# array 16/32, map 16/32); other bytes of the encoding may be among them as well.
_CONTAINER_HEADS = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_CONTAINERS = (list, dict)
_CONTAINER_SET = frozenset(_CONTAINERS)


def _reject_ext(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack extension type {code} is not allowed")


def _unpack(data: bytes) -> Any:
    """Strict msgpack decoding: every exception becomes a WireError.

    ``max_ext_len=0`` refuses every extension type with a body before it is built,
    the timestamp type -1 included (msgpack builds that one without asking
    ``ext_hook``); ``_reject_ext`` refuses the empty ones.
    """
    try:
        return _unpackb(data, raw=False, strict_map_key=False, ext_hook=_reject_ext, max_ext_len=0)
    except WireError:
        raise
    except Exception as e:  # ValueError, TypeError, StackError, ExtraData, ...
        raise WireError(f"bad msgpack: {type(e).__name__}: {e}") from None


def _heads(data: bytes) -> int:
    """An upper bound on the arrays and maps in an encoding (one C pass, no parsing)."""
    return len(data) - len(data.translate(None, _CONTAINER_HEADS))


def _children(level: list[Any], kinds: set[type]) -> Iterator[Any]:
    """The values inside the containers of ``level`` (lists and dicts), lazily, in C."""
    if dict not in kinds:
        return chain.from_iterable(level)
    lists = [v for v in level if type(v) is list] if list in kinds else []
    maps = [v for v in level if type(v) is dict]
    return chain(chain.from_iterable(lists), *map(dict.values, maps))


def _check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """WireError if ``value`` nests deeper than ``limit``; never recursive.

    Level by level, each level's values looked at in C (``map``, ``chain``, ``set``):
    a batch of flat rows costs one pass over its values, not a Python step per value.
    """
    level = [value]  # the containers at one depth
    kinds = {type(value)}
    for _ in range(limit):
        types = set(map(type, _children(level, kinds)))
        if list not in types and dict not in types:
            return
        if types <= _CONTAINER_SET:  # nothing else in there (a batch of rows)
            level = list(_children(level, kinds))
            kinds = types
        else:
            level = [v for v in _children(level, kinds) if type(v) in _CONTAINER_SET]
            kinds = types & _CONTAINER_SET
    raise WireError(f"value nested deeper than {limit} levels")


def decode_value(data: bytes) -> Any:
    """Any strict msgpack value (plain types, at most :data:`MAX_DEPTH` deep)."""
    if type(data) is not bytes:
        data = bytes(data)
    value = _unpack(data)
    # a chain of n nested containers needs n header bytes: few of them, no walk
    if type(value) in _CONTAINERS and _heads(data) > MAX_DEPTH:
        _check_depth(value)
    return value


def encode_tuple(values: list[Any] | tuple[Any, ...]) -> bytes:
    """Serialize one tuple (a sequence of plain values) with msgpack; never pickle."""
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"a tuple must be a list or tuple, got {type(values).__name__}")
    pack: Callable[[object], bytes]  # msgpack is untyped
    try:
        pack = _local.pack
    except AttributeError:
        pack = _local.pack = msgpack.Packer(use_bin_type=True).pack
    return pack(values)  # the Packer resets its buffer if this raises


def decode_tuple(data: bytes) -> list[Any]:
    """Inverse of :func:`encode_tuple`; sequences come back as lists.

    Strict (:func:`decode_value`): every failure is a WireError, whatever msgpack
    raised (ValueError, TypeError, StackError, ...).
    """
    value = decode_value(data)
    if type(value) is not list:
        raise WireError(f"a tuple must be a msgpack array, got {type(value).__name__}")
    return value


def encode_rows(rows: list[Any]) -> bytes:
    """Serialize a batch of tuples as one data entry (one msgpack array of arrays)."""
    pack: Callable[[object], bytes]  # msgpack is untyped
    try:
        pack = _local.pack
    except AttributeError:
        pack = _local.pack = msgpack.Packer(use_bin_type=True).pack
    return pack(rows)


def unpack_rows(data: bytes) -> tuple[list[Any], int]:
    """A row-batch entry as strict as :func:`decode_value`, and how many items are rows.

    Returns the outer array and the count of its items that are arrays (the rows);
    what to do with other items is the caller's choice.  The hot path of every
    worker: the depth bound costs one C pass over the bytes, since the rows other
    than the deepest one each take a header byte of their own; an entry with that
    many more header bytes is a batch of flat rows (one C pass over the types of its
    values) or walked.
    """
    if type(data) is not bytes:
        data = bytes(data)
    value = _unpack(data)
    if type(value) is not list:
        raise WireError(f"a row batch must be a msgpack array, got {type(value).__name__}")
    types = list(map(type, value))
    rows = types.count(list)
    # containers besides the deepest chain: every other row, every map among the items
    others = rows + types.count(dict) - 1
    if _heads(data) - max(0, others) > MAX_DEPTH and not _flat(value, rows):
        _check_depth(value)
    return value, rows


def _flat(value: list[Any], rows: int) -> bool:
    """True for a batch of rows of plain values (depth 2), the common case: one C pass
    over the values, cheaper than the level-by-level walk.  Numbers' and strings'
    bytes that look like headers defeat the header-byte bound on such a batch (every
    batch of ~100 rows with a float in each)."""
    if rows != len(value):
        return False
    return set(map(type, chain.from_iterable(value))).isdisjoint(_CONTAINER_SET)


def decode_rows(data: bytes) -> list[list[Any]]:
    """Inverse of :func:`encode_rows`, as strict as :func:`decode_tuple`.

    Every row must be a msgpack array; a batch with one bad row is rejected whole
    (it came from one sender's one serialization, so nothing in it is trusted).
    """
    value, rows = unpack_rows(data)
    if rows != len(value):
        bad = next(v for v in value if type(v) is not list)
        raise WireError(f"a row must be a msgpack array, got {type(bad).__name__}")
    return value
