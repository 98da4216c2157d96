"""Column blocks: a data entry that carries a batch of rows of a declared layout as columns.

A stream may declare its rows' layout (a topology's ``columns:``, docs/topology.md): one
type per field, from ``layout.TYPES``.  Its sender then packs each entry as a *block*
(``layout.pack_block``, numpy-free) instead of a msgpack row batch: the values of each
column side by side, so the receiver reads a numeric column as one numpy array (no
Python object per value) and an operator that declares ``process_columns`` gets the
arrays.  Every other reader turns a block back into the rows it came from
(:meth:`Columns.rows`): the same values, of the same Python types, as the msgpack row
batch would give.

Block layout (integers little endian, as numpy reads them)::

    1 byte     BLOCK_MARK (0xC1: a byte msgpack never uses, so no row batch starts so)
    1 byte     block version (1)
    1 byte     k, the number of columns
    k bytes    each column's type code (TYPES)
    4 bytes    n, the number of rows (u32)
    then each column in order:
      int64, float64  n x 8 bytes
      bool            n bytes, each 0 or 1
      bytes, str      (n + 1) x u32 offsets (first 0, never decreasing, last = data
                      length), then the data (str: UTF-8)

Nothing may follow the last column.  :func:`unpack_block` checks all of that and
raises :class:`WireError` for any defect; it never recurses and never builds more
than the values the bytes hold.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from typhoon.wire.checks import WireError
from typhoon.wire.header import BLOCK_MARK
from typhoon.wire.layout import BLOCK_ROWS, BLOCK_VERSION, TYPES, is_block
from typhoon.wire.rows import decode_rows

_NAME_OF_CODE = {code: name for name, (code, _) in TYPES.items()}
_DTYPE: dict[str, np.dtype[Any]] = {
    "int64": np.dtype("<i8"),
    "float64": np.dtype("<f8"),
    "bool": np.dtype("u1"),
}
_VARIABLE = ("bytes", "str")
_HEAD = struct.Struct("<BBB")
_ROWS = BLOCK_ROWS
_OFFSETS = np.dtype("<u4")


class VarColumn:
    """A bytes or str column as its offsets and data: values are built only when read."""

    __slots__ = ("offsets", "data", "text")

    def __init__(self, offsets: npt.NDArray[np.uint32], data: bytes, text: bool) -> None:
        self.offsets = offsets  # n + 1 of them, into data
        self.data = data
        self.text = text

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def tolist(self) -> list[Any]:
        ends = self.offsets.tolist()
        data = self.data
        out = [data[a:b] for a, b in zip(ends, ends[1:], strict=False)]
        if self.text:
            return [b.decode("utf-8") for b in out]
        return out

    def take(self, index: npt.NDArray[np.intp]) -> VarColumn:
        """The values at ``index`` (ascending), as a column of their own."""
        data, offsets = self.data, self.offsets
        starts, stops = offsets[index].tolist(), offsets[index + 1].tolist()
        parts = [data[a:b] for a, b in zip(starts, stops, strict=True)]
        offsets = np.zeros(len(parts) + 1, dtype=_OFFSETS)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        return VarColumn(offsets, b"".join(parts), self.text)

    def values_at(self, index: npt.NDArray[np.intp]) -> list[Any]:
        """The values at ``index``, as Python objects (no new column)."""
        data, offsets = self.data, self.offsets
        starts, stops = offsets[index].tolist(), offsets[index + 1].tolist()
        out = [data[a:b] for a, b in zip(starts, stops, strict=True)]
        return [b.decode("utf-8") for b in out] if self.text else out

    def slice(self, start: int, stop: int) -> VarColumn:
        return VarColumn(self.offsets[start : stop + 1], self.data, self.text)


Column = npt.NDArray[Any] | VarColumn


@dataclass
class Columns:
    """The rows of one or more blocks as columns: ``cols[i]`` is field ``i``'s values
    (a numpy array, or a :class:`VarColumn` for bytes and str), ``n`` the row count."""

    types: tuple[str, ...]
    cols: list[Column]
    n: int

    def __len__(self) -> int:
        return self.n

    def column(self, i: int) -> list[Any]:
        """Field ``i``'s values as Python objects (what the rows hold)."""
        c = self.cols[i]
        values: list[Any] = c.tolist()
        return values

    def rows(self) -> list[list[Any]]:
        """The rows, as the msgpack row batch of the same values decodes them."""
        if not self.n:
            return []
        return list(map(list, zip(*(self.column(i) for i in range(len(self.cols))), strict=True)))

    def __getitem__(self, part: slice) -> Columns:
        return self.slice(part.start or 0, self.n if part.stop is None else part.stop)

    def slice(self, start: int, stop: int) -> Columns:
        stop = min(stop, self.n)
        cols: list[Column] = [c.slice(start, stop) if isinstance(c, VarColumn) else c[start:stop]
                              for c in self.cols]  # fmt: skip
        return Columns(self.types, cols, max(0, stop - start))

    def rows_at(self, index: npt.NDArray[np.intp]) -> list[list[Any]]:
        """The rows at ``index`` (row numbers), built for those rows only."""
        if not len(index):
            return []
        values = [c.values_at(index) if isinstance(c, VarColumn) else c[index].tolist()
                  for c in self.cols]  # fmt: skip
        return list(map(list, zip(*values, strict=True)))

    def take(self, mask: npt.NDArray[np.bool_]) -> Columns:
        """The rows where ``mask`` is true."""
        index = np.flatnonzero(mask)
        if not len(index):
            return self.slice(0, 0)
        cols: list[Column] = [c.take(index) if isinstance(c, VarColumn) else c[index]
                              for c in self.cols]  # fmt: skip
        return Columns(self.types, cols, len(index))

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        """One Columns of several of one layout, in order."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        cols: list[Column] = []
        for i in range(len(first.cols)):
            pieces = [p.cols[i] for p in parts]
            if isinstance(pieces[0], VarColumn):
                vs = [c for c in pieces if isinstance(c, VarColumn)]
                data = b"".join(v.data[int(v.offsets[0]) : int(v.offsets[-1])] for v in vs)
                lengths = np.concatenate([np.diff(v.offsets.astype(np.int64)) for v in vs])
                offsets = np.zeros(len(lengths) + 1, dtype=_OFFSETS)
                np.cumsum(lengths, out=offsets[1:])
                cols.append(VarColumn(offsets, data, vs[0].text))
            else:
                cols.append(np.concatenate([c for c in pieces if not isinstance(c, VarColumn)]))
        return Columns(first.types, cols, sum(p.n for p in parts))


def unpack_block(entry: bytes) -> Columns:
    """A block's columns; any defect (:data:`BLOCK_VERSION`, types, lengths, offsets,
    UTF-8, bool bytes, trailing bytes) is a :class:`WireError`."""
    if type(entry) is not bytes:
        entry = bytes(entry)
    size = len(entry)
    if size < _HEAD.size + _ROWS.size or entry[:1] != BLOCK_MARK:
        raise WireError("not a column block")
    _, version, k = _HEAD.unpack_from(entry)
    if version != BLOCK_VERSION:
        raise WireError(f"column block version {version} is not {BLOCK_VERSION}")
    at = _HEAD.size
    if not k or size < at + k + _ROWS.size:
        raise WireError("column block shorter than its column types")
    try:
        types = tuple(_NAME_OF_CODE[c] for c in entry[at : at + k])
    except KeyError:
        raise WireError("column block has an unknown column type") from None
    at += k
    (n,) = _ROWS.unpack_from(entry, at)
    at += _ROWS.size
    cols: list[Column] = []
    for kind in types:
        if kind in _VARIABLE:
            end = at + 4 * (n + 1)
            if end > size:
                raise WireError("column block offsets past its end")
            offsets = np.frombuffer(entry, dtype=_OFFSETS, count=n + 1, offset=at)
            length = int(offsets[-1])
            if offsets[0] != 0 or (n and bool((offsets[1:] < offsets[:-1]).any())):
                raise WireError("column block offsets out of order")
            if end + length > size:
                raise WireError("column block data past its end")
            data = entry[end : end + length]
            if kind == "str":  # each value valid UTF-8 (not only the whole)
                try:
                    VarColumn(offsets, data, True).tolist()
                except UnicodeDecodeError:
                    raise WireError("column block str value is not UTF-8") from None
            cols.append(VarColumn(offsets, data, kind == "str"))
            at = end + length
            continue
        dtype = _DTYPE[kind]
        end = at + dtype.itemsize * n
        if end > size:
            raise WireError("column block values past its end")
        arr = np.frombuffer(entry, dtype=dtype, count=n, offset=at)
        if kind == "bool":
            if n and int(arr.max()) > 1:
                raise WireError("column block bool column holds a byte other than 0 or 1")
            arr = arr.view(np.bool_)
        cols.append(arr)
        at = end
    if at != size:
        raise WireError(f"{size - at} bytes after the last column of a block")
    return Columns(types, cols, n)


def entry_rows(entry: bytes) -> list[list[Any]]:
    """The rows of a data entry of either kind, a row batch or a column block (for
    readers that see every stream, such as the debugger's mirror and the dissector);
    as strict as :func:`typhoon.wire.decode_rows`: any defect is a WireError."""
    if is_block(entry):
        return unpack_block(entry).rows()
    return decode_rows(entry)
