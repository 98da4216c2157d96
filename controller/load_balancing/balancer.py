"""Weights of a load-balanced node, from worker metrics and switch counters (docs/design.md §6).

The load-balancer app (``apps/load_balancer.py``) feeds one :class:`NodeBalancer`
per balanced node with what it hears -- METRIC_RESPs, port statistics, group
bucket counters -- and asks it every few seconds for a :class:`Decision`.  All
of it is plain Python with the time passed in, so it is tested without Ryu.

How a weight is made (worker i of the node):

* **Service rate** ``mu_i = 1 / s_i``, where ``s_i`` is the worker's processing
  time per tuple over the last window: METRIC_RESP carries the running average
  ``proc_us`` and the tuple counts, so two responses give the window's own
  average.  It is smoothed (EWMA) and needs ``min_tuples`` tuples in a window
  to move.  A worker without an estimate yet gets the node's median.
* **Queue**: queued work delays new work, so the weight is divided by
  ``1 + queue_weight * backlog_s / interval_s``, where ``backlog_s`` is the
  worker's queue divided by its service rate.  The queue is the worker's whole
  backlog: what it took from its port and has not processed, and what it read
  ahead since (``typhoon/runtime/control.py``).  It used to be only what was
  left unread when the worker last took input, which is 0 as a worker takes
  all it has: the term never acted, and a worker that the hash over-fed held
  the sender's whole group window while the others idled.
* **Port statistics**: a worker whose switch port dropped frames toward it in
  the last interval cannot keep up with what it gets: its weight is multiplied
  by ``drop_penalty``.  A worker whose port is down is out of the group.
* **Hash skew** (``trim``, on by default): OVS maps each of the 256 slot
  addresses to one of 64 hash entries, a bucket each (``controller.rules.groups``),
  so a worker's achieved share differs from its configured one by a few points
  (measured: 37/45/18 % achieved for 43/43/14 % configured).  Once the bucket
  counters since the last change cover ``min_frames`` frames, each worker's
  weight is corrected by the ratio of the share asked for when they were
  installed (``base``, before any correction) to its achieved share (damped,
  bounded), at most ``MAX_TRIMS`` times in a row.  Held against the installed
  shares instead, which already carry the earlier corrections, it drove the
  achieved split away from the target.  A correction moves only the hash
  entries at the edges of the workers' runs of buckets, so it does not re-draw
  the skew (it did with weighted buckets, which is why trim used to be off),
  and senders take the slots in turn, so the counters give the split exactly
  rather than a sample of it.

The shares (weights normalized, at least ``min_share`` each) are installed only
if one of them moves by more than ``threshold_points`` from what is installed:
the switch's flow cache and the counters are left alone otherwise.  The
decision says why either way.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from controller.settings import setting

MAX_TRIMS = 3  # skew corrections in a row before the weights are left as they are
KEEP_WINDOWS = 64  # closed counting windows kept for the report


@dataclass(frozen=True)
class LbSettings:
    """The ``[load_balancer]`` section (``controller/settings.py``)."""

    section: ClassVar[str] = "load_balancer"

    interval_s: float = setting(5.0, "seconds between weight recomputations", name="interval")
    threshold_points: float = setting(
        5.0, "install new weights only if a share moves more (points)", name="threshold"
    )
    warn_points: float = setting(
        10.0, "warn if achieved and configured split differ more (points)", name="warn"
    )
    queue_weight: float = setting(
        1.0, "how strongly queued work lowers a weight (0: ignore queues)"
    )
    drop_penalty: float = setting(0.5, "weight factor for a worker whose port dropped frames")
    smoothing: float = setting(0.5, "EWMA factor of the processing-time estimate")
    min_share: float = setting(0.02, "smallest share of any live worker")
    min_tuples: int = setting(200, "tuples a worker must process in a window to re-estimate")
    trim: bool = setting(True, "correct weights for hash skew from the bucket counters")
    min_frames: int = setting(
        500, "frames counted before the achieved split is judged (warning, trim)"
    )
    trim_points: float = setting(1.5, "skew below which nothing is corrected (points)")
    settle_s: float = setting(
        1.5, "seconds after a change before bucket counters are read", name="settle"
    )


@dataclass
class WorkerState:
    """What the balancer knows of one worker of the node."""

    service_us: float | None = None  # smoothed processing time per tuple
    queue: int = 0
    tuples: int = 0  # cumulative tuples in, as last reported
    proc_us: float = 0.0  # the running average reported with them
    rate: float = 0.0  # tuples/s in over the last metrics window
    at: float | None = None  # when those were reported
    drops: int = 0  # cumulative frames the switch dropped toward it (port tx_dropped)
    new_drops: int = 0  # of those, since the last decision
    port_up: bool = True
    trim: float = 1.0


@dataclass(frozen=True)
class Decision:
    """One recomputation: the shares wanted, whether they were installed, and why."""

    node: str
    target: dict[int, float]  # share each worker should get (service rate, queue, ports)
    install: dict[int, float] | None  # shares to install (None: keep what is installed)
    reason: str


def tuples_in(metrics: Mapping) -> int:
    """Data tuples a worker received, over all streams (stream 0 is end of stream)."""
    return sum(v for k, v in (metrics.get("in") or {}).items() if k != "0")


def _points(a: Mapping[int, float], b: Mapping[int, float]) -> float:
    """Largest difference between two splits, in percentage points."""
    keys = set(a) | set(b)
    return max((abs(a.get(k, 0.0) - b.get(k, 0.0)) * 100 for k in keys), default=0.0)


def normalize(weights: Mapping[int, float], floor: float = 0.0) -> dict[int, float]:
    """Shares summing to 1, each at least ``floor`` (taken from the others pro rata)."""
    total = sum(max(0.0, w) for w in weights.values())
    if not weights:
        return {}
    if total <= 0:
        return dict.fromkeys(weights, 1.0 / len(weights))
    shares = {k: max(0.0, w) / total for k, w in weights.items()}
    low = {k for k, s in shares.items() if s < floor}
    if low and floor * len(shares) < 1:
        rest = sum(s for k, s in shares.items() if k not in low)
        scale = (1 - floor * len(low)) / rest
        shares = {k: floor if k in low else s * scale for k, s in shares.items()}
    return shares


def fmt_split(shares: Mapping[int, float]) -> str:
    """'w3 43%, w4 43%, w5 14%' for logs."""
    return ", ".join(f"w{k} {v * 100:.0f}%" for k, v in sorted(shares.items()))


@dataclass
class NodeBalancer:
    """Weights of one balanced node of one application (module docstring)."""

    app: str
    node: str
    settings: LbSettings = field(default_factory=LbSettings)
    workers: dict[int, WorkerState] = field(default_factory=dict)
    installed: dict[int, float] = field(default_factory=dict)  # shares on the switch now
    base: dict[int, float] = field(default_factory=dict)  # the same before the trims
    changed_at: float = -math.inf  # when they were installed
    baseline: dict[int, int] | None = None  # bucket counters when the counting window began
    achieved_counts: dict[int, int] = field(default_factory=dict)  # frames per worker since
    trims: int = 0  # skew corrections since the last change for another reason
    # counting windows closed by a change, newest last: (shares installed, frames per worker)
    closed: deque[tuple[dict[int, float], dict[int, int]]] = field(
        default_factory=lambda: deque(maxlen=KEEP_WINDOWS)
    )

    def worker(self, wid: int) -> WorkerState:
        return self.workers.setdefault(wid, WorkerState())

    def set_members(self, members: Iterable[int]) -> None:
        """The node's current workers: forget the ones that left."""
        keep = set(members)
        for wid in keep:
            self.worker(wid)
        for wid in set(self.workers) - keep:
            del self.workers[wid]

    # ----- inputs ----------------------------------------------------------------------------

    def on_metrics(self, wid: int, metrics: Mapping, now: float) -> None:
        """A METRIC_RESP of one of the node's workers."""
        w = self.worker(wid)
        n = tuples_in(metrics)
        proc = float(metrics.get("proc_us") or 0.0)
        w.queue = int(metrics.get("queue") or 0)
        if w.at is not None and n >= w.tuples:
            dn = n - w.tuples
            if now > w.at:
                w.rate = dn / (now - w.at)
            if dn >= self.settings.min_tuples:
                # the window's own average from two running averages
                window_us = max(0.0, (proc * n - w.proc_us * w.tuples) / dn)
                a = self.settings.smoothing
                w.service_us = (
                    window_us if w.service_us is None else (a * window_us + (1 - a) * w.service_us)
                )
            elif dn:
                return  # too few tuples to say anything yet: keep the older sample
        w.tuples, w.proc_us, w.at = n, proc, now

    def on_port(self, wid: int, tx_dropped: int, up: bool = True) -> None:
        """Port counters of a worker's switch port (toward the worker)."""
        w = self.worker(wid)
        if tx_dropped > w.drops:
            w.new_drops += tx_dropped - w.drops
        w.drops = tx_dropped
        w.port_up = up

    def on_buckets(self, counts: Mapping[int, int], now: float) -> None:
        """Cumulative frames per worker from the node's group buckets (all sender hosts).

        Counters read within ``settle_s`` of a change are skipped: OVS credits its
        datapath flows' packets to buckets late, and rebuilds them on a change.
        """
        if now - self.changed_at < self.settings.settle_s:
            return
        if self.baseline is None or any(counts.get(k, 0) < v for k, v in self.baseline.items()):
            self.baseline = dict(counts)
        self.achieved_counts = {k: counts.get(k, 0) - self.baseline.get(k, 0) for k in counts}

    # ----- outputs ---------------------------------------------------------------------------

    def achieved(self) -> dict[int, float]:
        """Share of frames each worker got since the counting window began ({} if none)."""
        total = sum(self.achieved_counts.values())
        if total <= 0:
            return {}
        return {k: v / total for k, v in self.achieved_counts.items() if k in self.workers}

    def frames_counted(self) -> int:
        return sum(self.achieved_counts.values())

    def target(self) -> tuple[dict[int, float], list[str]]:
        """Shares from service rate, queue and port state, and the reasons for them."""
        s = self.settings
        live = {k: w for k, w in self.workers.items() if w.port_up}
        if not live:
            return {}, ["no worker port is up"]
        known = [w.service_us for w in live.values() if w.service_us]
        median = statistics.median(known) if known else None
        weights: dict[int, float] = {}
        why: list[str] = []
        for wid, w in sorted(live.items()):
            service = w.service_us or median
            if not service:
                weights[wid] = 1.0
                continue
            mu = 1e6 / service
            weight = mu
            detail = f"w{wid} {service:.0f}us/tuple"
            backlog = w.queue / mu
            if backlog > 0 and s.queue_weight > 0:
                weight /= 1 + s.queue_weight * backlog / s.interval_s
                detail += f" queue {w.queue} ({backlog:.2f}s)"
            if w.new_drops:
                weight *= s.drop_penalty
                detail += f" port dropped {w.new_drops}"
            weights[wid] = weight
            why.append(detail)
        down = sorted(set(self.workers) - set(live))
        if down:
            why.append(f"port down: {', '.join(f'w{k}' for k in down)}")
        return normalize(weights, s.min_share), why

    def decide(self, now: float) -> Decision:
        """Recompute the weights; install them only if a share moves past the threshold."""
        s = self.settings
        target, why = self.target()
        for w in self.workers.values():
            w.new_drops = 0
        if not target:
            return Decision(self.node, {}, None, "; ".join(why))
        trimmed = self._trim(why)
        wanted = normalize({k: v * self.workers[k].trim for k, v in target.items()}, s.min_share)
        moved = _points(wanted, self.installed)
        basis = "; ".join(why)
        if not self.installed or set(wanted) != set(self.installed):
            self.trims = 0
            reason = f"workers changed: {fmt_split(wanted)} ({basis})"
        elif trimmed:
            reason = f"correcting hash skew: {fmt_split(wanted)} ({basis})"
        elif moved > s.threshold_points:
            self.trims = 0
            reason = (
                f"share moved {moved:.1f} points > {s.threshold_points:g}: "
                f"{fmt_split(self.installed)} -> {fmt_split(wanted)} ({basis})"
            )
        else:
            return Decision(
                self.node,
                target,
                None,
                f"kept {fmt_split(self.installed)}: largest move {moved:.1f} points "
                f"<= {s.threshold_points:g} ({basis})",
            )
        if self.frames_counted() > 0:
            self.closed.append((dict(self.installed), dict(self.achieved_counts)))
        self.installed = wanted
        self.base = target
        self.changed_at = now
        self.baseline = None
        self.achieved_counts = {}
        return Decision(self.node, target, wanted, reason)

    def _trim(self, why: list[str]) -> bool:
        """Correct weights by the ratio of the asked-for to the achieved share (hash skew).

        Only with enough frames counted since the last change, at most ``MAX_TRIMS``
        times in a row; True if the weights were corrected.  The achieved split is
        held against the shares asked for when it was installed, before any
        correction (``base``): not against the installed ones, which carry the
        earlier corrections (chasing them drove the achieved split away from the
        target), nor against today's target, which moves with the queues.
        """
        s = self.settings
        achieved = self.achieved()
        if not s.trim or not achieved or self.frames_counted() < s.min_frames:
            return False
        if set(achieved) != set(self.installed) or set(self.base) != set(achieved):
            return False
        if self.trims >= MAX_TRIMS:
            return False
        off = _points(achieved, self.base)
        if off <= s.trim_points:
            return False
        for k, want in self.base.items():
            ratio = want / max(achieved[k], 0.01)
            self.workers[k].trim = min(2.0, max(0.5, self.workers[k].trim * ratio**0.7))
        self.trims += 1
        why.append(f"achieved {fmt_split(achieved)} is {off:.1f} points off {fmt_split(self.base)}")
        return True

    def judged(self) -> tuple[int, dict[int, float], dict[int, int]]:
        """(windows, configured, frames per worker) over the current counting window and,
        while it covers fewer than ``min_frames`` frames, the closed ones before it,
        newest first, until they do: when the queues move the weights every few
        seconds, one window rarely grows that far.  ``configured`` is each window's
        installed shares weighted by its frames, what the frames should have split as.
        """
        windows = [(self.installed, self.achieved_counts)]
        total = self.frames_counted()
        for shares, counts in reversed(self.closed):
            if total >= self.settings.min_frames or set(shares) != set(self.installed):
                break
            windows.append((shares, counts))
            total += sum(counts.values())
        expected: dict[int, float] = dict.fromkeys(self.installed, 0.0)
        frames: dict[int, int] = dict.fromkeys(self.installed, 0)
        for shares, counts in windows:
            n = sum(counts.values())
            for k in frames:
                expected[k] += shares.get(k, 0.0) * n
                frames[k] += counts.get(k, 0)
        configured = {k: v / total for k, v in expected.items()} if total > 0 else {}
        return len(windows), configured or dict(self.installed), frames

    def report(self) -> dict:
        """Configured vs achieved split (``judged``) and what the weights rest on (REST, logs).

        ``installed``: the shares on the switch now; ``windows``: how many counting
        windows the split covers.
        """
        windows, configured, counts = self.judged()
        total = sum(counts.values())
        achieved = {k: v / total for k, v in counts.items()} if total > 0 else {}
        return {
            "windows": windows,
            "installed": {str(k): round(v, 4) for k, v in sorted(self.installed.items())},
            "configured": {str(k): round(v, 4) for k, v in sorted(configured.items())},
            "achieved": {str(k): round(v, 4) for k, v in sorted(achieved.items())},
            "frames_counted": total,
            "difference_points": round(_points(configured, achieved), 2) if achieved else None,
            "workers": {
                str(k): {
                    "service_us": None if w.service_us is None else round(w.service_us, 1),
                    "rate": round(w.rate, 1),
                    "queue": w.queue,
                    "port_drops": w.drops,
                    "port_up": w.port_up,
                    "trim": round(w.trim, 3),
                }
                for k, w in sorted(self.workers.items())
            },
        }

    def split_warning(self) -> str | None:
        """A sentence if the achieved split is more than ``warn_points`` off the configured
        (over the windows ``judged`` takes)."""
        _, configured, counts = self.judged()
        total = sum(counts.values())
        if total < self.settings.min_frames:
            return None
        achieved = {k: v / total for k, v in counts.items()}
        diff = _points(configured, achieved)
        if diff <= self.settings.warn_points:
            return None
        return (
            f"configured {fmt_split(configured)} but achieved {fmt_split(achieved)} "
            f"({diff:.1f} points apart, over {total} frames)"
        )
