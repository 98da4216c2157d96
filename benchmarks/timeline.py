"""Throughput over time, for the figures whose x axis is time (paper Fig. 10, Fig. 11).

A run report gives one number per run; a fault or a scale-up needs the rate
around the moment it happens.  Two sources of counts exist: the workers'
cumulative counters (METRIC_RESP, sampled a few times a second by whoever
polls the coordinator) and a sequence checker's arrival timeline (tuples per
tick).  Both are turned into rates per fixed bin here; the dip and the
before/after statistics are read off those bins.  Everything is pure, so the
unit tests hold it against hand-computed series.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

Sample = tuple[float, float]  # (wall time, cumulative count)


@dataclass
class CounterLog:
    """Cumulative counters per key (a worker), as polled: only new samples are kept."""

    samples: dict[Hashable, list[Sample]] = field(default_factory=dict)

    def add(self, key: Hashable, at: float, value: float) -> None:
        """Record ``value`` at ``at``; a repeated or older sample (same METRIC_RESP) is skipped."""
        seq = self.samples.setdefault(key, [])
        if seq and at <= seq[-1][0]:
            return
        seq.append((at, value))

    def value_at(self, key: Hashable, t: float) -> float:
        """The counter at ``t``: linear between samples, 0 before the first, last after."""
        seq = self.samples.get(key, [])
        if not seq:
            return 0.0
        i = bisect_right([s[0] for s in seq], t)
        if i == 0:
            # before its first report: a worker that starts later (a replacement)
            # counted nothing yet; one already running is only asked for bins after it
            return 0.0
        if i == len(seq):
            return seq[-1][1]
        (t0, v0), (t1, v1) = seq[i - 1], seq[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def last_time(self, keys: Sequence[Hashable]) -> float:
        """The earliest of these keys' latest samples: bins up to it are fully known."""
        return min(self.samples[k][-1][0] for k in keys if self.samples.get(k))

    def first_time(self, keys: Sequence[Hashable]) -> float:
        """The latest of these keys' first samples."""
        return max(self.samples[k][0][0] for k in keys if self.samples.get(k))

    def rates(self, start: float, end: float, bin_s: float) -> list[Sample]:
        """(bin start, summed rate over every key) for each whole bin in [start, end)."""
        n = int((end - start) / bin_s + 1e-9)
        out = []
        for b in range(n):
            t0, t1 = start + b * bin_s, start + (b + 1) * bin_s
            got = sum(self.value_at(k, t1) - self.value_at(k, t0) for k in self.samples)
            out.append((t0, got / bin_s))
        return out


def tick_rates(
    timeline: Mapping[str, int], tick_s: float, start: float, end: float, bin_s: float
) -> list[Sample]:
    """(bin start, tuples/s) from a sequence checker's timeline (``int(t / tick_s)`` -> count).

    Ticks without an entry counted nothing; bins are whole numbers of ticks.
    """
    per_bin = max(1, round(bin_s / tick_s))
    first = math.floor(start / tick_s + 1e-9)
    n = int((end - start) / (per_bin * tick_s) + 1e-9)
    counts = {int(k): v for k, v in timeline.items()}
    out = []
    for b in range(n):
        k0 = first + b * per_bin
        got = sum(counts.get(k, 0) for k in range(k0, k0 + per_bin))
        out.append((k0 * tick_s, got / (per_bin * tick_s)))
    return out


def mean_rate(series: Sequence[Sample], start: float, end: float) -> float | None:
    """Mean of the bins that start in [start, end)."""
    vs = [r for t, r in series if start <= t < end]
    return sum(vs) / len(vs) if vs else None


def cv(series: Sequence[Sample], start: float, end: float) -> float | None:
    """Coefficient of variation (stdev / mean) of the bins that start in [start, end)."""
    vs = [r for t, r in series if start <= t < end]
    if len(vs) < 2 or not sum(vs):
        return None
    return statistics.pstdev(vs) / statistics.fmean(vs)


@dataclass
class Dip:
    """How much throughput a disturbance at ``at`` cost, against the rate before it."""

    baseline: float  # tuples/s before
    below_s: float  # seconds of bins after ``at`` under ``threshold`` x baseline
    deficit: float  # tuples short of the baseline over the window after ``at``
    recovered_s: float | None  # from ``at`` to the end of the last bin below the threshold


def dip(
    series: Sequence[Sample], at: float, baseline: float, bin_s: float, threshold: float = 0.8
) -> Dip:
    """The dip after ``at`` in ``series`` (bins of ``bin_s``), up to the series' end.

    ``deficit`` counts what was not processed at the baseline rate, whether lost
    or only late; a late tuple that is caught up on later shows as a bin above
    the baseline and is netted out.
    """
    after = [(t, r) for t, r in series if t >= at]
    low = [t for t, r in after if r < threshold * baseline]
    deficit = sum((baseline - r) * bin_s for _, r in after)
    recovered = (low[-1] + bin_s - at) if low else None
    return Dip(baseline, len(low) * bin_s, max(0.0, deficit), recovered)


# ----- a run in phases (the live-debug benchmark: before and while attached) -----------------


def phase_median(series: list[tuple[float, float]], start: float, end: float) -> float | None:
    """Median rate of the one-second bins lying wholly within [start, end]."""
    rates = [r for t, r in series if t >= start - 1e-9 and t + 1.0 <= end + 1e-9]
    rates = [r for r in rates if r is not None and not math.isnan(r)]
    return statistics.median(rates) if rates else None


def cpu_ms_per_1000(marks: list[list[float]], start: float, end: float) -> float | None:
    """CPU ms per 1000 tuples between the first mark at/after ``start`` and the last
    at/before ``end`` (marks: ``[wall, emitted, copies, cpu s]``)."""
    inside = [m for m in marks if start <= m[0] <= end]
    if len(inside) < 2 or inside[-1][1] <= inside[0][1]:
        return None
    return 1e6 * (inside[-1][3] - inside[0][3]) / (inside[-1][1] - inside[0][1])


def serializations_per_tuple(
    polled: list[tuple[float, int, int]], start: float, end: float
) -> float | None:
    """Framework serializations per tuple emitted between two polls of its counters
    (``(time, serializations, tuples out)``) inside [start, end]."""
    inside = [p for p in polled if start <= p[0] <= end]
    if len(inside) < 2 or inside[-1][2] <= inside[0][2]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2])
