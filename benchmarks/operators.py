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
  cost is the extra messages, which are all here.
"""

from __future__ import annotations

import random
import time
from typing import Any, ClassVar

from typhoon.operators.base import Bolt, Context, Emit
from typhoon.operators.sinks import SequenceCheck
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

    Args: as ``sequence_check``, and ``ack`` (emit ``[src, seq, ts, edge]`` for
    every tuple, for an :class:`Acker`).
    """

    def __init__(self, src: str = "src", seq: str = "seq", ts: str = "ts", ack: bool = False):
        super().__init__(src=src, seq=seq, ts=ts)
        self.args["ack"] = ack
        self.ack = bool(ack)
        self.first = 0.0
        self.last = 0.0
        self.payload_index = 3

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

    def result(self) -> dict[str, Any]:
        out = super().result()
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
