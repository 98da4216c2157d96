"""Event-time windows as plain data: which windows a time falls in, aggregates, firing.

The logic of ``window_aggregate`` (:mod:`typhoon.operators.windows`) without a
worker, so that it can be checked against a brute-force reference
(tests/unit/test_windowing.py).  A key's windows are a list of
``[start, end, acc, fired]`` (msgpack-able: keyed state checkpoints and moves
them); ``start`` is inclusive, ``end`` exclusive, in the time field's unit
(milliseconds).  A watermark ``W`` means no tuple with a time below ``W``
follows, so a window is complete once ``W >= end`` and dropped once
``W >= end + allowed_lateness``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

AGGREGATES = ("count", "sum", "min", "max", "avg", "distinct")
NUMERIC = ("sum", "min", "max", "avg")  # aggregates whose field must hold numbers

START, END, ACC, FIRED = range(4)


@dataclass(frozen=True)
class WindowSpec:
    """Tumbling (``size``), sliding (``size`` + ``slide``) or session (``gap``) windows."""

    size: float | None = None
    slide: float | None = None
    gap: float | None = None
    aggregate: str = "count"
    lateness: float = 0.0

    @property
    def session(self) -> bool:
        return self.gap is not None

    def problem(self) -> str | None:
        """Why this is not a window, as a sentence part; None if it is one."""
        if self.aggregate not in AGGREGATES:
            return f"aggregate must be one of {', '.join(AGGREGATES)}, not {self.aggregate!r}"
        for name, v in (("size_ms", self.size), ("slide_ms", self.slide), ("gap_ms", self.gap)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                return f"{name} must be a number, not {v!r}"
            if v is not None and not (v > 0 and math.isfinite(v)):
                return f"{name} must be a positive number, not {v!r}"
        if isinstance(self.lateness, bool) or not isinstance(self.lateness, (int, float)):
            return f"allowed_lateness_ms must be a number, not {self.lateness!r}"
        if self.lateness < 0:
            return f"allowed_lateness_ms must be at least 0, not {self.lateness!r}"
        if self.size is None and self.gap is None:
            return (
                "a window needs size_ms (tumbling, or sliding with slide_ms) or gap_ms "
                "(session), and has neither"
            )
        if self.size is not None and self.gap is not None:
            return "a window takes size_ms (tumbling, sliding) or gap_ms (session), not both"
        if self.slide is not None and self.size is None:
            return "slide_ms needs size_ms (a sliding window has both)"
        if self.slide is not None and self.size is not None and self.slide > self.size:
            return (
                f"slide_ms {self.slide:g} is larger than size_ms {self.size:g}, so some "
                "tuples would fall in no window"
            )
        return None


def is_time(value: Any) -> bool:
    """A usable event time (or numeric value): an int or a finite float, not a bool."""
    t = type(value)
    return t is int or (t is float and math.isfinite(value))


def window_starts(ts: float, size: float, slide: float) -> list[float]:
    """Starts of the windows ``[s, s + size)`` with ``s`` a multiple of ``slide`` that hold
    ``ts``, newest first (tumbling: ``slide == size``, one window)."""
    last = math.floor(ts / slide) * slide
    out = []
    s = last
    while s > ts - size:
        out.append(_num(s))
        s -= slide
    return out


def _num(x: float) -> float:
    """Whole numbers as ints (window bounds print and compare as the times do)."""
    return int(x) if float(x).is_integer() else x


def new_acc(aggregate: str) -> Any:
    if aggregate == "count":
        return 0
    if aggregate == "avg":
        return [0, 0]
    if aggregate == "distinct":
        return {}
    return None  # sum, min, max: the first value


def add(aggregate: str, acc: Any, value: Any) -> Any:
    """``acc`` with one more value (a new object for numbers, the same for containers)."""
    if aggregate == "count":
        return acc + 1
    if aggregate == "sum":
        return value if acc is None else acc + value
    if aggregate == "min":
        return value if acc is None or value < acc else acc
    if aggregate == "max":
        return value if acc is None or value > acc else acc
    if aggregate == "avg":
        acc[0] += value
        acc[1] += 1
        return acc
    acc[value] = 1  # distinct
    return acc


def merge(aggregate: str, a: Any, b: Any) -> Any:
    """Two accumulators of one aggregate as one (session windows that meet)."""
    if aggregate == "count":
        return a + b
    if a is None:
        return b
    if b is None:
        return a
    if aggregate == "sum":
        return a + b
    if aggregate == "min":
        return min(a, b)
    if aggregate == "max":
        return max(a, b)
    if aggregate == "avg":
        return [a[0] + b[0], a[1] + b[1]]
    return {**a, **b}


def value_of(aggregate: str, acc: Any) -> Any:
    """What a window emits."""
    if aggregate == "avg":
        return acc[0] / acc[1] if acc[1] else None
    if aggregate == "distinct":
        return len(acc)
    return acc


class Windows:
    """Assigning tuples of one key to its windows, and firing them on a watermark.

    ``fire`` and ``late`` collect what to emit: ``(start, end, value)`` per window
    result (a late tuple within the lateness emits its window again, updated).
    """

    def __init__(self, spec: WindowSpec) -> None:
        self.spec = spec
        self.slide = spec.slide if spec.slide is not None else spec.size

    def add(self, windows: list[list], ts: float, value: Any, wm: float) -> list[tuple] | None:
        """Put a tuple of time ``ts`` into the key's ``windows``.

        Returns the updates to emit now (a window whose end the watermark ``wm``
        already passed), or None when the tuple is late for every window it falls
        in (beyond the allowed lateness).
        """
        spec = self.spec
        agg, lateness = spec.aggregate, spec.lateness
        out: list[tuple] = []
        if spec.gap is not None:
            end = _num(ts + spec.gap)
            if end + lateness <= wm:
                return None
            start, acc, fired = ts, add(agg, new_acc(agg), value), 0
            keep = []
            for w in windows:
                if w[START] < end and start < w[END]:  # they overlap: one session
                    start, end = min(start, w[START]), max(end, w[END])
                    acc = merge(agg, acc, w[ACC])
                else:
                    keep.append(w)
            merged = [start, end, acc, fired]
            if end <= wm:
                merged[FIRED] = 1
                out.append((start, end, value_of(agg, acc)))
            keep.append(merged)
            windows[:] = keep
            return out
        size = spec.size
        assert size is not None and self.slide is not None
        hit = False
        for s in window_starts(ts, size, self.slide):
            e = _num(s + size)
            if e + lateness <= wm:
                continue
            hit = True
            w = next((w for w in windows if w[START] == s), None)
            if w is None:
                w = [s, e, new_acc(agg), 0]
                windows.append(w)
            w[ACC] = add(agg, w[ACC], value)
            # complete, or fired already: an update now (a window that moved here, or was
            # restored, may have fired under a higher watermark than this worker's yet)
            if e <= wm or w[FIRED]:
                w[FIRED] = 1
                out.append((s, e, value_of(agg, w[ACC])))
        return out if hit else None

    def fire(self, windows: list[list], wm: float) -> list[tuple]:
        """Windows the watermark ``wm`` completes (each once), oldest first; windows past
        their lateness leave ``windows``."""
        agg, lateness = self.spec.aggregate, self.spec.lateness
        out = []
        keep = []
        for w in sorted(windows, key=lambda w: (w[END], w[START])):
            if not w[FIRED] and w[END] <= wm:
                w[FIRED] = 1
                out.append((w[START], w[END], value_of(agg, w[ACC])))
            if w[END] + lateness > wm:
                keep.append(w)
        windows[:] = keep
        return out
