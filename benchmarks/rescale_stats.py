"""The ``rescale`` benchmark's arithmetic, pure so the unit tests hold it to hand-made data.

* :func:`second_stats`: per wall-clock second, the tuples that reached the
  sink and their latency quantiles; a second in which nothing arrived is kept
  with 0 tuples (a stall is the thing to see, not to skip);
* :func:`assess`: the issue's targets read off that series: no second during
  a migration below half the pre-scale rate, p99 during the migration at most
  twice the p99 before;
* :func:`migration_figures`: one migration's figures from every worker's
  migration log (``keyed.migrations`` in its metrics,
  ``typhoon/runtime/migration.py``): the pause of each key group moved, the
  bytes shipped, and the transfer rate from the first old owner beginning to
  pack to the last new owner having loaded.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from typhoon.topology.keygroups import update_of

Second = tuple[int, int, float | None, float | None]  # (second, tuples, p50 s, p99 s)
Window = tuple[float, float]  # wall-clock [start, end)


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of already sorted ``values`` (not empty)."""
    n = len(values)
    return values[min(n - 1, max(0, math.ceil(q * n) - 1))]


def second_stats(bins: Mapping[int, Iterable[float]]) -> list[Second]:
    """``(second, tuples, p50, p99)`` for every second from the first bin to the last."""
    if not bins:
        return []
    out: list[Second] = []
    for s in range(min(bins), max(bins) + 1):
        lat = sorted(bins.get(s, ()))
        if lat:
            out.append((s, len(lat), quantile(lat, 0.5), quantile(lat, 0.99)))
        else:
            out.append((s, 0, None, None))
    return out


def whole_seconds(series: Sequence[Second], w: Window) -> list[Second]:
    """The seconds lying wholly inside ``w``."""
    return [s for s in series if s[0] >= w[0] and s[0] + 1 <= w[1]]


def touching(series: Sequence[Second], w: Window) -> list[Second]:
    """The seconds that overlap ``w`` at all."""
    return [s for s in series if s[0] < w[1] and s[0] + 1 > w[0]]


@dataclass
class Assessment:
    """The targets of issue 27 item 7 for one run."""

    pre_rate: float | None = None  # tuples/s at the sink, mean over the pre-scale seconds
    min_rate: float | None = None  # the slowest second overlapping a migration
    p99_before: float | None = None  # s, median of the pre-scale seconds' p99
    p99_before_max: float | None = None  # s, the largest pre-scale second's p99 (the noise)
    p99_during: float | None = None  # s, the largest p99 of a second overlapping a migration
    below_half: int = 0  # seconds overlapping a migration below half the pre-scale rate

    @property
    def min_ratio(self) -> float | None:
        if self.min_rate is None or not self.pre_rate:
            return None
        return self.min_rate / self.pre_rate

    @property
    def p99_ratio(self) -> float | None:
        if self.p99_during is None or not self.p99_before:
            return None
        return self.p99_during / self.p99_before


def assess(series: Sequence[Second], pre: Window, during: Sequence[Window]) -> Assessment:
    """Rates and p99 before the first scale and in the seconds each migration touches."""
    a = Assessment()
    before = whole_seconds(series, pre)
    if before:
        a.pre_rate = statistics.fmean(s[1] for s in before)
        p99s = [s[3] for s in before if s[3] is not None]
        a.p99_before = statistics.median(p99s) if p99s else None
        a.p99_before_max = max(p99s) if p99s else None
    inside = {s[0]: s for w in during for s in touching(series, w)}
    if inside:
        a.min_rate = float(min(s[1] for s in inside.values()))
        p99s = [s[3] for s in inside.values() if s[3] is not None]
        a.p99_during = max(p99s) if p99s else None
        if a.pre_rate:
            a.below_half = sum(1 for s in inside.values() if s[1] < 0.5 * a.pre_rate)
    return a


@dataclass
class MigrationFigures:
    """One migration, from the logs of every worker that took part."""

    id: int  # the update's migration ID (its last round's, the table version)
    rounds: int = 0  # migrations it took (a stepwise one: one per round)
    groups: int = 0  # key groups moved
    keys: int = 0  # keys moved
    bytes: int = 0  # serialized state shipped
    ship_ms: float = 0.0  # the slowest old owner's packing and writing (of one round)
    pauses_ms: list[float] = field(default_factory=list)  # per group moved in
    waits_ms: list[float] = field(default_factory=list)  # per new owner: prepare -> loaded
    transfer_s: float | None = None  # first pack began -> last new owner loaded

    @property
    def mb_s(self) -> float | None:
        if not self.transfer_s or self.transfer_s <= 0:
            return None
        return self.bytes / 1e6 / self.transfer_s

    @property
    def pause_median_ms(self) -> float | None:
        return statistics.median(self.pauses_ms) if self.pauses_ms else None

    @property
    def pause_max_ms(self) -> float | None:
        return max(self.pauses_ms) if self.pauses_ms else None


def migration_figures(logs: Iterable[Mapping[str, Mapping[str, Any]]]) -> list[MigrationFigures]:
    """Per update (ascending): each worker's log is its ``keyed.migrations``; the rounds of a
    stepwise migration (``typhoon.reconfig.steps``) count as one update."""
    found: dict[int, MigrationFigures] = {}
    starts: dict[int, list[float]] = {}
    loads: dict[int, list[float]] = {}
    rounds: dict[int, set[int]] = {}
    for log in logs:
        for mid, m in log.items():
            u = update_of(int(mid))
            rounds.setdefault(u, set()).add(int(mid))
            f = found.setdefault(u, MigrationFigures(u))
            if m.get("out") or m.get("keys_out"):
                f.groups += int(m.get("out", 0))
                f.keys += int(m.get("keys", 0))
                f.bytes += sum(int(n) for n in m.get("shipped", {}).values())
                f.ship_ms = max(f.ship_ms, float(m.get("ship_ms", 0.0)))
                if m.get("ship_started"):
                    starts.setdefault(u, []).append(float(m["ship_started"]))
            f.pauses_ms += [float(p) for p in m.get("group_pause_ms", {}).values()]
            loaded = m.get("loaded", {}).values()
            loads.setdefault(u, []).extend(float(t["at"]) for t in loaded)
            f.waits_ms += [float(t["window_ms"]) for t in loaded if "window_ms" in t]
    for u, f in found.items():
        f.rounds = len(rounds[u])
        if starts.get(u) and loads.get(u):
            f.transfer_s = max(loads[u]) - min(starts[u])
    return [found[u] for u in sorted(found)]
