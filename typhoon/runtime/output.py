"""Output side of the framework layer: what the operator emits, routed and batched.

``emit`` picks each tuple's receiver with its stream's policy
(:mod:`typhoon.runtime.policies`) and appends it to the open batch of
(receiver, stream).  A batch is finished at the batch size or when it holds
what fits one frame, whichever comes first (a full frame does not wait for the
rest of a large batch: it would only delay the receiver), or after the maximum
delay; a finished batch is serialized at ``push`` as row-batch
entries (``typhoon.wire.encode_rows``), one msgpack call per entry, each sized to
fit one frame of the transport.  A mixin of
:class:`typhoon.runtime.framework.Framework`, which holds the state it uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from typhoon.runtime.policies import Router
from typhoon.runtime.transport import Inbound
from typhoon.topology.model import DEFAULT_STREAM
from typhoon.wire import encode_rows

if TYPE_CHECKING:
    from typhoon.runtime.framework_parts import FrameworkParts

ENTRY_FILL = 0.94  # aim a row batch at this share of an entry's room (rows vary in size)


if TYPE_CHECKING:
    _Host = FrameworkParts
else:
    _Host = object  # at run time Framework is the host: nothing to inherit


class OutputBatching(_Host):
    """Routing of emitted tuples and their batches per (receiver, stream)."""

    # the framework starts it, this part reads and sets it (declared here too: mypy cannot
    # type a protocol member read before a subclass sets it)
    ready: dict[tuple[int, int], list[list[Any]]]
    flat_out = False  # the spout emitted a whole chunk this turn, unthrottled (step_spout)

    def emit(self, values: list[Any], stream: str = DEFAULT_STREAM) -> None:
        """Route one tuple from the operator (called on the hot path)."""
        routers = self.routes.get(stream)
        if not routers:
            self.unrouted += 1
            return
        for r in routers:
            sid = r.sid
            r.emitted += 1
            if r.plain:  # unicast, receiver chosen here: the common case, _buffer inlined
                dst = r.select(values)
                if dst < 0:
                    self._unrouted(r, values)
                    continue
                self.serializations += 1
                key = (dst, sid)
                buf = self.out.get(key)
                if buf is None:
                    buf = self.out[key] = []
                    self.out_since[key] = self.now
                buf.append(values)
                if len(buf) >= self.send_at:
                    self._send(key, buf)
                    del self.out[key]
                    del self.out_since[key]
                continue
            if r.broadcast:
                self._broadcast(r, values, sid)
                continue
            # r.switched: one serialization; the switch's select group picks the worker
            self.serializations += 1
            self._buffer((-1 - r.route.lb_node, sid), values)

    def emit_rows(self, rows: list[list[Any]], stream: str = DEFAULT_STREAM) -> None:
        """Route several tuples at once: the same effect as :meth:`emit` on each row in
        order, with the per-tuple work of the common policies done per list.

        Round-robin and single-receiver policies deal the rows out by slices (row i
        goes where the i-th call of ``emit`` would have sent it), a one-field fields
        grouping by key (``Router.by_key``: each receiver's rows in their order, one
        append of them to its batch); the others route row by row.
        """
        n = len(rows)
        if not n:
            return
        routers = self.routes.get(stream)
        if not routers:
            self.unrouted += n
            return
        for r in routers:
            self._route_rows(r, rows, n)

    def _route_rows(self, r: Router, rows: list[list[Any]], n: int) -> None:
        """:meth:`emit_rows` for one router of the stream (``n`` rows)."""
        sid = r.route.stream
        if r.plain:
            hops = r.dealt(n)
            if hops is None:  # a policy that looks at the values
                dealt = r.by_key(rows) if r.one_key else None
                if dealt is None:
                    emit = self.emit_one
                    for values in rows:
                        emit(r, values)
                else:
                    self._keyed_rows(r, dealt, n)
                return
            r.emitted += n
            if not hops:
                self.unrouted += n
                return
            self.serializations += n
            k = len(hops)
            for j, dst in enumerate(hops):
                self._buffer_rows((dst, sid), rows if k == 1 else rows[j::k])
            return
        r.emitted += n
        if r.broadcast:
            if self.io.multicast:
                self.serializations += n
                self._buffer_rows((0, sid), rows)
            else:
                for dst in r.hops:
                    self.serializations += n
                    self._buffer_rows((dst, sid), rows)
            return
        self.serializations += n
        self._buffer_rows((-1 - r.route.lb_node, sid), rows)

    def _keyed_rows(self, r: Router, dealt: list[tuple[int, list[list[Any]]]], n: int) -> None:
        """Buffer ``n`` rows a fields router dealt to their receivers (``Router.by_key``)."""
        r.emitted += n
        sid = r.sid
        for dst, part in dealt:
            if dst < 0:
                for values in part:
                    self._unrouted(r, values)
                continue
            self.serializations += len(part)
            self._buffer_rows((dst, sid), part)

    def emit_one(self, r: Router, values: list[Any]) -> None:
        """:meth:`emit` for one router of a stream (a unicast policy)."""
        r.emitted += 1
        dst = r.select(values)
        if dst < 0:
            self._unrouted(r, values)
            return
        self.serializations += 1
        self._buffer((dst, r.route.stream), values)

    def _buffer_rows(self, key: tuple[int, int], rows: list[list[Any]]) -> None:
        """:meth:`_buffer` for several rows: the open batch is filled first, then every
        whole batch is finished in one :meth:`_send` (it only counts rows and queues
        them for :meth:`push`), and what is left opens the next batch."""
        size = self.send_at
        n = len(rows)
        i = 0
        buf = self.out.get(key)
        if buf is not None:
            i = max(1, size - len(buf))  # (a BATCH control may have shrunk the size)
            buf.extend(rows[:i])
            if len(buf) < size:
                return
            self._send(key, buf)
            del self.out[key]
            del self.out_since[key]
            if i >= n:
                return
        rest = n - i
        full = rest - rest % size
        if full:
            self._send(key, rows[i : i + full])
            i += full
        if i < n:
            self.out[key] = rows[i:]
            self.out_since[key] = self.now

    def _broadcast(self, r: Router, values: list[Any], sid: int) -> None:
        if self.io.multicast:
            # one serialization; the switch copies the frame to every receiver
            self.serializations += 1
            self._buffer((0, sid), values)
            return
        for dst in r.hops:
            # Storm-like baseline: one serialization per destination
            self.serializations += 1
            self._buffer((dst, sid), values)

    def _buffer(self, key: tuple[int, int], values: list[Any]) -> None:
        buf = self.out.get(key)
        if buf is None:
            buf = self.out[key] = []
            self.out_since[key] = self.now
        buf.append(values)
        if len(buf) >= self.send_at:
            self._send(key, buf)
            del self.out[key]
            del self.out_since[key]

    def _entries(self, rows: list[list[Any]], sid: int = 0) -> list[bytes]:
        """Serialize ``rows`` as row-batch entries that each fit one frame (column
        blocks on a stream that declares columns: ``typhoon.runtime.columnar``).

        One msgpack call per entry.  How many rows fit is learnt from the sizes
        the entries came to; an entry that came out too big is cut and packed
        again (rare), and a single row too big for a frame travels segmented.
        """
        pack: Callable[[list[Any]], bytes] = encode_rows
        cap = self.entry_cap
        if self.columnar is not None:
            pack = self.columnar.packer(sid) or pack
        n = len(rows)
        if n <= self.rows_per_entry:
            data = pack(rows)
            if len(data) <= cap or n == 1:
                if n > 8:
                    self._learn(len(data), n)
                return [data]
        out: list[bytes] = []
        i = 0
        while i < n:
            k = min(n - i, self.rows_per_entry)
            data = pack(rows[i : i + k])
            while len(data) > cap and k > 1:
                k = max(1, min(k - 1, int(k * cap * ENTRY_FILL / len(data))))
                data = pack(rows[i : i + k])
            if k > 8 or i + k < n:
                self._learn(len(data), k)
            out.append(data)
            i += k
        return out

    def set_batch_size(self, size: int) -> None:
        """A new batch size (a BATCH_SIZE control tuple); batches open keep their rows."""
        self.batch_size = size
        self.send_at = min(size, self.rows_per_entry)

    def _learn(self, size: int, rows: int) -> None:
        self.rows_per_entry = max(1, int(self.entry_cap * ENTRY_FILL * rows / max(1, size)))
        self.set_batch_size(self.batch_size)  # send_at follows what a frame holds

    def _send(self, key: tuple[int, int], rows: list[list[Any]]) -> None:
        """A batch is finished: it leaves at :meth:`push`, with the turn's others."""
        dst, sid = key
        n = len(rows)
        sent = self.sent_to
        if dst > 0:
            sent[key] = sent.get(key, 0) + n
        elif dst == 0:
            for h in self.routers[sid].hops:
                sent[(h, sid)] = sent.get((h, sid), 0) + n
        else:
            self.sent_balanced[sid] = self.sent_balanced.get(sid, 0) + n
        ready = self.ready.get(key)
        if ready is None:
            self.ready[key] = rows
            self.ready_since[key] = self.now
        else:
            ready.extend(rows)

    def push(self, hold: bool = False) -> None:
        """Hand the I/O layer every batch finished since the last push, one call per
        (receiver, stream): small batches of one event-loop turn share entries, frames
        and writes instead of taking one each, without waiting for anything.

        With ``hold`` (a spout emitting flat out: more comes next turn anyway), rows
        short of a frame wait for the next push, unless they have waited
        ``max_delay`` already: a frame leaves when it is full, when the worker is
        about to wait, or after the maximum delay (``docs/flow_control.md``).
        """
        if not self.ready:
            return
        if hold:
            ready = self._take_full_frames()
            if not ready:
                return
        else:
            ready, self.ready = self.ready, {}
            self.ready_since.clear()
        io = self.io
        chained = self.chained
        for (dst, sid), rows in ready.items():
            if dst in chained:  # the next operator of our chain: a function call
                chained[dst].deliver(Inbound(self.worker_id, sid, [], rows))
                continue
            entries = self._entries(rows, sid)
            if dst > 0:
                io.send(dst, sid, entries)
            elif dst == 0:
                io.send_group(sid, self.routers[sid].hops, entries)
            else:
                io.send_balanced(sid, -1 - dst, self.routers[sid].lb_slot(), entries)

    def _take_full_frames(self) -> dict[tuple[int, int], list[list[Any]]]:
        """The ready rows that fill whole frames, and all of those that waited too long
        or go to a chained receiver (a function call, no frame to fill); the rest stays
        ready (the newest rows: they arrived this turn).

        Rows to a load-balanced node (``dst < 0``) are never held: the switch splits
        its traffic by frames, and the load balancer weighs its workers by the frames
        they got, so frames of ~800 tuples made its shares lumpy (the integration
        test saw the slow worker's share dip below its band; docs/flow_control.md).
        """
        per_frame = self.rows_per_entry
        due = self.now - self.max_delay
        chained = self.chained
        out: dict[tuple[int, int], list[list[Any]]] = {}
        for key in list(self.ready):
            rows = self.ready[key]
            if key[0] < 0 or key[0] in chained or self.ready_since[key] <= due:
                out[key] = rows
                del self.ready[key], self.ready_since[key]
                continue
            whole = len(rows) - len(rows) % per_frame
            if not whole:
                continue
            out[key] = rows[:whole]
            if whole == len(rows):
                del self.ready[key], self.ready_since[key]
            else:
                self.ready[key] = rows[whole:]
                self.ready_since[key] = self.now
        return out

    def flush(self, force: bool = False) -> None:
        """Send every batch older than the max delay (or all of them), and what is ready
        (a spout emitting flat out keeps rows short of a frame, see :meth:`push`)."""
        if self.out:
            limit = self.now - self.max_delay
            for key in [k for k, t in self.out_since.items() if force or t <= limit]:
                self._send(key, self.out.pop(key))
                del self.out_since[key]
        self.push(hold=self.flat_out and not force)

    def next_deadline(self) -> float:
        """Seconds until the oldest batch must go out (for the poll timeout)."""
        since = [*self.out_since.values(), *self.ready_since.values()]
        if not since:
            return 0.05
        return max(0.0, min(since) + self.max_delay - self.now)
