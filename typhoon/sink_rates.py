"""How fast a failure's sinks are back: time from detection to 80% of their rate before.

An incident (``controller/recovery/fault_detector.py`` on sdn, ``typhoon/tcp_recovery.py`` on
tcp) says how long its recovery cost the results, not only how long its steps took.
The rule, pure so it is unit-tested and both transports and the benchmarks apply
the same one:

* the **sinks** of an incident are the workers of every node without outputs that
  the failed worker's node reaches (itself included), replacements included;
* each sink worker's **progress** is its data tuples in (``METRIC_RESP`` ``in``,
  stream 0 is control), as a cumulative count over the arrival times of its
  replies (at the controller, or the tcp coordinator), linear between two replies
  and flat outside them; only what goes past the highest count reported so far
  adds (a counter that went down, as a restore or a new process does, counts
  again only beyond where it had been), so progress never goes back; a worker's
  first reply is its starting point;
* the **rate** over a window is the sinks' summed progress in it over its length;
  windows are ``WINDOW_S`` (1 s) long;
* the **baseline** is the median rate of the ``BASELINE_WINDOWS`` whole windows
  that end at the detection (only those the sinks reported throughout);
* **back at 80%** is the start of the first window, sliding by ``STEP_S`` from the
  detection on, whose rate is at least ``FRACTION`` of the baseline: from then on
  the sinks did a whole second at 80% or more.  Measured from the detection (the
  port event follows the kill by milliseconds; a heartbeat detection comes
  ``heartbeat_timeout`` late, and the baseline windows then include the silence).
  A sink that never dipped is back at 0.

A window is judged only once every sink worker still reporting has replied past its
end, so a late reply cannot turn a judged window into a different one (a worker
silent for over ``STALE_S`` stops holding the judgement back, and what it reports
after its silence counts from its next reply).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

WINDOW_S = 1.0
STEP_S = 0.1
BASELINE_WINDOWS = 5
FRACTION = 0.8
KEEP_S = 120.0  # progress kept per worker: covers the baseline and a long recovery
STALE_S = 2.0  # a worker not heard this long behind the newest reply no longer holds back


@dataclass
class Progress:
    """One sink worker's cumulative tuples in, by arrival time (never decreasing)."""

    samples: deque[tuple[float, float]] = field(default_factory=deque)
    raw: int | None = None  # its last reported counter
    top: int | None = None  # the highest it reported: only what goes past it counts
    total: float = 0.0

    def add(self, at: float, counter: int) -> None:
        if self.samples and at < self.samples[-1][0]:
            return  # out of order: the clock is monotonic, so never in practice
        if self.samples and at - self.samples[-1][0] > STALE_S:
            # silent so long that windows were judged without it: what it reports now
            # counts from now, not spread over the silence
            self.samples.append((at, self.total))
        if self.top is not None and counter > self.top:
            self.total += counter - self.top
        self.raw = counter
        self.top = counter if self.top is None else max(self.top, counter)
        self.samples.append((at, self.total))
        while self.samples and self.samples[0][0] < at - KEEP_S:
            self.samples.popleft()

    def at(self, t: float) -> float:
        """Progress at ``t``: linear between replies, flat before the first and after the
        last."""
        s = self.samples
        if not s or t <= s[0][0]:
            return s[0][1] if s else 0.0
        if t >= s[-1][0]:
            return s[-1][1]
        lo, hi = 0, len(s) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if s[mid][0] <= t:
                lo = mid
            else:
                hi = mid
        (t0, v0), (t1, v1) = s[lo], s[hi]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1

    @property
    def first(self) -> float | None:
        return self.samples[0][0] if self.samples else None

    @property
    def last(self) -> float | None:
        return self.samples[-1][0] if self.samples else None


def data_in(metrics: Mapping[str, Any]) -> int | None:
    """A METRIC_RESP's data tuples in (None: it says nothing countable)."""
    counts = metrics.get("in")
    if not isinstance(counts, dict):
        return None
    return sum(v for k, v in counts.items() if k != "0" and type(v) is int)


def window_rate(logs: Iterable[Progress], start: float, end: float) -> float:
    """The summed rate of ``logs`` over ``[start, end)`` (tuples/s)."""
    return sum(p.at(end) - p.at(start) for p in logs) / (end - start)


def horizon(logs: Iterable[Progress]) -> float | None:
    """The time up to which every worker still reporting has replied (None: no reply)."""
    lasts = [p.last for p in logs if p.last is not None]
    if not lasts:
        return None
    newest = max(lasts)
    return min(t for t in lasts if t >= newest - STALE_S)


def baseline(logs: list[Progress], detected: float) -> float | None:
    """Median rate of the whole windows before ``detected`` the sinks reported in (None:
    no such window, or nothing flowed)."""
    firsts = [p.first for p in logs if p.first is not None]
    if not firsts:
        return None
    start = min(firsts)
    rates = []
    for k in range(BASELINE_WINDOWS):
        lo = detected - (k + 1) * WINDOW_S
        if lo < start:
            break
        rates.append(window_rate(logs, lo, lo + WINDOW_S))
    if not rates or statistics.median(rates) <= 0:
        return None
    return statistics.median(rates)


@dataclass(frozen=True)
class Back:
    """What :func:`back_at` found: ``after_s`` None while the sinks are not back yet."""

    before: float  # baseline tuples/s
    lowest: float  # lowest window rate judged since the detection
    after_s: float | None  # seconds from the detection to the start of the first window >= 80%
    judged: int = 0  # windows judged so far


def back_at(
    logs: list[Progress],
    detected: float,
    until: float | None = None,
    since: Back | None = None,
) -> Back | None:
    """The sinks' recovery after a failure detected at ``detected``, judged on the windows
    that end by ``until`` (default: :func:`horizon`); None without a baseline.

    ``since``: an earlier answer for the same sinks not back yet; the windows it judged
    are not judged again (a judged window cannot change: see the module's docstring)."""
    before = baseline(logs, detected) if since is None else since.before
    if before is None:
        return None
    end = horizon(logs) if until is None else until
    lowest = None if since is None or since.judged == 0 else since.lowest
    k = 0 if since is None else since.judged
    while end is not None:
        lo = detected + k * STEP_S
        if lo + WINDOW_S > end + 1e-9:
            break
        rate = window_rate(logs, lo, lo + WINDOW_S)
        lowest = rate if lowest is None else min(lowest, rate)
        if rate >= FRACTION * before:
            return Back(before, lowest, round(k * STEP_S, 3), k + 1)
        k += 1
    return Back(before, before if lowest is None else lowest, None, k)


def lowest_ratio(logs: list[Progress], start: float, end: float, before: float) -> float | None:
    """The lowest rate of the whole windows in ``[start, end]`` (sliding by ``STEP_S``)
    relative to ``before`` (None: no whole window, or no rate before)."""
    if before <= 0:
        return None
    rates = []
    lo = start
    while lo + WINDOW_S <= end + 1e-9:
        rates.append(window_rate(logs, lo, lo + WINDOW_S))
        lo += STEP_S
    return min(rates) / before if rates else None


def downstream_sinks(topology: Any, node: str) -> set[str]:
    """The nodes without outputs that ``node`` reaches (itself if it has none)."""
    seen, todo = {node}, [node]
    while todo:
        for s in topology.outputs_of(todo.pop()):
            if s.dst not in seen:
                seen.add(s.dst)
                todo.append(s.dst)
    return {n for n in seen if not topology.outputs_of(n)}


@dataclass
class SinkWatch:
    """The sink workers' progress of every application, and each incident's recovery
    judged from it (the fault machine feeds it every METRIC_RESP and asks on its slow
    timer)."""

    logs: dict[str, dict[int, Progress]] = field(default_factory=dict)  # app -> wid -> ...
    nodes: dict[str, dict[int, str]] = field(default_factory=dict)  # app -> wid -> node
    give_up_s: float = 60.0  # an incident's sinks not back by then: left unknown
    pending: dict[tuple[str, float], Back] = field(default_factory=dict)  # not back yet

    def note(self, app: str, wid: int, node: str, metrics: Mapping[str, Any], at: float) -> None:
        """A sink worker's METRIC_RESP (the caller passes sinks only)."""
        n = data_in(metrics)
        if n is None:
            return
        self.nodes.setdefault(app, {})[wid] = node
        self.logs.setdefault(app, {}).setdefault(wid, Progress()).add(at, n)

    def relaunched(self, app: str, wid: int) -> None:
        """``wid`` runs again as a new process under the same ID (tcp relaunches a dead
        worker so): what it took in so far stays, as a worker that no longer reports
        (sdn's dead worker), and the new process's first reply is its starting point
        (sdn's replacement, which has an ID of its own).  Without this the new process's
        counter, started over, would count only past the dead one's."""
        logs, nodes = self.logs.get(app, {}), self.nodes.get(app, {})
        if wid in logs:
            old = min(0, *logs) - 1  # a key no worker has
            logs[old], nodes[old] = logs.pop(wid), nodes.pop(wid)

    def forget(self, apps: Iterable[str]) -> None:
        """Drop every application not in ``apps``."""
        keep = set(apps)
        for app in [a for a in self.logs if a not in keep]:
            del self.logs[app]
            self.nodes.pop(app, None)
        for key in [k for k in self.pending if k[0] not in keep]:
            del self.pending[key]

    def judge(self, app: str, sinks: set[str], detected: float, now: float) -> Back | None:
        """The recovery of ``sinks`` (node names) of ``app`` after ``detected``; None while
        it cannot be said (no baseline, or a sink has not replied since ``detected``: the
        baseline's windows are judged only once replied past, as every window is)."""
        nodes = self.nodes.get(app, {})
        logs = [p for w, p in self.logs.get(app, {}).items() if nodes.get(w) in sinks]
        seen = horizon(logs)
        if seen is None or seen < detected:
            return None  # the baseline's last window is not replied past yet
        key = (app, detected)
        back = back_at(logs, detected, since=self.pending.get(key))
        if back is not None and back.after_s is None:
            self.pending[key] = back
        else:
            self.pending.pop(key, None)
        return back
