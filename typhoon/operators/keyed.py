"""Keyed tuples whose every hop is a pure function: a source, a stream splitter, a digest.

They exist so that the result of any topology built from them can be computed
without running it (``typhoon.topology.generate`` does): the source derives
each tuple from its sequence number, the splitter derives the next value and
the output stream from the tuple alone, and the digest sink keeps an
order-independent checksum of the multiset of tuples it received.  A tuple
lost, duplicated, delivered to the wrong node or corrupted on the way changes
the digest.  Tuples are ``[key, seq, value, pad]``.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

import msgpack

from typhoon.operators.base import Bolt, Emit
from typhoon.operators.sources import CountingSpout, _mix

MASK64 = (1 << 64) - 1
FIELDS = ("key", "seq", "value", "pad")


def _names(streams: Any) -> list[str]:
    if streams is None:
        return ["default"]
    if (
        not isinstance(streams, list)
        or not streams
        or not all(isinstance(s, str) and s for s in streams)
    ):
        raise ValueError("streams must be a non-empty list of stream names")
    if len(set(streams)) != len(streams):
        raise ValueError("streams must not name a stream twice")
    return list(streams)


def keyed_tuple(seed: int, seq: int, keys: int, pad: str) -> list:
    """Tuple number ``seq`` of a source with this ``seed``."""
    return [f"k{_mix(seed * 1_000_003 + seq) % keys}", seq, _mix(seed ^ (seq << 20)) >> 32, pad]


def pick_stream(streams: list[str], value: int, salt: int) -> str:
    """The output stream a tuple with ``value`` leaves on."""
    return streams[_mix(value ^ salt) % len(streams)]


def split_step(values: list, salt: int, drop: int) -> list | None:
    """What the splitter makes of one tuple: a new value, or None if it drops it."""
    value = _mix(values[2] ^ salt) >> 32
    if drop and value % drop == 0:
        return None
    return [values[0], values[1], value, values[3]]


def tuple_digest(values: list) -> int:
    """A 64-bit hash of one tuple as it travels (msgpack), the same in every process."""
    data = msgpack.packb(values, use_bin_type=True)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class KeyedSource(CountingSpout):
    """``count`` tuples ``[key, seq, value, pad]`` per worker, over one or several streams.

    Worker ``i`` of ``P`` emits sequence numbers ``i, i+P, i+2P, ...``; the key
    (one of ``keys``), the value and the output stream (one of ``streams``) are
    derived from the seed and the sequence number.  ``size`` pad characters.
    """

    fields: ClassVar[tuple[str, ...]] = FIELDS

    def __init__(
        self,
        count: int = 1000,
        keys: int = 16,
        seed: int = 1,
        size: int = 16,
        streams: list[str] | None = None,
        rate: float = 0.0,
    ) -> None:
        for name, val, low in (("count", count, 0), ("keys", keys, 1), ("size", size, 0)):
            if isinstance(val, bool) or not isinstance(val, int) or val < low:
                raise ValueError(f"{name} must be an integer >= {low}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError("seed must be an integer")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
            raise ValueError("rate must be a non-negative number")
        super().__init__(count=count, keys=keys, seed=seed, size=size, streams=streams, rate=rate)
        self.count, self.keys, self.seed = count, keys, seed
        self.streams = _names(streams)
        self.pad = "p" * size
        self.rate = float(rate)
        self.emitted = 0

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        n = min(max_count, self.count - self.emitted)
        streams, seed, keys, pad = self.streams, self.seed, self.keys, self.pad
        for j in range(self.emitted, self.emitted + n):
            t = keyed_tuple(seed, j * self.parallelism + self.index, keys, pad)
            emit(t, pick_stream(streams, t[2], seed))
        self.emitted += n
        return self.emitted < self.count


class SplitStreams(Bolt):
    """Gives each ``[key, seq, value, pad]`` tuple a new value and one of ``streams``.

    Args: ``streams`` (default: the default stream only), ``salt`` (changes the
    values and the split), ``drop`` (drop tuples whose new value is a multiple of
    it; 0 keeps all).  A pure function of the tuple, so its output is known.
    """

    def __init__(self, streams: list[str] | None = None, salt: int = 0, drop: int = 0) -> None:
        if isinstance(salt, bool) or not isinstance(salt, int):
            raise ValueError("salt must be an integer")
        if isinstance(drop, bool) or not isinstance(drop, int) or drop < 0:
            raise ValueError("drop must be a non-negative integer")
        super().__init__(streams=streams, salt=salt, drop=drop)
        self.streams = _names(streams)
        self.salt, self.drop = salt, drop

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        if list(input_fields) != list(FIELDS):
            raise ValueError(f"split_streams takes tuples {list(FIELDS)}, not {input_fields}")
        return list(FIELDS)

    def process(self, values: list, emit: Emit) -> None:
        out = split_step(values, self.salt, self.drop)
        if out is not None:
            emit(out, pick_stream(self.streams, out[2], self.salt))


class Digest(Bolt):
    """Sink: how many tuples arrived and an order-independent checksum of them.

    ``sum`` (mod 2**64) and ``xor`` of :func:`tuple_digest` over every tuple: two
    runs that delivered the same multiset of tuples have the same three numbers,
    whatever the order, the transport or the worker that got each tuple.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tuples = 0
        self.sum = 0
        self.xor = 0

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        return []

    def process(self, values: list, emit: Emit) -> None:
        h = tuple_digest(values)
        self.tuples += 1
        self.sum = (self.sum + h) & MASK64
        self.xor ^= h

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        total, x = self.sum, self.xor
        for values in rows:
            h = tuple_digest(values)
            total += h
            x ^= h
        self.tuples += len(rows)
        self.sum, self.xor = total & MASK64, x

    def snapshot(self) -> dict[str, int]:
        return {"tuples": self.tuples, "sum": self.sum, "xor": self.xor}

    def restore(self, state: Any) -> None:
        self.tuples, self.sum, self.xor = state["tuples"], state["sum"], state["xor"]

    def result(self) -> dict[str, Any]:
        return {"tuples": self.tuples, "sum": self.sum, "xor": self.xor}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        out = {"tuples": 0, "sum": 0, "xor": 0}
        for r in results:
            out["tuples"] += r["tuples"]
            out["sum"] = (out["sum"] + r["sum"]) & MASK64
            out["xor"] ^= r["xor"]
        return out
