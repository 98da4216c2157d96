"""The column path of one worker: streams that declare their rows' layout (``columns:``).

A sender packs each entry of such a stream as a column block
(``typhoon.wire.columns``); rows that do not fit the layout (another type, an int
outside int64, ...) go as an ordinary row batch in their place and are counted
(``columns_unfit`` in the worker's metrics), so a receiver always gets exactly the
rows that were emitted.  A receiver hands an arrival made of blocks to an operator
that declares ``process_columns(cols, emit)`` as one
:class:`typhoon.wire.columns.Columns` (numpy arrays, no Python object per row); every
other operator, and any arrival while the worker holds rows for moving state or
counts key pairs, gets the rows decoded from the blocks, as before.  A block that
does not decode, or whose types are not the stream's declared ones, is dropped and
counted (``malformed_block``), like a malformed row batch.

Built only for a worker with such a stream (:func:`column_path`); numpy is imported
only by one that receives blocks (packing needs ``struct`` alone).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from typhoon.operators.base import Operator
from typhoon.runtime.hooks import batch_hook
from typhoon.runtime.transport import IOStats
from typhoon.topology.model import Topology
from typhoon.wire import WireError, encode_rows
from typhoon.wire.layout import ColumnLayout, is_block, pack_block, parse_layout

if TYPE_CHECKING:
    from typhoon.wire.columns import Columns


class ColumnPath:
    """Declared layouts of a worker's output and input streams, and their packing."""

    def __init__(self, topo: Topology, node: str, operator: Operator) -> None:
        self.out: dict[int, ColumnLayout] = {
            s.id: parse_layout(s.columns) for s in topo.outputs_of(node) if s.columns
        }
        self.inp: dict[int, ColumnLayout] = {
            s.id: parse_layout(s.columns) for s in topo.inputs_of(node) if s.columns
        }
        self.process_columns: Callable[..., Any] | None = None
        self.bind(operator)
        self.unfit = 0  # rows of a columns stream sent as a row batch (they did not fit)
        self.blocks_in = 0  # rows that arrived in column blocks (whichever way they ran)
        self.packers: dict[int, Callable[[list[Any]], bytes]] = {}
        self.blocks: Any = None  # typhoon.wire.columns, once a stream brings blocks in
        if self.inp:  # numpy: only a worker that receives blocks pays for its import
            from typhoon.wire import columns

            self.blocks = columns

    def bind(self, operator: Operator) -> None:
        """Hand column arrivals to ``operator`` (a new instance after a rollback or swap)."""
        self.process_columns = batch_hook(operator, "process_columns", "process")

    def packer(self, sid: int) -> Callable[[list[Any]], bytes] | None:
        """How to serialize an entry of output stream ``sid`` (None: as row batches)."""
        layout = self.out.get(sid)
        if layout is None:
            return None
        pack = self.packers.get(sid)
        if pack is None:

            def pack(rows: list[Any]) -> bytes:
                block = pack_block(layout, rows)
                if block is None:
                    self.unfit += len(rows)
                    return encode_rows(rows)
                return block

            self.packers[sid] = pack
        return pack

    def columns(self, entries: list[bytes], stream: int, stats: IOStats) -> Columns | None:
        """An arrival of blocks as one Columns, for ``process_columns``; None if the
        operator has none, the stream declares no layout or an entry is a row batch
        (the caller decodes rows then).  Malformed blocks are counted and left out."""
        layout = self.inp.get(stream)
        if self.process_columns is None or layout is None:
            return None
        if not all(map(is_block, entries)):
            return None
        parts = [c for c in (self.block(e, layout, stats) for e in entries) if c is not None]
        kind: type[Columns] = self.blocks.Columns
        return kind.concat(parts) if parts else kind(layout.types, [], 0)

    def rows(self, entry: bytes, stream: int, stats: IOStats) -> list[list[Any]] | None:
        """The rows of one block (None: dropped, and counted)."""
        layout = self.inp.get(stream)
        if layout is None:
            stats.drop("malformed_block")  # a block on a stream that declares no layout
            return None
        cols = self.block(entry, layout, stats)
        return None if cols is None else cols.rows()

    def block(self, entry: bytes, layout: ColumnLayout, stats: IOStats) -> Columns | None:
        try:
            cols: Columns = self.blocks.unpack_block(entry)
        except WireError:
            stats.drop("malformed_block")
            return None
        if cols.types != layout.types:
            stats.drop("malformed_block")
            return None
        self.blocks_in += cols.n
        return cols


def block_rows_of(
    path: ColumnPath | None, entry: bytes, stream: int, stats: IOStats
) -> list[list[Any]] | None:
    """The rows of a column block that arrived on ``stream`` (None: dropped, counted)."""
    if path is None:  # no stream of this worker declares columns: not a batch it takes
        stats.drop("malformed_batch")
        return None
    return path.rows(entry, stream, stats)


def column_path(topo: Topology, node: str, operator: Operator) -> ColumnPath | None:
    """The worker's column path, or None when none of its streams declares columns."""
    if not any(s.columns for s in topo.streams if node in (s.src, s.dst)):
        return None
    return ColumnPath(topo, node, operator)
