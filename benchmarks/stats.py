"""The numbers a scenario reports: medians over runs, ratios, and how tables print them.

A failed run gives None, which every function here skips (a median of what
exists) or prints as '–'; ``paired_ratio`` is how a scenario compares sdn with
tcp (``benchmarks/scenario.py`` explains the rounds it pairs).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.testbed import RunResult


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that exist (failed runs give None)."""
    vs = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(vs) if vs else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def paired_ratio(
    a_runs: Sequence[RunResult],
    b_runs: Sequence[RunResult],
    metric: Callable[[RunResult], float | None],
) -> float | None:
    """Median over rounds of ``metric(a) / metric(b)`` for the two runs of each round.

    The two runs of a round ran back to back (:meth:`Bench.interleaved`), so their
    ratio cancels most of the machine's slow swings, which a ratio of medians
    taken over different moments does not.
    """
    return median(ratio(metric(a), metric(b)) for a, b in zip(a_runs, b_runs, strict=False))


def geomean(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, vs)) / len(vs)) if vs else None


def fmt_rate(v: float | None) -> str:
    """Tuples/s with thousands separators; '–' for no value."""
    return "–" if v is None else f"{v:,.0f}"


def fmt_ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def fmt_num(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def fmt_count(values: Iterable[int | None]) -> str:
    """Sum of per-run counts (lost, duplicates); '?' if any run could not tell."""
    vs = list(values)
    if any(v is None for v in vs):
        known = sum(v for v in vs if v is not None)
        return f"{known}?"
    return str(sum(v for v in vs if v is not None))
