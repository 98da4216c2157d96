"""``event_source``: a seeded, out-of-order event-time stream for windows and watermarks.

Event ``i`` has the time ``i * step_ms + jitter`` with a jitter in
``[0, disorder_ms]``, so a watermark with ``out_of_order_ms >= disorder_ms``
never finds one of them late.  Every ``tardy_every``-th event instead comes
``tardy_ms`` behind (late for the watermark, within a window's allowed
lateness when ``tardy_ms <= allowed_lateness_ms + out_of_order_ms -
disorder_ms``) and every ``late_every``-th ``late_ms`` behind (beyond it, when
``late_ms`` exceeds size, lateness and the watermark's lag); every
``bad_every``-th has the text ``"bad"`` for a time (dropped and counted).  Everything is a
function of the seed and the index (:func:`event`), so a reference computes
the same events and a replay emits them again.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

from typhoon.operators.base import Context, Emit, Spout

NORMAL, TARDY, LATE, BAD = "normal", "tardy", "late", "bad"


def _draw(seed: int, i: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest(), "big")


def event(i: int, args: dict[str, Any]) -> tuple[list, str]:
    """Event ``i`` as ``[key, ts, value]`` and its kind (``normal``, ``tardy``, ``late``)."""
    r = _draw(args.get("seed", 0), i)
    step = args.get("step_ms", 1)
    base = i * step
    ts = base + r % (args.get("disorder_ms", 0) + 1)
    kind = NORMAL
    late_every, tardy_every = args.get("late_every", 0), args.get("tardy_every", 0)
    bad_every = args.get("bad_every", 0)
    if bad_every and i % bad_every == bad_every - 1:
        ts, kind = "bad", BAD
    elif late_every and i % late_every == late_every - 1 and base >= args.get("late_ms", 0):
        ts, kind = base - args["late_ms"], LATE
    elif tardy_every and i % tardy_every == tardy_every - 1 and base >= args.get("tardy_ms", 0):
        ts, kind = base - args["tardy_ms"], TARDY
    key = f"k{(r >> 20) % args.get('keys', 10)}"
    value = 1 + (r >> 40) % 100
    return [key, ts, value], kind


class EventSource(Spout):
    """``[key, ts, value]`` events (see the module docstring); ``count`` over all workers
    (worker i of P takes events i, i+P, ...), ``rate`` per worker (tuples/s, 0: unlimited)."""

    fields: ClassVar[tuple[str, ...]] = ("key", "ts", "value")

    def __init__(
        self,
        count: int,
        seed: int = 0,
        keys: int = 10,
        step_ms: int = 1,
        disorder_ms: int = 0,
        tardy_every: int = 0,
        tardy_ms: int = 0,
        late_every: int = 0,
        late_ms: int = 0,
        bad_every: int = 0,
        rate: float = 0.0,
    ) -> None:
        ints = dict(
            count=count,
            seed=seed,
            keys=keys,
            step_ms=step_ms,
            disorder_ms=disorder_ms,
            tardy_every=tardy_every,
            tardy_ms=tardy_ms,
            late_every=late_every,
            late_ms=late_ms,
            bad_every=bad_every,
        )
        for name, v in ints.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, not {v!r}")
        if keys < 1 or step_ms < 1:
            raise ValueError("keys and step_ms must be at least 1")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
            raise ValueError("rate must be a non-negative number")
        super().__init__(**ints, rate=rate)
        self.rate = float(rate)
        self.next_i = 0
        self.step = 1
        self.emitted = 0

    def open(self, context: Context) -> None:
        super().open(context)
        self.next_i = context.index
        self.step = max(1, context.parallelism)

    def next_rows(self, emit_rows: Emit, max_count: int) -> bool:
        args, count = self.args, self.args["count"]
        rows = []
        i = self.next_i
        while i < count and len(rows) < max_count:
            rows.append(event(i, args)[0])
            i += self.step
        self.next_i = i
        self.emitted += len(rows)
        if rows:
            emit_rows(rows)
        return i < count

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        return self.next_rows(lambda rows: [emit(r) for r in rows], max_count)

    def offset(self) -> dict[str, int]:
        return {"i": self.next_i, "emitted": self.emitted}

    def seek(self, offset: Any) -> None:
        if not isinstance(offset, dict) or not all(
            type(offset.get(k)) is int for k in ("i", "emitted")
        ):
            raise ValueError(f"event_source cannot seek to {offset!r}")
        self.next_i, self.emitted = offset["i"], offset["emitted"]

    def result(self) -> dict[str, Any]:
        return {"emitted": self.emitted}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {"emitted": sum(r["emitted"] for r in results)}


def expected_windows(
    args: dict[str, Any], window: dict[str, Any]
) -> tuple[dict[tuple[str, Any, Any], Any], list[list]]:
    """What ``window_aggregate`` with ``window`` (tumbling or sliding args) gives on the
    events of ``args``, computed directly: each window's final value and the events that
    go to ``late`` (events with a bad time are in neither).  Exact when the ``late``
    events are beyond the lateness and the ``tardy`` ones within it (module docstring)."""
    from typhoon.operators.windowing import add, new_acc, value_of, window_starts

    size = window["size_ms"]
    slide = window.get("slide_ms") or size
    agg = window.get("aggregate", "count")
    accs: dict[tuple[str, Any, Any], Any] = {}
    late = []
    for i in range(args["count"]):
        (key, ts, value), kind = event(i, args)
        if kind == LATE:
            late.append([key, ts, value])
            continue
        if kind == BAD:
            continue
        for s in window_starts(ts, size, slide):
            w = (key, s, s + size)
            accs[w] = add(agg, accs.get(w, new_acc(agg)), value)
    return {w: value_of(agg, a) for w, a in accs.items()}, late
