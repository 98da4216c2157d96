"""Operators of the ``rescale`` benchmark (named ``benchmarks.keyed_ops:Class`` in it).

A keyed, non-additive pipeline whose per-key state can be made large:

* :class:`KeyedSource` numbers its tuples and keys them round-robin over
  ``keys`` keys (``[key, seq, ts]``), so after ``n`` tuples key ``k`` has
  been sent ``n // keys + (k < n % keys)`` times: the reference the sink's
  results are held against, independent of the run;
* :class:`PaddedRunningCount` keeps ``[count, padding]`` per key in keyed
  state (``pad`` bytes each: the state a rescale moves) and emits the running
  count on every tuple: the sink's maxima are the counts only if each key's
  state moved with it;
* :class:`PaddedFlushCount` is the same count kept the paper's way
  (Listing 2, ``stateful: true``): a plain per-worker cache that a SIGNAL
  flushes downstream, padding included, and then starts again from zero.
  Its running counts are partial; the sink adds the flushed ones up;
* :class:`RescaleSink` keeps each key's largest running count and the sum of
  its flushed partials, and per wall-clock second the tuples that arrived and
  their latency quantiles (``benchmarks.rescale_stats``).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import msgpack

from benchmarks.rescale_stats import second_stats
from typhoon.operators.base import Bolt, Context, Emit
from typhoon.operators.sources import SequenceSource

OUT_FIELDS = ("key", "count", "ts", "state")  # state: None, or a flushed key's padding


def _pad(n: int) -> bytes:
    return bytes(n)  # a new object per key: each key's state really takes the memory


def expected_count(key: int, emitted: int, keys: int) -> int:
    """How often :class:`KeyedSource` sent ``key`` in its first ``emitted`` tuples."""
    return emitted // keys + (1 if key < emitted % keys else 0)


class KeyedSource(SequenceSource):
    """``[key, seq, ts]`` with ``key = seq % keys``; args ``count``, ``keys``, ``rate``."""

    fields: ClassVar[tuple[str, ...]] = ("key", "seq", "ts")

    def __init__(self, count: int | None = None, keys: int = 1000, rate: float = 0.0) -> None:
        if not isinstance(keys, int) or keys < 1:
            raise ValueError("keys must be a positive integer")
        super().__init__(count=count, size=0, rate=rate)
        self.args["keys"] = keys
        self.keys = keys

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        n = max_count if self.count is None else min(max_count, self.count - self.next_seq)
        seq, keys, now = self.next_seq, self.keys, time.time()
        for s in range(seq, seq + n):
            emit([s % keys, s, now])
        self.next_seq = seq + n
        return self.count is None or self.next_seq < self.count

    def next_rows(self, emit_rows: Emit, max_count: int) -> bool:
        n = max_count if self.count is None else min(max_count, self.count - self.next_seq)
        seq, keys, now = self.next_seq, self.keys, time.time()
        emit_rows([[s % keys, s, now] for s in range(seq, seq + n)])
        self.next_seq = seq + n
        return self.count is None or self.next_seq < self.count

    def result(self) -> dict[str, Any]:
        return {"emitted": self.next_seq, "keys": self.keys}


def _check_pad(pad: Any) -> int:
    if not isinstance(pad, int) or pad < 0:
        raise ValueError("pad must be a non-negative integer (bytes of state per key)")
    return pad


class PaddedRunningCount(Bolt):
    """Keyed state ``[count, padding]`` per key; emits ``[key, count, ts, None]`` per tuple."""

    fields: ClassVar[tuple[str, ...]] = OUT_FIELDS
    keyed: ClassVar[bool] = True

    def __init__(self, pad: int = 0) -> None:
        super().__init__(pad=pad)
        self.pad = _check_pad(pad)
        self.state: Any = {}
        self.key_of: Any = None
        self.ts = 0

    def open(self, context: Context) -> None:
        super().open(context)
        self.state = context.keyed_state("state")
        self.key_of = context.key
        self.ts = context.input_fields.index("ts")

    def process(self, values: list, emit: Emit) -> None:
        self.process_batch([values], emit)

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        key_of, state, ts, pad = self.key_of, self.state, self.ts, self.pad
        data = state.data
        for values in rows:
            k = key_of(values)
            st = data.get(k)
            if st is None:
                st = [0, _pad(pad)]
                state[k] = st  # the first tuple of a key here: ownership checked
            st[0] += 1
            emit([k, st[0], values[ts], None])

    def result(self) -> dict[str, Any]:
        """Keys held here and their state's serialized size (msgpack, as it moves)."""
        data = dict(self.state.data) if hasattr(self.state, "data") else dict(self.state)
        return {"keys": len(data), "state_bytes": len(msgpack.packb(data, use_bin_type=True))}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {
            "keys": sum(r["keys"] for r in results),
            "state_bytes": sum(r["state_bytes"] for r in results),
        }


class PaddedFlushCount(Bolt):
    """The same count as a per-worker cache flushed on SIGNAL (paper Listing 2).

    Per tuple ``[key, count, ts, None]`` with the count since the key's last
    flush; ``on_signal`` emits ``[key, count, now, padding]`` for every key and
    empties the cache, as a ``stateful: true`` node does around a remap.
    """

    fields: ClassVar[tuple[str, ...]] = OUT_FIELDS

    def __init__(self, pad: int = 0) -> None:
        super().__init__(pad=pad)
        self.pad = _check_pad(pad)
        self.cache: dict[Any, list] = {}
        self.key = 0
        self.ts = 0
        self.flushes = 0
        self.first_bytes = 0  # the cache's serialized size at its first flush
        self.largest_bytes = 0  # and at its largest

    def open(self, context: Context) -> None:
        super().open(context)
        self.key = context.input_fields.index("key")
        self.ts = context.input_fields.index("ts")

    def process(self, values: list, emit: Emit) -> None:
        self.process_batch([values], emit)

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        cache, key, ts, pad = self.cache, self.key, self.ts, self.pad
        for values in rows:
            k = values[key]
            st = cache.get(k)
            if st is None:
                st = cache[k] = [0, _pad(pad)]
            st[0] += 1
            emit([k, st[0], values[ts], None])

    def on_signal(self, emit: Emit) -> None:
        if not self.cache:
            return
        self.flushes += 1
        size = len(msgpack.packb(self.cache, use_bin_type=True))
        self.largest_bytes = max(self.largest_bytes, size)
        self.first_bytes = self.first_bytes or size
        now = time.time()
        for k, (n, padding) in self.cache.items():
            emit([k, n, now, padding])
        self.cache = {}

    def result(self) -> dict[str, Any]:
        return {
            "flushes": self.flushes,
            "first_bytes": self.first_bytes,
            "largest_bytes": self.largest_bytes,
        }

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {
            "flushes": sum(r["flushes"] for r in results),
            "first_bytes": sum(r["first_bytes"] for r in results),
            "largest_bytes": max((r["largest_bytes"] for r in results), default=0),
        }


class RescaleSink(Bolt):
    """Largest running count and summed flushed counts per key; per-second arrivals
    and latencies of the per-tuple counts (not of the flushes)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxima: dict[Any, int] = {}
        self.totals: dict[Any, int] = {}
        self.bins: dict[int, list[float]] = {}
        self.tuples = 0
        self.flushed = 0
        self.flushed_bytes = 0

    def process(self, values: list, emit: Emit) -> None:
        self.process_batch([values], emit)

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        now = time.time()
        lat = self.bins.setdefault(int(now), [])
        maxima, totals = self.maxima, self.totals
        before = len(lat)
        for k, n, ts, state in rows:
            if state is None:
                lat.append(now - ts)
                if n > maxima.get(k, 0):
                    maxima[k] = n
            else:
                totals[k] = totals.get(k, 0) + n
                self.flushed += 1
                self.flushed_bytes += len(state)
        self.tuples += len(lat) - before

    def result(self) -> dict[str, Any]:
        return {
            "tuples": self.tuples,
            "flushed": self.flushed,
            "flushed_bytes": self.flushed_bytes,
            "max": {str(k): v for k, v in self.maxima.items()},
            "totals": {str(k): v for k, v in self.totals.items()},
            "seconds": [list(s) for s in second_stats(self.bins)],
        }
