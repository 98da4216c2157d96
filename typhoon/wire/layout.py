"""A stream's declared row layout, packing rows as a column block, and telling one apart.

Numpy-free on purpose: the topology loader checks layouts, a sender packs blocks
and every receiver counts a block's rows with this module alone;
``typhoon/wire/columns.py`` (numpy; the block's layout is described there) reads
blocks as columns, and is imported only by a worker that receives them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from typhoon.wire.header import BLOCK_MARK

BLOCK_VERSION = 1
# type name -> (code on the wire, Python type of its values)
TYPES: dict[str, tuple[int, type]] = {
    "int64": (1, int),
    "float64": (2, float),
    "bool": (3, bool),
    "bytes": (4, bytes),
    "str": (5, str),
}
MAX_ROWS = (1 << 32) - 1
_HEAD = struct.Struct("<BBB")  # mark, version, k
_STRUCT = {"int64": "q", "float64": "d", "bool": "?"}  # each value's struct code
BLOCK_ROWS = struct.Struct("<I")  # a block's row count, after its mark, version, k, k types


@dataclass(frozen=True)
class ColumnLayout:
    """A stream's declared row layout: field names and their types, in field order."""

    names: tuple[str, ...]
    types: tuple[str, ...]

    @property
    def codes(self) -> bytes:
        return bytes(TYPES[t][0] for t in self.types)

    def to_dict(self) -> dict[str, str]:
        return dict(zip(self.names, self.types, strict=True))


def parse_layout(spec: Any) -> ColumnLayout:
    """A layout from a ``{field: type}`` mapping (field order kept); ValueError says why not."""
    if not isinstance(spec, dict) or not spec:
        raise ValueError("columns must map each field to its type, e.g. {seq: int64}")
    if len(spec) > 255:
        raise ValueError(f"columns declares {len(spec)} fields; a block holds at most 255")
    for name, kind in spec.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"columns: field name {name!r} is not a non-empty string")
        if kind not in TYPES:
            raise ValueError(
                f"columns: field '{name}' has type {kind!r}; the types are {', '.join(TYPES)}"
            )
    return ColumnLayout(tuple(spec), tuple(spec.values()))


MAX_ROWS = (1 << 32) - 1
_HEAD = struct.Struct("<BBB")  # mark, version, k
_STRUCT = {"int64": "q", "float64": "d", "bool": "?"}  # each value's struct code
BLOCK_ROWS = struct.Struct("<I")  # a block's row count, after its mark, version, k, k types


def is_block(entry: bytes) -> bool:
    """True if a data entry is a column block (not a msgpack row batch)."""
    return entry[:1] == BLOCK_MARK


def block_rows(entry: bytes) -> int:
    """Rows a block says it holds, without decoding it (0 if it is too short)."""
    k = entry[2] if len(entry) > 2 else 0
    at = 3 + k
    if len(entry) < at + BLOCK_ROWS.size:
        return 0
    rows: int = BLOCK_ROWS.unpack_from(entry, at)[0]
    return rows


def describe_block(entry: bytes) -> str:
    """A column block's head in words (its mark, version, types and row count), for a
    dissector: what it is, without decoding its columns."""
    codes = {code: name for name, (code, _) in TYPES.items()}
    k = entry[2] if len(entry) > 2 else 0
    if len(entry) < 3 + k + BLOCK_ROWS.size:
        return f"column block, truncated ({len(entry)} bytes)"
    kinds = ", ".join(codes.get(c, f"type {c}?") for c in entry[3 : 3 + k])
    return f"column block v{entry[1]}: {block_rows(entry)} rows of [{kinds}]"


def pack_block(layout: ColumnLayout, rows: list[Any]) -> bytes | None:
    """``rows`` as one block of ``layout``, or None if a row does not fit it (a row of
    another length, a value of another type, an int outside int64, a str that is not
    valid UTF-8): the caller sends those rows as a row batch, so nothing changes.

    ``struct`` packs each column in one call (no numpy on the sender: cheaper for the
    few hundred values of an entry), and refuses an int outside int64 by itself."""
    n, k = len(rows), len(layout.types)
    if not n or n > MAX_ROWS or not set(map(type, rows)) <= {list, tuple} or len(rows[0]) != k:
        return None
    parts = [_HEAD.pack(BLOCK_MARK[0], BLOCK_VERSION, k), layout.codes, BLOCK_ROWS.pack(n)]
    try:
        for kind, values in zip(layout.types, zip(*rows, strict=True), strict=True):
            if kind == "bytes" or kind == "str":  # join, len and encode refuse other types
                data = [v.encode("utf-8") for v in values] if kind == "str" else values
                if kind == "bytes" and str in set(map(type, values)):
                    return None
                ends = accumulate(map(len, data), initial=0)
                parts += [struct.pack(f"<{n + 1}I", *ends), b"".join(data)]
                continue
            # struct would take a bool for an int and an int for a float: msgpack keeps them
            if set(map(type, values)) != {TYPES[kind][1]}:
                return None
            parts.append(struct.pack(f"<{n}{_STRUCT[kind]}", *values))
    except (struct.error, UnicodeEncodeError, ValueError, TypeError, AttributeError):
        return None  # rows of several lengths, an int outside int64, a lone surrogate, ...
    return b"".join(parts)
