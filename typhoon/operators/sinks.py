"""Built-in stateful bolt and sinks whose results make the run report."""

from __future__ import annotations

import base64
import time
import zlib
from typing import Any, ClassVar

from typhoon.operators.base import Bolt, Context, Emit
from typhoon.operators.seq_runs import check_columns, mark_run


class CountByKey(Bolt):
    """Counts tuples per key in keyed state; emits ``[key, count]`` deltas on SIGNAL.

    The count of a key lives on the one worker that owns its key group
    (``Context.keyed_state``), so a rescale moves it and the node's result is
    the union of its workers' counts.  ``on_signal`` (SIGNAL with ``stateful:
    true``, and end of stream) emits what each key gained since its last flush
    (paper Listing 2); what was flushed is keyed state too, so it moves with
    the key and nothing is emitted twice.
    """

    fields: ClassVar[tuple[str, ...]] = ("key", "count")
    keyed: ClassVar[bool] = True
    keyed_optional: ClassVar[bool] = True  # any grouping; keyed state when key-routed
    keyed_shape: ClassVar[dict[str, str] | None] = {"counts": "int", "flushed": "int"}

    def __init__(self, key: str | None = None) -> None:
        super().__init__(key=key)
        self.key = key
        self.counts: Any = {}
        self.flushed: Any = {}
        self.data: dict[Any, int] = {}
        self.key_of: Any = None
        self.owned: Any = None

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        key = args.get("key")
        if key is not None and key not in input_fields:
            raise ValueError(f"key field '{key}' is not one of the input fields {input_fields}")
        if not input_fields and key is None:
            raise ValueError("count_by_key needs an input field to count by")
        return list(cls.fields)

    def open(self, context: Context) -> None:
        super().open(context)
        keyed = context.keyed
        if keyed is None:
            # input not routed by key (shuffle, ...): a key may be counted on several
            # workers; the report adds their counts up
            index = context.input_fields.index(self.key) if self.key is not None else 0
            self.counts, self.flushed = {}, {}
            self.data = self.counts
            self.key_of = lambda values: values[index]
            return
        self.counts = context.keyed_state("counts", default=0)
        self.flushed = context.keyed_state("flushed", default=0)
        self.data = self.counts.data
        self.key_of = context.key
        names = [context.input_fields[i] for i in keyed.key_indexes]
        if self.key is not None and names != [self.key]:
            raise ValueError(
                f"count_by_key of '{context.node}' counts by '{self.key}', but its input is "
                f"grouped on {names}: group the stream on [{self.key}]"
            )
        self.owned = keyed.owned

    def process(self, values: list, emit: Emit) -> None:
        k = self.key_of(values)
        data = self.data
        if k in data:
            data[k] += 1
        else:
            self.counts[k] = 1  # keyed state checks that the key is ours

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        key_of, counts, data = self.key_of, self.counts, self.data
        for values in rows:
            k = key_of(values)
            if k in data:
                data[k] += 1
            else:
                counts[k] = 1

    def snapshot(self) -> Any:
        """Keyed state is checkpointed by the framework; plain counts (input not
        key-routed) are this worker's own state."""
        if self.owned is not None:
            return None
        return {
            "counts": [[k, v] for k, v in self.counts.items()],
            "flushed": [[k, v] for k, v in self.flushed.items()],
        }

    def restore(self, state: Any) -> None:
        if state is None:
            return
        self.counts.clear()
        self.counts.update((_hashable(k), v) for k, v in state["counts"])
        self.flushed.clear()
        self.flushed.update((_hashable(k), v) for k, v in state["flushed"])

    def on_signal(self, emit: Emit) -> None:
        flushed = self.flushed if self.owned is None else self.flushed.data
        for k, c in self.data.items():
            d = c - flushed.get(k, 0)
            if d:
                flushed[k] = c
                emit([list(k) if type(k) is tuple else k, d])

    def result(self) -> dict[str, Any]:
        return {
            "counts": {_key_str(k): v for k, v in self.data.items()},
            "keys": len(self.data),
            "key_groups": len(self.owned) if self.owned is not None else 0,
        }

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        counts: dict[str, int] = {}
        workers: dict[str, int] = {}
        for r in results:
            for k, v in r["counts"].items():
                counts[k] = counts.get(k, 0) + v
                workers[k] = workers.get(k, 0) + 1
        return {
            "counts": counts,
            # ownership: keys and key groups per worker, and keys more than one held
            "ownership": [
                {"keys": r.get("keys", len(r["counts"])), "key_groups": r.get("key_groups", 0)}
                for r in results
            ],
            "keys_on_several_workers": sum(1 for n in workers.values() if n > 1),
        }


def _hashable(k: Any) -> Any:
    return tuple(k) if type(k) is list else k


def _key_str(k: Any) -> str:
    return str(list(k)) if type(k) is tuple else str(k)


class KeyOrigins(Bolt):
    """Sink: per key, which upstream workers sent it and the sum of a count field.

    For checking a stateful node from downstream (``[key, count]`` tuples that
    ``count_by_key`` emits on SIGNAL): a key whose state lives on exactly one
    worker arrives from exactly one sender, and the sums equal the input's
    counts only if every flush reached the sink.  ``key`` names the key field
    (default: the first input field), ``count`` the field summed (default: none,
    each tuple counts 1).  The framework tells it each frame's sender
    (``sees_sender``).
    """

    sees_sender: ClassVar[bool] = True

    def __init__(self, key: str | None = None, count: str | None = None) -> None:
        super().__init__(key=key, count=count)
        self.names = (key, count)
        self.idx = (0, -1)
        self.origins: dict[Any, set[int]] = {}
        self.sums: dict[Any, int] = {}
        self.tuples = 0

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        for role in ("key", "count"):
            name = args.get(role)
            if name is not None and name not in input_fields:
                raise ValueError(f"{role} field '{name}' is not one of the input fields")
        if not input_fields:
            raise ValueError("key_origins needs an input field to group by")
        return []

    def open(self, context: Context) -> None:
        super().open(context)
        f = context.input_fields
        key, count = self.names
        self.idx = (f.index(key) if key else 0, f.index(count) if count else -1)

    def process(self, values: list, emit: Emit) -> None:
        ik, ic = self.idx
        k = values[ik]
        self.tuples += 1
        self.sums[k] = self.sums.get(k, 0) + (values[ic] if ic >= 0 else 1)
        senders = self.origins.get(k)
        if senders is None:
            senders = self.origins[k] = set()
        senders.add(self.sender)

    def snapshot(self) -> dict[str, Any]:
        return {
            "origins": [[k, sorted(v)] for k, v in self.origins.items()],
            "sums": [[k, n] for k, n in self.sums.items()],
            "tuples": self.tuples,
        }

    def restore(self, state: Any) -> None:
        self.origins = {k: set(v) for k, v in state["origins"]}
        self.sums = {k: n for k, n in state["sums"]}
        self.tuples = state["tuples"]

    def result(self) -> dict[str, Any]:
        return {
            "tuples": self.tuples,
            "keys": {
                str(k): {"from": sorted(self.origins[k]), "sum": n} for k, n in self.sums.items()
            },
        }

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        keys: dict[str, dict[str, Any]] = {}
        tuples = 0
        for r in results:
            tuples += r["tuples"]
            for k, v in r["keys"].items():
                m = keys.setdefault(k, {"from": [], "sum": 0})
                m["from"] = sorted(set(m["from"]) | set(v["from"]))
                m["sum"] += v["sum"]
        return {"tuples": tuples, "keys": keys}


class SequenceCheck(Bolt):
    """Checks ``[src, seq, ...]`` tuples for loss, duplicates and order, per source.

    Each worker keeps a bitmap of the sequence numbers it received per source
    (one bit per tuple), so the run report can OR the bitmaps of all workers of
    the node and compare with what each source emitted: exact missing and
    duplicate counts even when a node's workers each see only a share.  It
    also samples latency from the ``ts`` field (sender's clock) and keeps a
    timeline of arrivals (tuples per ``TICK_S`` of wall-clock time, read every
    ``TICK_EVERY`` tuples), so a run's throughput can be read afterwards even
    across reconfigurations and controller outages.
    """

    MAX_SAMPLES: ClassVar[int] = 100_000
    TICK_S: ClassVar[float] = 0.1
    TICK_EVERY: ClassVar[int] = 256

    def __init__(self, src: str = "src", seq: str = "seq", ts: str = "ts") -> None:
        super().__init__(src=src, seq=seq, ts=ts)
        self.names = (src, seq, ts)
        self.idx = (0, 1, 2)
        self.bitmaps: dict[Any, bytearray] = {}
        self.highest: dict[Any, int] = {}
        self.received = 0
        self.duplicates = 0
        self.out_of_order = 0
        self.latencies: list[float] = []
        self.stride = 1
        self._tick = 0
        self.timeline: dict[int, int] = {}  # int(time / TICK_S) -> tuples
        self._counted = 0

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        for role in ("src", "seq"):
            name = args.get(role, role)
            if name not in input_fields:
                raise ValueError(f"{role} field '{name}' is not one of the input fields")
        return []

    def open(self, context: Context) -> None:
        super().open(context)
        f = context.input_fields
        ts = f.index(self.names[2]) if self.names[2] in f else -1
        self.idx = (f.index(self.names[0]), f.index(self.names[1]), ts)

    def process(self, values: list, emit: Emit) -> None:
        isrc, iseq, its = self.idx
        src, seq = values[isrc], values[iseq]
        self.received += 1
        if not self.received % self.TICK_EVERY:
            self._mark_time()
        bm = self.bitmaps.get(src)
        if bm is None:
            bm = self.bitmaps[src] = bytearray(1024)
            self.highest[src] = -1
        byte = seq >> 3
        if byte >= len(bm):
            bm.extend(bytes(max(byte + 1 - len(bm), len(bm))))
        bit = 1 << (seq & 7)
        if bm[byte] & bit:
            self.duplicates += 1
        else:
            bm[byte] |= bit
            if seq < self.highest[src]:
                self.out_of_order += 1
            else:
                self.highest[src] = seq
        if its >= 0:
            self._tick += 1
            if self._tick >= self.stride:
                self._tick = 0
                self.latencies.append(time.time() - values[its])
                if len(self.latencies) >= self.MAX_SAMPLES:
                    self.latencies = self.latencies[::2]
                    self.stride *= 2

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        """:meth:`process` for a whole row batch: the same counts, bits and samples.

        A batch of one source's consecutive sequence numbers (what a link carries
        in the common case) is checked as a whole (``seq_runs.mark_run``); any
        other batch row by row with the loop's state in locals."""
        isrc, iseq, its = self.idx
        before = self.received
        if not mark_run(self.bitmaps, self.highest, rows, isrc, iseq):
            self._rows(rows, isrc, iseq)
        self.received = before + len(rows)
        if self.received // self.TICK_EVERY != before // self.TICK_EVERY:
            self._mark_time()
        if its >= 0 and rows:
            self._sample(rows, its)

    def process_columns(self, cols: Any, emit: Emit) -> None:
        """:meth:`process` for the columns of column blocks (``seq_runs.check_columns``)."""
        check_columns(self, cols, emit)

    def _rows(self, rows: list[list], isrc: int, iseq: int) -> None:
        """:meth:`process`'s checks on each row, with the loop's state in locals."""
        bitmaps, highest = self.bitmaps, self.highest
        dups = ooo = 0
        src_seen, bm, high = None, None, -1
        for values in rows:
            src, seq = values[isrc], values[iseq]
            if src != src_seen or bm is None:
                if bm is not None:
                    highest[src_seen] = high
                bm = bitmaps.get(src)
                if bm is None:
                    bm = bitmaps[src] = bytearray(1024)
                    highest[src] = -1
                src_seen, high = src, highest[src]
            byte = seq >> 3
            if byte >= len(bm):
                bm.extend(bytes(max(byte + 1 - len(bm), len(bm))))
            bit = 1 << (seq & 7)
            if bm[byte] & bit:
                dups += 1
            else:
                bm[byte] |= bit
                if seq < high:
                    ooo += 1
                else:
                    high = seq
        if bm is not None:
            highest[src_seen] = high
        self.duplicates += dups
        self.out_of_order += ooo

    def _sample(self, rows: list[list], its: int) -> None:
        """The same latency samples as :meth:`process`: every stride-th tuple's, found by
        arithmetic instead of a step per row."""
        now = time.time()
        n, tick, stride = len(rows), self._tick, self.stride
        latencies = self.latencies
        i = max(0, stride - tick - 1)  # the first row that reaches the stride
        last = -1
        while i < n:
            latencies.append(now - rows[i][its])
            last = i
            if len(latencies) >= self.MAX_SAMPLES:
                latencies = self.latencies = latencies[::2]
                stride = self.stride = stride * 2
            i += stride
        self._tick = tick + n if last < 0 else n - 1 - last

    def snapshot(self) -> dict[str, Any]:
        """Everything the checks and the report read: bitmaps, counters, samples, timeline."""
        return {
            "bitmaps": {src: bytes(bm) for src, bm in self.bitmaps.items()},
            "highest": dict(self.highest),
            "received": self.received,
            "duplicates": self.duplicates,
            "out_of_order": self.out_of_order,
            "latencies": list(self.latencies),
            "stride": self.stride,
            "tick": self._tick,
            "timeline": dict(self.timeline),
            "counted": self._counted,
        }

    def restore(self, state: Any) -> None:
        self.bitmaps = {src: bytearray(bm) for src, bm in state["bitmaps"].items()}
        self.highest = dict(state["highest"])
        self.received, self.duplicates = state["received"], state["duplicates"]
        self.out_of_order = state["out_of_order"]
        self.latencies = list(state["latencies"])
        self.stride, self._tick = state["stride"], state["tick"]
        self.timeline, self._counted = dict(state["timeline"]), state["counted"]

    def _mark_time(self) -> None:
        tick = int(time.time() / self.TICK_S)
        self.timeline[tick] = self.timeline.get(tick, 0) + self.received - self._counted
        self._counted = self.received

    def result(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(p: float) -> float | None:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None

        if self.received > self._counted:
            self._mark_time()
        return {
            "received": self.received,
            "timeline": {str(k): v for k, v in sorted(self.timeline.items())},
            "duplicates": self.duplicates,
            "out_of_order": self.out_of_order,
            "bitmaps": {str(s): encode_bitmap(bm) for s, bm in self.bitmaps.items()},
            "latency_s": {"p50": pct(0.5), "p99": pct(0.99), "p999": pct(0.999)},
        }

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        """Node-wide result; bitmaps are ORed, and bits seen by two workers are duplicates."""
        merged: dict[str, int] = {}
        dups = 0
        for r in results:
            for src, enc in r["bitmaps"].items():
                bits = decode_bitmap(enc)
                prev = merged.get(src, 0)
                dups += (prev & bits).bit_count()
                merged[src] = prev | bits
        timeline: dict[str, int] = {}
        for r in results:
            for tick, n in r.get("timeline", {}).items():
                timeline[tick] = timeline.get(tick, 0) + n
        return {
            "received": sum(r["received"] for r in results),
            "timeline": dict(sorted(timeline.items())),
            "tick_s": cls.TICK_S,
            "duplicates": sum(r["duplicates"] for r in results) + dups,
            "out_of_order": sum(r["out_of_order"] for r in results),
            "distinct": {src: bits.bit_count() for src, bits in merged.items()},
            "latency_s": max((r["latency_s"] for r in results), key=lambda x: x["p50"] or 0),
        }


def encode_bitmap(bm: bytearray) -> str:
    """Compact text form of a sequence bitmap for the JSON report."""
    return base64.b64encode(zlib.compress(bytes(bm))).decode("ascii")


def decode_bitmap(text: str) -> int:
    """Bitmap as an int (bit n = sequence number n received)."""
    return int.from_bytes(zlib.decompress(base64.b64decode(text)), "little")


class Collect(Bolt):
    """Keeps received tuples (up to ``limit``) for the report."""

    def __init__(self, limit: int = 100_000) -> None:
        if not isinstance(limit, int) or limit < 0:
            raise ValueError("limit must be a non-negative integer")
        super().__init__(limit=limit)
        self.limit = limit
        self.count = 0
        self.tuples: list[list] = []

    def process(self, values: list, emit: Emit) -> None:
        self.count += 1
        if len(self.tuples) < self.limit:
            self.tuples.append(values)

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        self.count += len(rows)
        room = self.limit - len(self.tuples)
        if room > 0:
            self.tuples.extend(rows[:room])

    def snapshot(self) -> dict[str, Any]:
        return {"count": self.count, "tuples": list(self.tuples)}

    def restore(self, state: Any) -> None:
        self.count, self.tuples = state["count"], [list(t) for t in state["tuples"]]

    def result(self) -> dict[str, Any]:
        return {"count": self.count, "tuples": self.tuples}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {
            "count": sum(r["count"] for r in results),
            "tuples": [t for r in results for t in r["tuples"]],
        }
