"""Autoscaler decisions (paper §4 "Auto scaler", §6.2 Fig. 11), free of Ryu and switches.

The app (``apps/autoscaler.py``) feeds samples in and executes what comes out;
everything that decides lives here so it can be unit-tested with synthetic
metric streams and a fake clock:

* ``WorkerLoad`` turns a worker's cumulative METRIC_RESP counters into the
  load of the last interval: queue depth, processing time per tuple, and the
  fraction of the interval the worker spent processing (``busy``).  The
  worker reports ``proc_us`` averaged since it started, which would hide an
  overload that begins late in a long run, so the windowed values are derived
  from the change of ``proc_us × tuples in``.  ``busy`` is the signal that
  works with credit-based flow control: an overloaded receiver does not queue
  (its senders stall, the backlog stays upstream), it just never idles.
* ``spark_signal`` reads a Spark StreamingQueryListener progress event: a
  query falls behind when it processes fewer rows per second than arrive, or
  when a batch takes longer than the trigger interval; ``spark_window_signal``
  asks the same of the last few events, so that the node must *stay* behind.
* ``NodeScaler`` keeps the hysteresis of one node: a condition must hold
  without a break for a whole window before anything happens (``up_window``
  for overload, the longer ``down_window`` for idleness, so a short lull does
  not undo a scale-up), then it picks the new parallelism within
  ``[min, max]`` and at most ``max_step`` away, and waits ``cooldown`` before
  the next decision, because the metrics of a node that is being reconfigured
  describe neither its old nor its new shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from controller.settings import setting


@dataclass(frozen=True)
class ScaleSettings:
    """Thresholds and limits: the ``[autoscaler]`` section (``controller/settings.py``)."""

    section: ClassVar[str] = "autoscaler"

    queue_high: float = setting(
        2000.0, "mean queued tuples per worker above which a node is overloaded"
    )
    queue_low: float = setting(50.0, "mean queued tuples per worker below which a node is idle")
    proc_high_us: float = setting(
        0.0, "mean µs per tuple above which a node is overloaded (0: off)"
    )
    proc_low_us: float = setting(
        0.0, "mean µs per tuple a node must also be below to be idle (0: off)"
    )
    busy_high: float = setting(
        0.9, "mean fraction of time processing above which a node is overloaded (0: off)"
    )
    busy_low: float = setting(
        0.3, "mean fraction of time processing a node must also be below to be idle (0: off)"
    )
    up_window_s: float = setting(
        3.0, "seconds overload must hold before a scale-up", name="up_window"
    )
    down_window_s: float = setting(
        10.0, "seconds idleness must hold before a scale-down", name="down_window"
    )
    cooldown_s: float = setting(
        10.0, "seconds after a decision or an update before windows start again", name="cooldown"
    )
    min_parallelism: int = setting(1, "fewest workers of a managed node")
    max_parallelism: int = setting(8, "most workers of a managed node")
    max_step: int = setting(1, "most workers added or removed at once")
    recommend_only: bool = setting(False, "log decisions, do not scale")
    stale_s: float = 5.0  # worker samples older than this are ignored
    spark_lag: float = setting(0.9, "spark node behind: processed < spark_lag × input rows/s")
    spark_idle: float = setting(0.3, "spark node idle: batch time < spark_idle × trigger interval")
    spark_window: int = setting(3, "progress events a spark signal rests on (it must stay behind)")
    spark_warmup: int = setting(2, "first batches of a spark query not judged (cold JVM)")
    nodes: tuple[str, ...] = setting(
        (), "comma-separated nodes to manage (empty: every bolt)", shown="(all bolts)"
    )


@dataclass
class WorkerSample:
    """One worker's load over its last metrics interval."""

    queue: float
    proc_us: float
    at: float
    busy: float = 0.0  # fraction of the interval spent processing


@dataclass
class WorkerLoad:
    """Windowed load of one worker from its cumulative counters."""

    last_total_in: int = -1
    last_proc_total_us: float = 0.0
    last_time: float = 0.0
    sample: WorkerSample | None = None

    def update(self, metrics: dict[str, Any], at: float) -> WorkerSample:
        # stream "0" is control traffic, not work
        total_in = sum(v for k, v in (metrics.get("in") or {}).items() if k != "0")
        avg_us = float(metrics.get("proc_us") or 0.0)
        proc_total = avg_us * total_in
        t = metrics.get("time")
        t = float(t) if isinstance(t, (int, float)) else at  # the worker's clock if it says
        proc_us, busy = avg_us, 0.0
        if self.last_total_in >= 0 and total_in > self.last_total_in:
            proc_us = (proc_total - self.last_proc_total_us) / (total_in - self.last_total_in)
        elif self.sample is not None and total_in == self.last_total_in:
            proc_us = self.sample.proc_us  # nothing processed in between: keep the estimate
        if self.last_total_in >= 0 and t > self.last_time:
            busy = (proc_total - self.last_proc_total_us) / ((t - self.last_time) * 1e6)
        self.last_total_in, self.last_proc_total_us, self.last_time = total_in, proc_total, t
        queue = float(metrics.get("queue") or 0)
        self.sample = WorkerSample(queue, max(0.0, proc_us), at, min(1.0, max(0.0, busy)))
        return self.sample


@dataclass(frozen=True)
class Signal:
    """A node's state at one moment: overloaded, idle or neither, and why."""

    over: bool
    under: bool
    reason: str
    load: float = 1.0  # how far past the threshold (queue / queue_high, …), sizes the step


def worker_signal(samples: list[WorkerSample], s: ScaleSettings) -> Signal | None:
    """Mean queue depth, processing time and busy fraction of a node's workers."""
    if not samples:
        return None
    queue = sum(x.queue for x in samples) / len(samples)
    proc = sum(x.proc_us for x in samples) / len(samples)
    busy = sum(x.busy for x in samples) / len(samples)
    what = f"mean queue {queue:.0f} tuples, processing {proc:.1f} us/tuple, busy {busy:.2f}"
    loads = [queue / s.queue_high if s.queue_high > 0 else 0.0]
    if s.proc_high_us > 0:
        loads.append(proc / s.proc_high_us)
    if s.busy_high > 0:
        # a worker busy all the time hides how much more it was offered: assume one more
        loads.append((len(samples) + 1) / len(samples) if busy >= 0.99 else busy / s.busy_high)
    if s.queue_high > 0 and queue > s.queue_high:
        return Signal(True, False, f"{what} > queue_high {s.queue_high:g}", max(loads))
    if s.proc_high_us > 0 and proc > s.proc_high_us:
        return Signal(True, False, f"{what} > proc_high_us {s.proc_high_us:g}", max(loads))
    if s.busy_high > 0 and busy > s.busy_high:
        return Signal(True, False, f"{what} > busy_high {s.busy_high:g}", max(loads))
    idle = (
        queue < s.queue_low
        and (s.proc_low_us <= 0 or proc < s.proc_low_us)
        and (s.busy_low <= 0 or busy < s.busy_low)
    )
    if idle:
        return Signal(False, True, f"{what} < queue_low {s.queue_low:g}, busy_low {s.busy_low:g}")
    return Signal(False, False, what)


def spark_signal(progress: dict[str, Any], trigger_ms: float, s: ScaleSettings) -> Signal | None:
    """A spark node from one progress event: behind, idle, or neither.

    ``trigger_ms`` is the node's configured trigger interval (its args), not the
    progress event's ``trigger_ms``, which is how long the last trigger took.
    """
    inp = _first(progress, "input_rows_per_s", "inputRowsPerSecond")
    done = _first(progress, "processed_rows_per_s", "processedRowsPerSecond")
    dur = _first(progress, "batch_ms", "batchDuration")
    if inp is None and done is None and dur is None:
        return None
    inp, done = float(inp or 0.0), float(done or 0.0)
    what = f"input {inp:.0f} rows/s, processed {done:.0f} rows/s, batch {dur or 0:.0f} ms"
    if inp > 0 and done < s.spark_lag * inp:
        load = inp / done if done > 0 else 2.0
        return Signal(True, False, f"{what}: processed < {s.spark_lag:g} x input", load)
    if trigger_ms > 0 and dur is not None and dur > trigger_ms:
        return Signal(True, False, f"{what}: batch > trigger {trigger_ms:g} ms", dur / trigger_ms)
    if trigger_ms > 0 and dur is not None and dur < s.spark_idle * trigger_ms and done >= inp:
        return Signal(False, True, f"{what}: batch < {s.spark_idle:g} x trigger {trigger_ms:g}")
    return Signal(False, False, what)


def spark_window_signal(
    events: list[dict[str, Any]], trigger_ms: float, s: ScaleSettings
) -> Signal | None:
    """A spark node over its last ``spark_window`` progress events (None until there are).

    One micro-batch says little on a loaded machine (a batch can stall for
    seconds), so the node is behind only if it *stays* behind: the rows of
    the window were processed slower than they arrived (rows over the summed
    batch durations versus rows over the summed intervals they arrived in),
    or every batch of the window took longer than the trigger interval.  Idle
    needs every batch short.  Events of a query's first ``spark_warmup``
    batches are the caller's to leave out.
    """
    n = max(1, s.spark_window)
    window = [e for e in events if _first(e, "batch_ms", "batchDuration") is not None][-n:]
    if len(window) < n:
        return None
    counts = [float(_first(e, "input_rows", "numInputRows") or 0) for e in window]
    rates = [float(_first(e, "input_rows_per_s", "inputRowsPerSecond") or 0) for e in window]
    durations = [float(_first(e, "batch_ms", "batchDuration")) for e in window]
    rows = sum(counts)
    arrived_s = sum(k / r for k, r in zip(counts, rates, strict=True) if k and r)
    inp = rows / arrived_s if arrived_s > 0 else 0.0
    done = rows / (sum(durations) / 1000.0) if sum(durations) > 0 else 0.0
    what = (f"last {n} batches: input {inp:.0f} rows/s, processed {done:.0f} rows/s, "
            f"batches {min(durations):.0f}-{max(durations):.0f} ms")  # fmt: skip
    if inp > 0 and done < s.spark_lag * inp:
        load = inp / done if done > 0 else 2.0
        return Signal(True, False, f"{what}: processed < {s.spark_lag:g} x input", load)
    if trigger_ms > 0 and min(durations) > trigger_ms:
        load = sum(durations) / n / trigger_ms
        return Signal(True, False, f"{what}: every batch > trigger {trigger_ms:g} ms", load)
    if trigger_ms > 0 and max(durations) < s.spark_idle * trigger_ms and done >= inp:
        return Signal(False, True, f"{what}: every batch < {s.spark_idle:g} x trigger")
    return Signal(False, False, what)


def _first(d: dict[str, Any], *keys: str) -> Any:
    """The bridge's compact progress names first, Spark's own (raw progress JSON) second."""
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return None


@dataclass(frozen=True)
class Decision:
    """What ``NodeScaler.decide`` concluded; ``target`` None means keep the parallelism."""

    node: str
    current: int
    target: int | None
    reason: str
    recommend_only: bool = False

    @property
    def action(self) -> str:
        if self.target is None:
            return "keep"
        verb = "up" if self.target > self.current else "down"
        return f"recommend scale {verb}" if self.recommend_only else f"scale {verb}"


@dataclass
class NodeScaler:
    """Hysteresis, limits and cooldown of one node (see the module docstring)."""

    node: str
    settings: ScaleSettings
    # False for spark nodes (the planner refuses to shrink them): an idle window then
    # ends in a logged "keep" that says why, never in a scale-down request
    can_shrink: bool = True
    over_since: float | None = None
    under_since: float | None = None
    last: Signal | None = None
    cooldown_until: float = 0.0
    history: list[Decision] = field(default_factory=list)

    def observe(self, sig: Signal | None, now: float) -> None:
        """One evaluation of the node; a break in a condition restarts its window.

        Windows only start after the cooldown, so every decision rests on a
        full window of the node's current shape.
        """
        self.last = sig
        if sig is None or now < self.cooldown_until:
            # what a node shows while it is being reshaped says nothing about its new shape
            self.over_since = self.under_since = None
            return
        if not sig.over:
            self.over_since = None
        elif self.over_since is None:
            self.over_since = now
        if not sig.under:
            self.under_since = None
        elif self.under_since is None:
            self.under_since = now

    def reset(self, now: float) -> None:
        """The node changed shape (ours or someone else's update): start over, cool down."""
        self.over_since = self.under_since = None
        self.cooldown_until = max(self.cooldown_until, now + self.settings.cooldown_s)

    def decide(self, current: int, now: float) -> Decision | None:
        """A scale decision once a window is complete; None while nothing is due.

        Returns a ``keep`` decision (target None) when a window completed but a
        limit forbids acting, so the log says why nothing happened.
        """
        s, sig = self.settings, self.last
        if sig is None or now < self.cooldown_until:
            return None
        if self.over_since is not None and now - self.over_since >= s.up_window_s:
            held = now - self.over_since
            if current >= s.max_parallelism:
                d = Decision(self.node, current, None,
                             f"{sig.reason} for {held:.1f} s, but at max_parallelism "
                             f"{s.max_parallelism}")  # fmt: skip
            else:
                want = max(current + 1, math.ceil(current * sig.load))
                target = min(s.max_parallelism, want, current + s.max_step)
                d = Decision(self.node, current, target,
                             f"{sig.reason} for {held:.1f} s (up_window {s.up_window_s:g} s)",
                             s.recommend_only)  # fmt: skip
            return self._done(d, now)
        if self.under_since is not None and now - self.under_since >= s.down_window_s:
            held = now - self.under_since
            if current <= s.min_parallelism or not self.can_shrink:
                self.under_since = None  # nothing to do; say so once per window, not per tick
                why = (f"at min_parallelism {s.min_parallelism}" if self.can_shrink else
                       "a spark node only scales up (its workers' offset logs and outbox "
                       "belong to the running query)")  # fmt: skip
                return Decision(self.node, current, None,
                                f"{sig.reason} for {held:.1f} s, but {why}")  # fmt: skip
            target = max(s.min_parallelism, current - s.max_step)
            d = Decision(self.node, current, target,
                         f"{sig.reason} for {held:.1f} s (down_window {s.down_window_s:g} s)",
                         s.recommend_only)  # fmt: skip
            return self._done(d, now)
        return None

    def _done(self, d: Decision, now: float) -> Decision:
        self.history.append(d)
        del self.history[:-20]
        self.over_since = self.under_since = None
        # a refusal at a limit waits a window again; an action (or advice) cools down
        if d.target is not None:
            self.cooldown_until = now + self.settings.cooldown_s
        return d
