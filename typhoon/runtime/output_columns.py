"""Columnar emit: a source or operator that holds its output as columns sends them as
column blocks, without a Python object per row (docs/performance.md, "Columns").

``emit_columns(data, stream)`` takes one column per field of the stream's declared
layout (``columns:``; numpy arrays or Python sequences, as a ``{field: values}``
mapping or a list in field order) and sends each receiver its rows as blocks
(``typhoon.wire.column_pack``), each sized to fit one frame, through the same
``Transport.send`` as the row path: sequence numbers, credit and byte windows,
upstream backup (the transport records entries, blocks included) and every count
(``Router.emitted``, ``sent_to``, ``serializations``) are the row path's.  The rows
each receiver gets, and their order on each link, are exactly what ``emit_rows``
of the same rows would deliver:

* round robin and single-receiver policies deal rows out by stride, as
  ``emit_rows`` deals its slices;
* a ``fields`` or ``direct`` grouping, on one field or several of any type,
  partitions the rows with numpy (one ``Router.select`` per distinct key, on that key's
  values as its rows hold them, so a key goes where its rows would: the same hash);
* ``all`` sends the same blocks to each receiver (multicast: once), the switch-balanced
  ``sdn`` policy to its load-balancer address.

Rows go by ``emit_rows`` instead, counted per reason in the worker's
``columns_as_rows`` metric: ``no_layout`` (the stream declares no columns),
``unfit`` (a value does not fit the layout), ``keyed`` (a key field the rows do not
have: the row path raises the error).
Rows emitted before and still batched leave first, so order per link holds however
the two kinds of emit mix.  A receiver of the same process (a chain) gets the blocks
by function call.  A mixin of :class:`typhoon.runtime.framework.Framework`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typhoon.runtime.policies import Router
from typhoon.runtime.transport import Inbound
from typhoon.topology.model import DEFAULT_STREAM

if TYPE_CHECKING:
    from typhoon.runtime.framework_parts import FrameworkParts
    from typhoon.wire.columns import Columns

if TYPE_CHECKING:
    _Host = FrameworkParts
else:
    _Host = object  # at run time Framework is the host: nothing to inherit

COLUMN_CHUNK = 8192  # rows a columnar source (next_columns) may emit per event-loop turn


def _rows_of(data: Any, fields: list[str]) -> list[list[Any]]:
    """``data`` (whatever ``emit_columns`` takes) as rows of Python values."""
    from typhoon.wire.columns import Columns

    if isinstance(data, Columns):
        return data.rows()
    given = [data[f] for f in fields] if isinstance(data, dict) else list(data)
    cols = [c.tolist() if hasattr(c, "tolist") else list(c) for c in given]
    if len({len(c) for c in cols}) > 1:
        raise ValueError(f"emit_columns: columns of different lengths {[len(c) for c in cols]}")
    return [list(r) for r in zip(*cols, strict=True)]


def _length(data: Any) -> int:
    """Rows ``data`` holds (the length of its first column)."""
    if hasattr(data, "n"):
        return int(data.n)
    given = list(data.values()) if isinstance(data, dict) else list(data)
    return len(given[0]) if given else 0


class ColumnOutput(_Host):
    """``emit_columns``: columns routed and sent as blocks."""

    columns_out = 0  # rows sent in blocks by emit_columns
    blocks_out = 0  # blocks those rows made
    columns_as_rows: dict[str, int] | None = None  # reason -> rows emit_columns sent as rows

    def emit_columns(self, data: Any, stream: str = DEFAULT_STREAM) -> None:
        """Route columns from the operator: the rows they hold, as blocks (see above)."""
        from typhoon.wire.column_pack import as_columns

        routers = self.routes.get(stream)
        if not routers:
            self.unrouted += _length(data)
            return
        if self.out or self.ready:  # rows emitted earlier go first, on every link
            self.flush(force=True)
        rows: list[list[Any]] | None = None
        for r in routers:
            layout = self.columnar.out.get(r.sid) if self.columnar is not None else None
            cols = as_columns(layout, data) if layout is not None else None
            if cols is not None and (not cols.n or self._route_columns(r, cols)):
                continue
            if rows is None:
                rows = _rows_of(cols if cols is not None else data, list(self.node.output_fields))
            reason = "no_layout" if layout is None else "unfit" if cols is None else "keyed"
            self._as_rows(reason, len(rows))
            if rows:
                self._route_rows(r, rows, len(rows))

    def _as_rows(self, reason: str, n: int) -> None:
        counts = self.columns_as_rows
        if counts is None:
            counts = self.columns_as_rows = {}
        counts[reason] = counts.get(reason, 0) + n

    def _route_columns(self, r: Router, cols: Columns) -> bool:
        """Send ``cols`` on router ``r``'s stream; False: its policy needs rows."""
        from typhoon.wire.column_pack import stride

        n, sid = cols.n, r.sid
        if r.plain:
            hops = r.dealt(n)
            if hops is None:
                parts = self._keyed_columns(r, cols)
                if parts is None:
                    return False
                r.emitted += n
                for dst, part in parts:
                    if dst < 0:
                        for values in part.rows():
                            self._unrouted(r, values)
                    else:
                        self._send_columns(dst, sid, part)
                return True
            r.emitted += n
            if not hops:
                self.unrouted += n
                return True
            k = len(hops)
            for j, dst in enumerate(hops):
                self._send_columns(dst, sid, stride(cols, j, k))
            return True
        r.emitted += n
        if r.broadcast:
            if self.io.multicast:
                self._send_columns(0, sid, cols)
            else:
                entries = self._blocks(cols)
                for dst in r.hops:
                    self._send_columns(dst, sid, cols, entries)
            return True
        self._send_columns(-1 - r.route.lb_node, sid, cols)
        return True

    def _keyed_columns(self, r: Router, cols: Columns) -> list[tuple[int, Columns]] | None:
        """``cols`` dealt to the receivers of a fields or direct grouping, each receiver's
        rows in their order; None if the policy is another or a key field is missing.

        One ``Router.select`` per distinct key (``column_pack.key_codes``), on the row
        that key's first row makes (``Columns.rows_at``, the values ``emit_rows`` would
        route): whatever the key's fields and types, it goes where its rows would."""
        import numpy as np

        from typhoon.wire.column_pack import key_codes, pick

        if r.select not in (r._field, r._fields, r._direct):
            return None
        if any(f >= len(cols.cols) for f in r.fields):
            return None  # the row path raises the error this makes
        codes, firsts = key_codes(cols, r.fields)
        dsts = [r.select(row) for row in cols.rows_at(firsts)]
        where = np.asarray(dsts, dtype=np.int64)[codes]
        return [(d, pick(cols, np.flatnonzero(where == d))) for d in dict.fromkeys(dsts)]

    def _blocks(self, cols: Columns) -> list[bytes]:
        """``cols`` as blocks that each fit one frame."""
        from typhoon.wire.column_pack import entry_cuts, pack_blocks

        return pack_blocks(cols, entry_cuts(cols, self.entry_cap))

    def _send_columns(
        self, dst: int, sid: int, cols: Columns, entries: list[bytes] | None = None
    ) -> None:
        """Send ``cols`` to one receiver (``dst`` as in ``_send``: > 0 a worker, 0 the
        stream's multicast group, < 0 a load-balancer address), counted as rows are."""
        n = cols.n
        if not n:
            return
        self.serializations += n
        sent = self.sent_to
        if dst > 0:
            sent[(dst, sid)] = sent.get((dst, sid), 0) + n
        elif dst == 0:
            for h in self.routers[sid].hops:
                sent[(h, sid)] = sent.get((h, sid), 0) + n
        else:
            self.sent_balanced[sid] = self.sent_balanced.get(sid, 0) + n
        if entries is None:
            entries = self._blocks(cols)
        self.columns_out += n
        self.blocks_out += len(entries)
        if dst in self.chained:  # the next operator of our chain: a function call
            self.chained[dst].deliver(Inbound(self.worker_id, sid, entries))
        elif dst > 0:
            self.io.send(dst, sid, entries)
        elif dst == 0:
            self.io.send_group(sid, self.routers[sid].hops, entries)
        else:
            self.io.send_balanced(sid, -1 - dst, self.routers[sid].lb_slot(), entries)

    def _column_metrics(self) -> dict[str, Any]:
        """What emit_columns did, for METRIC_RESP (nothing if it never ran)."""
        if not self.columns_out and not self.columns_as_rows:
            return {}
        return {
            "columns_out": self.columns_out,
            "blocks_out": self.blocks_out,
            "columns_as_rows": dict(self.columns_as_rows or {}),
        }
