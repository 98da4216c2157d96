"""Columns a sender already holds, packed as column blocks without building rows.

A source or operator that holds its output as columns (numpy arrays, or Python
sequences, one per declared field) hands them to the framework's
``emit_columns``; :func:`as_columns` checks them against the stream's layout and
turns them into one :class:`typhoon.wire.columns.Columns`, :func:`entry_cuts` cuts
its rows into entries that each fit one frame, and :func:`pack_slice` packs rows
``[a, b)`` as a block, the same bytes ``layout.pack_block`` makes of those rows.

:func:`key_codes` numbers the distinct keys of a block's rows (any column types, one
field or several), so a key-routed sender picks a receiver once per distinct key.

What does not fit the layout (a value of another type, an unsigned int above
int64, a str that is not valid UTF-8) makes :func:`as_columns` return None: the
caller sends rows instead, as the row path does.  A shape error (a field
missing, columns of different lengths) is the caller's bug: ValueError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import Any

import numpy as np
import numpy.typing as npt

from typhoon.wire.columns import Column, Columns, VarColumn
from typhoon.wire.header import BLOCK_MARK
from typhoon.wire.layout import BLOCK_ROWS, BLOCK_VERSION, MAX_ROWS, TYPES, ColumnLayout

_INT64 = np.dtype("<i8")
_FLOAT64 = np.dtype("<f8")
_OFFSETS = np.dtype("<u4")
_INT64_MAX = (1 << 63) - 1
_FIXED = {"int64": 8, "float64": 8, "bool": 1}


def _fixed(kind: str, values: Any) -> npt.NDArray[Any] | None:
    """A numeric column as a numpy array of its wire type (None: it does not fit)."""
    if isinstance(values, np.ndarray):
        k = values.dtype.kind
        if values.ndim != 1:
            raise ValueError(f"a column must be one-dimensional, not of shape {values.shape}")
        if kind == "int64" and k in "iu":
            if k == "u" and len(values) and int(values.max()) > _INT64_MAX:
                return None
            return values.astype(_INT64, copy=False)
        if kind == "float64" and k == "f":
            return values.astype(_FLOAT64, copy=False)
        if kind == "bool" and k == "b":
            return values
        return None
    if set(map(type, values)) - {TYPES[kind][1]}:  # msgpack keeps a bool apart from an int
        return None
    try:
        return np.array(values, dtype={"int64": _INT64, "float64": _FLOAT64}.get(kind, np.bool_))
    except OverflowError:
        return None


def _variable(kind: str, values: Any) -> VarColumn | None:
    """A bytes or str column as its offsets and data (None: it does not fit)."""
    text = kind == "str"
    if isinstance(values, VarColumn):
        return values if values.text == text else None
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if set(map(type, values)) - {TYPES[kind][1]}:
        return None
    if text:
        try:
            values = [v.encode("utf-8") for v in values]
        except UnicodeEncodeError:
            return None
    offsets = np.fromiter(accumulate(map(len, values), initial=0), dtype=np.int64)
    if offsets[-1] > 0xFFFFFFFF:
        return None
    return VarColumn(offsets.astype(_OFFSETS), b"".join(values), text)


def as_columns(layout: ColumnLayout, data: Any) -> Columns | None:
    """``data`` (a Columns, a ``{field: values}`` mapping or a sequence of columns in
    field order) as Columns of ``layout``; None if a value does not fit it."""
    if isinstance(data, Columns):
        return data if data.types == layout.types else None
    if isinstance(data, Mapping):
        missing = [f for f in layout.names if f not in data]
        extra = [f for f in data if f not in layout.names]
        if missing or extra:
            raise ValueError(
                f"emit_columns: the stream's columns are {list(layout.names)}; "
                f"missing {missing}, unknown {extra}"
            )
        given = [data[f] for f in layout.names]
    elif isinstance(data, Sequence):
        given = list(data)
        if len(given) != len(layout.names):
            raise ValueError(
                f"emit_columns: {len(given)} columns for a stream of "
                f"{len(layout.names)} ({list(layout.names)})"
            )
    else:
        raise ValueError("emit_columns takes a mapping of field to values or a list of columns")
    lengths = {len(v) for v in given}
    if len(lengths) > 1:
        raise ValueError(f"emit_columns: columns of different lengths {sorted(lengths)}")
    n = lengths.pop()
    if n > MAX_ROWS:
        return None
    cols: list[Column] = []
    for kind, values in zip(layout.types, given, strict=True):
        col: Column | None = _variable(kind, values) if kind not in _FIXED else _fixed(kind, values)
        if col is None:
            return None
        cols.append(col)
    return Columns(layout.types, cols, n)


def stride(cols: Columns, start: int, step: int) -> Columns:
    """Rows ``start, start + step, ...`` (a round-robin receiver's share), in order."""
    if step == 1 and start == 0:
        return cols
    return pick(cols, np.arange(start, cols.n, step))


def pick(cols: Columns, index: npt.NDArray[np.intp]) -> Columns:
    """The rows at ``index`` (ascending), as Columns of their own."""
    out: list[Column] = [_take(c, index) if isinstance(c, VarColumn) else c[index]
                         for c in cols.cols]  # fmt: skip
    return Columns(cols.types, out, len(index))


def gather(c: VarColumn, index: npt.NDArray[np.intp]) -> VarColumn:
    """The values at ``index`` (any order, repeats allowed) as a column of their own:
    a lookup table of words turned into a column by one index array."""
    return _take(c, np.asarray(index, dtype=np.intp))


def _take(c: VarColumn, index: npt.NDArray[np.intp]) -> VarColumn:
    """``VarColumn.take`` with numpy alone: the values' bytes gathered by one index."""
    starts = c.offsets[index].astype(np.int64)
    lengths = c.offsets[index + 1].astype(np.int64) - starts
    first, n = int(c.offsets[0]), len(c)
    size = (int(c.offsets[-1]) - first) // max(1, n)
    if n and size and int(c.offsets[-1]) - first == size * n and bool((lengths == size).all()):
        # values of one size side by side (a fixed payload): rows of a 2-d view
        whole = np.frombuffer(c.data, dtype=np.uint8, count=size * n, offset=first)
        if bool((np.diff(c.offsets.astype(np.int64)) == size).all()):
            data = whole.reshape(n, size)[index].tobytes()
            offsets = np.arange(0, (len(index) + 1) * size, size, dtype=np.int64)
            return VarColumn(offsets.astype(_OFFSETS), data, c.text)
    offsets = np.zeros(len(index) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    at = np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
    data = np.frombuffer(c.data, dtype=np.uint8)[at].tobytes()
    return VarColumn(offsets.astype(_OFFSETS), data, c.text)


def _head(types: tuple[str, ...]) -> int:
    return 3 + len(types) + BLOCK_ROWS.size


def entry_cuts(cols: Columns, cap: int) -> list[int]:
    """Row numbers where ``cols`` is cut into blocks of at most ``cap`` bytes each:
    ``[0, c1, ..., n]``.  A single row larger than ``cap`` is a block of its own
    (it travels segmented, as a row batch of one such row does)."""
    n = cols.n
    varcols = [c for c in cols.cols if isinstance(c, VarColumn)]
    per_row = sum(_FIXED.get(t, 4) for t in cols.types)
    room = cap - _head(cols.types) - 4 * len(varcols)
    if not varcols:
        step = max(1, room // max(1, per_row))
        return [*range(0, n, step), n]
    sizes: npt.NDArray[np.int64] = np.full(n, per_row, dtype=np.int64)
    for c in varcols:
        sizes += c.offsets[1:].astype(np.int64)  # each value's length: its end ...
        sizes -= c.offsets[:-1].astype(np.int64)  # ... less its start
    if n and bool((sizes == sizes[0]).all()):  # rows of one size (a fixed payload)
        step = max(1, room // max(1, int(sizes[0])))
        return [*range(0, n, step), n]
    ends = np.cumsum(sizes)
    cuts = [0]
    a = 0
    while a < n:
        before = int(ends[a - 1]) if a else 0
        b = int(np.searchsorted(ends, before + room, side="right"))
        b = max(b, a + 1)
        cuts.append(b)
        a = b
    return cuts


def pack_slice(cols: Columns, a: int, b: int) -> bytes:
    """Rows ``[a, b)`` of ``cols`` as one column block (``typhoon.wire.columns``)."""
    return pack_blocks(cols, [a, b])[0]


def pack_blocks(cols: Columns, cuts: list[int]) -> list[bytes]:
    """One block for each run of rows ``[cuts[i], cuts[i + 1])`` of ``cols``.

    Each column is turned into bytes once; a block is then byte slices of those
    and, for a bytes or str column, its offsets less the first (one numpy call)."""
    types = cols.types
    head = bytes((BLOCK_MARK[0], BLOCK_VERSION, len(types))) + bytes(TYPES[t][0] for t in types)
    marks = np.asarray(cuts, dtype=np.intp)
    columns: list[tuple[int, bytes, Any, list[int]]] = []  # (width, bytes, offsets, ends)
    for kind, c in zip(types, cols.cols, strict=True):
        if isinstance(c, VarColumn):
            columns.append((0, c.data, c.offsets, c.offsets[marks].tolist()))
        elif kind == "bool":
            columns.append((1, c.astype(np.uint8).tobytes(), None, []))
        else:
            columns.append((8, c.tobytes(), None, []))
    out = []
    for i in range(len(cuts) - 1):
        a, b = cuts[i], cuts[i + 1]
        parts = [head, BLOCK_ROWS.pack(b - a)]
        for width, data, offsets, ends in columns:
            if width:
                parts.append(data[a * width : b * width])
                continue
            lo, hi = ends[i], ends[i + 1]
            parts.append(
                (offsets[a : b + 1] - np.uint32(lo)).astype(_OFFSETS, copy=False).tobytes()
            )
            parts.append(data[lo:hi])
        out.append(b"".join(parts))
    return out


_Codes = npt.NDArray[np.intp]


def key_codes(cols: Columns, fields: list[int]) -> tuple[_Codes, _Codes]:
    """The distinct keys of ``cols``' rows on ``fields`` (column numbers): a code per row
    (equal codes: equal keys) and, per code, the first row holding that key.

    Two rows share a code only if every key field holds the same value, as the row path
    packs it: a float by its bits (``-0.0`` and ``0.0`` pack, and hash, apart; a NaN is
    equal to itself), a bytes or str value by its bytes (its length included, so
    ``b"a"`` and ``b"a\\0"`` stay apart).  No fields: one key for every row.  Several
    fields: the codes of each combined (one ``np.unique`` per field), as distinct as the
    tuples of values."""
    n = cols.n
    if not fields:
        return np.zeros(n, dtype=np.intp), np.zeros(min(n, 1), dtype=np.intp)
    code = _comparable(cols.cols[fields[0]], cols.types[fields[0]])
    for f in fields[1:]:  # mixed radix over dense codes, made dense again after each field
        inverse = np.unique(code, return_inverse=True)[1].reshape(-1).astype(np.int64)
        more = _comparable(cols.cols[f], cols.types[f])
        values, more = np.unique(more, return_inverse=True)
        code = inverse * len(values) + more.reshape(-1)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return inverse.reshape(-1).astype(np.intp, copy=False), first.astype(np.intp, copy=False)


def _comparable(c: Column, kind: str) -> npt.NDArray[Any]:
    """One column's values as numbers equal exactly where the values pack the same."""
    if isinstance(c, VarColumn):
        return _var_codes(c)
    if kind == "float64":
        return np.ascontiguousarray(c).view(np.int64)  # by bits
    return c


def _var_codes(c: VarColumn) -> npt.NDArray[np.int64]:
    """A bytes or str column's values numbered by their bytes (equal bytes, equal number;
    a str's bytes are its UTF-8), in one pass over the values as ``bytes`` objects:
    ``np.unique`` over the values padded into a byte matrix took 36 ms for 8,192 rows of
    1,000 distinct words, this 3 ms (50 calls each, one run, 2 cores shared with others)."""
    ends = c.offsets.tolist()
    data = c.data
    seen: dict[bytes, int] = {}
    values = (data[a:b] for a, b in zip(ends, ends[1:], strict=False))
    return np.fromiter((seen.setdefault(v, len(seen)) for v in values), np.int64, len(c))
