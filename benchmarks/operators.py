"""Operators the benchmark topologies run (named ``benchmarks.operators:Class`` in them).

They extend the built-in ``sequence_source`` / ``sequence_check`` rather than
replace them, so the run report still accounts for every tuple (missing,
duplicates) by the same bitmaps; what they add is what a figure needs and a
plain run does not:

* :class:`BenchSink` times the first and last arrival (throughput measured
  where tuples land, not where they leave: a TCP socket buffer holds tens of
  thousands of tuples the source has "sent") and keeps latency quantiles for
  a CDF;
* :class:`AckingSource`, :class:`BenchSink` with ``ack: true`` and
  :class:`Acker` reproduce Storm's guaranteed-processing traffic (paper
  Fig. 8b): per tuple the source sends an *init* to the acker, the sink sends an
  *ack*, and the acker XORs the edge ids until a tuple's tree is complete.
  Storm's acker then tells the spout; a topology here is a DAG, so the acker
  is a sink and records the completion (and its latency) itself.  Replay on
  timeout is not modelled: these runs have no failures, and the throughput
  cost is the extra messages, which are all here;
* :class:`EventLoggingSource` and :class:`EventLogger` reproduce Storm's live
  debugging (paper Fig. 12): the observed worker sends a second serialized
  copy of every tuple to an event-logger bolt once a SIGNAL switches it on;
* :class:`TimedCount` is ``count_by_key`` that also counts its arrivals per
  clock tick (``benchmarks.arrivals``), so that the ``peers`` scenario reads
  a wordcount's steady rate the same way from Typhoon and from Bytewax.
"""

from __future__ import annotations

import random
import time
from collections import deque
from operator import itemgetter
from typing import Any, ClassVar

from benchmarks.arrivals import Arrivals
from typhoon.operators.base import Bolt, Context, Emit
from typhoon.operators.seq_runs import check_columns
from typhoon.operators.sinks import CountByKey, SequenceCheck
from typhoon.operators.sources import SequenceSource

ACK_INIT_STREAM = "ack_init"
QUANTILES = 1000  # latency quantiles kept per worker: q = i/1000, enough for p99.9
EDGE_BYTES = 8  # the edge id rides in the first bytes of the payload (size unchanged)


def latency_quantiles(samples: list[float], points: int = QUANTILES) -> list[float]:
    """``points + 1`` quantiles (q = i/points) of ``samples``, in seconds, for a CDF plot."""
    if not samples:
        return []
    lat = sorted(samples)
    n = len(lat)
    return [round(lat[min(n - 1, (i * n) // points)], 7) for i in range(points + 1)]


class AckingSource(SequenceSource):
    """``sequence_source`` that also sends each tuple's init to an acker (Storm's
    ``ack_init``) on stream ``ack_init``: ``[src, seq, ts, edge]``.

    The data tuple carries the same random 64-bit edge id in the first 8 bytes
    of its payload, so the tuple keeps its size and the sink can ack it.
    """

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        n = max_count if self.count is None else min(max_count, self.count - self.next_seq)
        seq, src, fill, now = self.next_seq, self.src, self.payload[EDGE_BYTES:], time.time()
        bits = random.getrandbits
        for s in range(seq, seq + n):
            edge = bits(64) | 1  # never 0: 0 is what a completed XOR looks like
            emit([src, s, now, edge.to_bytes(EDGE_BYTES, "little") + fill])
            emit([src, s, now, edge], ACK_INIT_STREAM)
        self.next_seq = seq + n
        return self.count is None or self.next_seq < self.count


class BenchSink(SequenceCheck):
    """``sequence_check`` plus first/last arrival times and latency quantiles.

    Args: as ``sequence_check``, ``ack`` (emit ``[src, seq, ts, edge]`` for
    every tuple, for an :class:`Acker`), and ``cheap``: check each arriving row
    batch by its ends instead of row by row (see :meth:`_check_ends`), so that a
    sink costs little more than decoding and a benchmark measures the transport
    and the switch rather than the sink's Python (one-to-many on two cores).
    """

    def __init__(
        self,
        src: str = "src",
        seq: str = "seq",
        ts: str = "ts",
        ack: bool = False,
        cheap: bool = False,
    ):
        super().__init__(src=src, seq=seq, ts=ts)
        self.args["ack"] = ack
        self.args["cheap"] = cheap
        self.ack = bool(ack)
        self.cheap = bool(cheap)
        self.first = 0.0
        self.last = 0.0
        self.payload_index = 3
        self.sampled = 0  # batches checked by their ends only (cheap)

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        super().output_fields(args, input_fields)
        return ["src", "seq", "ts", "edge"] if args.get("ack") else []

    def open(self, context: Context) -> None:
        super().open(context)
        if "payload" in context.input_fields:
            self.payload_index = context.input_fields.index("payload")

    def process(self, values: list, emit: Emit) -> None:
        now = time.time()
        if not self.first:
            self.first = now
        self.last = now
        super().process(values, emit)
        if self.ack:
            isrc, iseq, its = self.idx
            edge = int.from_bytes(values[self.payload_index][:EDGE_BYTES], "little")
            emit([values[isrc], values[iseq], values[its], edge])

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        """:meth:`process` for a whole row batch (the same checks, acks and times)."""
        now = time.time()
        if not self.first:
            self.first = now
        self.last = now
        if not self.cheap or not self._check_ends(rows, now):
            super().process_batch(rows, emit)
        if self.ack:
            isrc, iseq, its = self.idx
            pi = self.payload_index
            for values in rows:
                edge = int.from_bytes(values[pi][:EDGE_BYTES], "little")
                emit([values[isrc], values[iseq], values[its], edge])

    def process_columns(self, cols: Any, emit: Emit) -> None:
        """:meth:`process_batch` for column blocks (a stream that declares columns): the
        exact check on the columns (``seq_runs.check_columns``, no row built), with the
        arrival times; acks (``ack``) need the rows."""
        if self.ack:
            self.process_batch(cols.rows(), emit)
            return
        now = time.time()
        if not self.first:
            self.first = now
        self.last = now
        check_columns(self, cols, emit)

    def _check_ends(self, rows: list[list], now: float) -> bool:
        """Account for a batch of one source's consecutive sequence numbers as a whole
        (one bitmap range, one latency sample); False (check row by row) for anything else.

        Taken only when the batch's columns are exactly one source and ``lo .. lo+n-1``
        (compared column-wise in C, ~20 ns a row) and nothing at or above ``lo`` was seen
        yet, so it gives the row-by-row check's received/duplicate/bitmap verdicts. (It
        once looked at the first, middle and last rows only, and hypothesis found a
        batch ``[2..67, 0, 1, 70]`` whose ends and middle fit.)
        """
        isrc, iseq, its = self.idx
        head, tail = rows[0], rows[-1]
        src, lo = head[isrc], head[iseq]
        n = len(rows)
        if (
            type(lo) is not int
            or lo < 0
            or tail[isrc] != src
            or tail[iseq] != lo + n - 1
            or rows[n >> 1][iseq] != lo + (n >> 1)
            or rows[n >> 1][isrc] != src
            or self.highest.get(src, -1) >= lo
            or list(map(itemgetter(iseq), rows)) != list(range(lo, lo + n))
            or list(map(itemgetter(isrc), rows)).count(src) != n
        ):
            return False
        bm = self.bitmaps.get(src)
        if bm is None:
            bm = self.bitmaps[src] = bytearray(1024)
        set_bits(bm, lo, lo + n)
        self.highest[src] = lo + n - 1
        before = self.received
        self.received = before + n
        if self.received // self.TICK_EVERY != before // self.TICK_EVERY:
            self._mark_time()
        if its >= 0:
            self.latencies.append(now - head[its])  # one sample per batch
            if len(self.latencies) >= self.MAX_SAMPLES:
                self.latencies = self.latencies[::2]
        self.sampled += 1
        return True

    def result(self) -> dict[str, Any]:
        out = super().result()
        out["sampled_batches"] = self.sampled
        out["first_s"] = self.first
        out["last_s"] = self.last
        out["quantiles_s"] = latency_quantiles(self.latencies)
        return out

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        """The node-wide check, plus each worker's timing (per-sink throughput, CDF)."""
        merged = super().merge_results(results)
        merged["per_worker"] = [
            {
                "received": r["received"],
                "first_s": r["first_s"],
                "last_s": r["last_s"],
                "quantiles_s": r["quantiles_s"],
            }
            for r in results
        ]
        return merged


def set_bits(bm: bytearray, lo: int, hi: int) -> None:
    """Set bits ``lo`` .. ``hi - 1`` of a little-endian bitmap, growing it as needed."""
    if hi <= lo:
        return
    need = ((hi - 1) >> 3) + 1
    if need > len(bm):
        bm.extend(bytes(max(need - len(bm), len(bm))))
    a, b = lo >> 3, hi >> 3
    if a == b:
        bm[a] |= ((1 << (hi - lo)) - 1) << (lo & 7)
        return
    bm[a] |= (0xFF << (lo & 7)) & 0xFF
    if b > a + 1:
        bm[a + 1 : b] = b"\xff" * (b - a - 1)
    if hi & 7:
        bm[b] |= (1 << (hi & 7)) - 1


class Acker(Bolt):
    """Storm's acker: XORs each tuple's init and acks until it is zero (tree complete).

    Input ``[src, seq, ts, edge]`` from the source's ``ack_init`` stream and from
    the sink.  Completion latency is measured from ``ts`` (the source's clock;
    one machine, one clock).  ``pending`` at the end are tuples never fully
    processed: lost somewhere on the way.
    """

    fields: ClassVar[tuple[str, ...]] = ()
    MAX_SAMPLES: ClassVar[int] = 100_000

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[tuple[Any, int], int] = {}
        self.completed = 0
        self.first = 0.0
        self.last = 0.0
        self.latencies: list[float] = []
        self.stride = 1
        self._tick = 0

    def process(self, values: list, emit: Emit) -> None:
        key = (values[0], values[1])
        pending = self.pending
        x = pending.pop(key, 0) ^ values[3]
        if x:
            pending[key] = x
            return
        now = time.time()
        if not self.first:
            self.first = now
        self.last = now
        self.completed += 1
        self._tick += 1
        if self._tick >= self.stride:
            self._tick = 0
            self.latencies.append(now - values[2])
            if len(self.latencies) >= self.MAX_SAMPLES:
                self.latencies = self.latencies[::2]
                self.stride *= 2

    def result(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "pending": len(self.pending),
            "first_s": self.first,
            "last_s": self.last,
            "quantiles_s": latency_quantiles(self.latencies),
        }

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {
            "completed": sum(r["completed"] for r in results),
            "pending": sum(r["pending"] for r in results),
            "per_worker": results,
        }


EVENT_LOG_STREAM = "eventlog"
MARK_S = 0.5  # seconds between the CPU marks of an EventLoggingSource


class EventLoggingSource(SequenceSource):
    """``sequence_source`` with Storm's event logger, switched at run time, and a CPU log.

    Storm's live debugging: once debugging is enabled for a component, its
    executor sends, besides every tuple, a second copy to the event-logger
    bolt, serialized and sent a second time by the observed worker (paper
    Fig. 12, Table 5).  Here a SIGNAL control tuple (``POST
    /typhoon/apps/NAME/control``, through the controller like any control
    tuple) switches that copy on, the next SIGNAL off; the copy is the same
    values on stream ``eventlog``, which the framework serializes and sends
    again.  End of stream also calls ``on_signal`` (after the last tuple, so
    that switch copies nothing); ``switches`` records every one.

    ``marks`` is ``[wall time, tuples emitted, copies, process CPU s]`` about
    every ``MARK_S`` seconds: the CPU the worker spent per tuple in any stretch
    of the run, read by the worker itself.
    """

    def __init__(self, count: int | None = None, size: int = 100, rate: float = 0.0) -> None:
        super().__init__(count=count, size=size, rate=rate)
        self.logging = False
        self.copies = 0
        self.switches: list[list[float]] = []  # [wall time, 1 on / 0 off, tuples emitted]
        self.marks: list[list[float]] = []
        self._next_mark = 0.0

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        if not self.logging:
            more = super().next_batch(emit, max_count)
        else:
            n = max_count if self.count is None else min(max_count, self.count - self.next_seq)
            seq, src, payload, now = self.next_seq, self.src, self.payload, time.time()
            for s in range(seq, seq + n):
                values = [src, s, now, payload]
                emit(values)
                emit(values, EVENT_LOG_STREAM)
            self.next_seq = seq + n
            self.copies += n
            more = self.count is None or self.next_seq < self.count
        now = time.time()
        if now >= self._next_mark:
            self._mark(now)
        return more

    def _mark(self, now: float) -> None:
        self.marks.append([now, self.next_seq, self.copies, time.process_time()])
        self._next_mark = now + MARK_S

    def on_signal(self, emit: Emit) -> None:
        self.logging = not self.logging
        self.switches.append([time.time(), int(self.logging), self.next_seq])

    def result(self) -> dict[str, Any]:
        self._mark(time.time())
        return {
            **super().result(),
            "copies": self.copies,
            "switches": self.switches,
            "marks": self.marks,
        }


class EventLogger(Bolt):
    """Storm's event-logger bolt: receives the copies, keeps the newest ``ring`` of them.

    The debug consumer of the application-level variant: what it costs is
    mostly the framework's receive and deserialization of every copy, as the
    live debugger's debug worker decodes every mirrored frame.
    """

    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, ring: int = 1000) -> None:
        if not isinstance(ring, int) or ring < 1:
            raise ValueError("ring must be a positive integer")
        super().__init__(ring=ring)
        self.ring: deque[list] = deque(maxlen=ring)
        self.received = 0

    def process(self, values: list, emit: Emit) -> None:
        self.received += 1
        self.ring.append(values)

    def result(self) -> dict[str, Any]:
        return {"received": self.received}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {"received": sum(r["received"] for r in results)}


class TimedCount(CountByKey):
    """``count_by_key`` plus its arrivals per clock tick: one clock read per row batch."""

    def __init__(self, key: str | None = None) -> None:
        super().__init__(key=key)
        self.arrivals = Arrivals()

    def process(self, values: list, emit: Emit) -> None:
        super().process(values, emit)
        self.arrivals.add(1)

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        super().process_batch(rows, emit)
        self.arrivals.add(len(rows))

    def result(self) -> dict[str, Any]:
        return {**super().result(), "arrivals": self.arrivals.to_dict()}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        merged = Arrivals.merged(Arrivals.from_dict(r["arrivals"]) for r in results)
        return {**super().merge_results(results), "arrivals": merged.to_dict()}
