"""Arrival counts per clock tick, and the steady rate they give, for any stream system.

The ``peers`` scenario compares systems whose reports share nothing, so the
rate is measured the same way inside each: where the tuples are counted (the
keyed count step), every few arrivals add their number to the tick of the
wall clock they arrived in.  A run's workers' ticks add up; the steady rate is
the rate between the moments a ``lo`` and a ``hi`` fraction of all arrivals
had arrived, so start-up (processes, connections, the first frames) and the
tail (the last worker draining) stay outside the window, the same for all.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

TICK_S = 0.01  # 10 ms: a window of a second has a hundred ticks


@dataclass
class Arrivals:
    """Tuples per tick of ``time.time()``: ``int(t / tick_s)`` -> tuples."""

    tick_s: float = TICK_S
    bins: dict[int, int] = field(default_factory=dict)

    def add(self, n: int, now: float | None = None) -> None:
        """``n`` tuples arrived now (or at ``now``)."""
        tick = int((time.time() if now is None else now) / self.tick_s)
        bins = self.bins
        bins[tick] = bins.get(tick, 0) + n

    @property
    def total(self) -> int:
        return sum(self.bins.values())

    def to_dict(self) -> dict[str, object]:
        """JSON form (keys become strings), as worker reports carry it."""
        return {"tick_s": self.tick_s, "bins": {str(k): v for k, v in sorted(self.bins.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Arrivals:
        bins = d.get("bins") or {}
        tick_s = d.get("tick_s", TICK_S)
        if not isinstance(bins, Mapping) or not isinstance(tick_s, (int, float)) or tick_s <= 0:
            raise ValueError(f"not an arrivals record: {dict(d)!r}")
        return cls(float(tick_s), {int(k): int(v) for k, v in bins.items()})

    @classmethod
    def merged(cls, parts: Iterable[Arrivals]) -> Arrivals:
        """The arrivals of several workers together (they must share a tick)."""
        out: Arrivals | None = None
        for p in parts:
            if out is None:
                out = cls(p.tick_s)
            elif p.tick_s != out.tick_s:
                raise ValueError(f"ticks differ: {p.tick_s} and {out.tick_s}")
            for k, v in p.bins.items():
                out.bins[k] = out.bins.get(k, 0) + v
        return out if out is not None else cls()


def crossing_time(a: Arrivals, target: float) -> float | None:
    """When the ``target``-th arrival happened (seconds since the epoch), assuming the
    arrivals of a tick were spread evenly over it; None if there were fewer."""
    seen = 0
    for tick in sorted(a.bins):
        n = a.bins[tick]
        if n > 0 and seen + n >= target:
            return (tick + max(0.0, target - seen) / n) * a.tick_s
        seen += n
    return None


def steady_rate(a: Arrivals, lo: float = 0.1, hi: float = 0.9) -> float | None:
    """Tuples/s between the ``lo`` and ``hi`` fractions of all arrivals; None when the
    window is empty or shorter than two ticks (too short to be a rate)."""
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError("need 0 <= lo < hi <= 1")
    total = a.total
    t0, t1 = crossing_time(a, lo * total), crossing_time(a, hi * total)
    if not total or t0 is None or t1 is None or t1 - t0 < 2 * a.tick_s:
        return None
    return (hi - lo) * total / (t1 - t0)


def span_rate(a: Arrivals) -> float | None:
    """Tuples/s from the first tick to the end of the last (every arrival, start-up excluded)."""
    if not a.bins:
        return None
    span = (max(a.bins) + 1 - min(a.bins)) * a.tick_s
    return a.total / span
