"""A spark node shares the fabric's watermark (docs/windows.md, "Spark nodes").

Spark has no API to set a query's watermark from outside: it computes it
itself, the largest event time its ``withWatermark`` column has seen minus the
declared delay.  So the bridge does two things instead.

Input side: each worker records the fabric's watermark where it stands in
its offset log, a *mark* ``{"pos": p, "wm": W}`` in ``in/w<id>/watermarks.jsonl``
(written before the records up to ``p`` are flushed, so Spark never reads past
a position whose mark is missing): the rows after ``p`` in that log have an
event time of at least ``W``, except the ones the fabric itself found late
(counted by the worker).  The watermark at a batch's *cut* (where it ended
in every log) is the minimum over the logs of their last mark at or before
the cut (a log read to its end no longer counts).  Spark's watermark is
*consistent* with the fabric's when, for every batch ``N``, Spark's watermark
in ``N`` is at most the fabric's at the cut of ``N - 1``: then Spark drops (as
too late for its stateful operators) only rows the fabric also had as late.
Batches where it was not are counted (``ahead``).

Output side: after a worker routed batch ``N``, its output carries
``min(Spark's watermark in N, the fabric's at N's cut)``.  Spark's own bound:
in append or update mode a time window whose end is at or below Spark's
watermark in ``N`` was emitted in ``N`` or before and is never emitted again;
the fabric's bound: a stateless query (pass-through, projection, filter)
emits later only rows read after the cut, whose time is at least the
fabric's there.  A query without ``withWatermark`` reports none; its output
carries the fabric's.  Spark's watermark comes from the query progress
events the driver writes (``eventTime.watermark``, the watermark a batch
ran with).  Pure logic: the bolt (``node.py``) calls it.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark_bridge.log import ZERO, read_json, worker_dir

MARKS = "watermarks.jsonl"
INF = math.inf
KEEP_BATCHES = 64  # batches whose cut and Spark watermark are remembered for the check


def spark_ms(text: Any) -> int | None:
    """Spark's ``eventTime.watermark`` (ISO 8601, UTC) -> epoch milliseconds; None if absent.

    Event times on the fabric are numbers in milliseconds; a Spark function
    makes them timestamps with ``timestamp_millis``, so the two scales meet at
    the epoch."""
    if not isinstance(text, str) or not text:
        return None
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    delta = t - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


def append_mark(log_dir: Path, pos: int, wm: int) -> None:
    """Record that the rows after ``pos`` in this log are at or above ``wm``."""
    with open(Path(log_dir) / MARKS, "a", encoding="utf-8") as f:
        f.write(json.dumps({"pos": int(pos), "wm": int(wm)}) + "\n")


class FabricMarks:
    """Every worker log's marks, read as they grow."""

    def __init__(self, node_dir: str | Path) -> None:
        self.node_dir = Path(node_dir)
        self.read_at: dict[str, int] = {}  # bytes of each marks file already read
        self.marks: dict[str, list[tuple[int, int]]] = {}  # worker -> (pos, wm), pos ascending

    def refresh(self, workers: list[str]) -> None:
        for w in workers:
            path = worker_dir(self.node_dir, w) / MARKS
            try:
                with open(path, "rb") as f:
                    f.seek(self.read_at.get(w, 0))
                    data = f.read()
            except FileNotFoundError:
                continue
            complete = data[: data.rfind(b"\n") + 1]
            self.read_at[w] = self.read_at.get(w, 0) + len(complete)
            marks = self.marks.setdefault(w, [])
            for line in complete.splitlines():
                m = json.loads(line)
                pos, wm = int(m["pos"]), int(m["wm"])
                if marks and pos < marks[-1][0]:  # a log cut back by a rollback
                    del marks[bisect.bisect_right(marks, (pos, math.inf)) :]
                if not marks or wm > marks[-1][1]:
                    marks.append((pos, wm))

    def below(self, worker: str, pos: int) -> int | None:
        """The highest mark of ``worker``'s log at or before ``pos`` (None: none yet)."""
        marks = self.marks.get(worker) or []
        i = bisect.bisect_right(marks, (pos, math.inf))
        return marks[i - 1][1] if i else None

    def at_cut(self, ends: dict[str, Any], workers: list[str]) -> float | None:
        """The fabric's watermark over a batch's cut: the minimum over the logs not read to
        their end (INF when all were); None while one of them has no mark there."""
        self.refresh(workers)
        low = INF
        for w in workers:
            pos = int((ends.get(w) or ZERO)["pos"])
            eos = read_json(worker_dir(self.node_dir, w) / "eos")
            if eos is not None and pos >= int(eos["pos"]):
                continue  # this log has nothing more for Spark
            m = self.below(w, pos)
            if m is None:
                return None
            low = min(low, m)
        for w in workers:  # (a batch's cut is never before the previous one's)
            if w in self.marks:
                self._forget_before(w, int((ends.get(w) or ZERO)["pos"]))
        return low

    def _forget_before(self, worker: str, pos: int) -> None:
        """Cuts only move forward: the marks before the last one at or before ``pos`` go."""
        marks = self.marks[worker]
        i = bisect.bisect_right(marks, (pos, math.inf))
        if i > 1:
            del marks[: i - 1]


class SparkProgress:
    """Spark's watermark per batch, from the driver's ``metrics/progress.jsonl``."""

    def __init__(self, node_dir: str | Path) -> None:
        self.path = Path(node_dir) / "metrics" / "progress.jsonl"
        self.read_at = 0
        self.batches: dict[int, int | None] = {}  # batch -> Spark's watermark (None: none)

    def refresh(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(0, 2)
                if f.tell() < self.read_at:  # rotated by the driver
                    self.read_at = 0
                f.seek(self.read_at)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self.read_at += len(complete)
        for line in complete.splitlines():
            event = json.loads(line)
            if isinstance(event.get("batch"), int):
                self.batches[event["batch"]] = spark_ms(event.get("watermark"))
        for b in sorted(self.batches)[:-KEEP_BATCHES]:
            del self.batches[b]

    def latest(self, upto: int) -> tuple[int, int | None] | None:
        """(batch, its watermark) of the newest batch at or below ``upto`` reported."""
        known = [b for b in self.batches if b <= upto]
        if not known:
            return None
        b = max(known)
        return b, self.batches[b]


def combine(spark: int | None, has_progress: bool, fabric: float | None) -> float | None:
    """The output watermark from Spark's (None: the query has none) and the fabric's."""
    if not has_progress or fabric is None:
        return None  # Spark's is not known yet, or a log has no mark at the cut
    return fabric if spark is None else min(spark, fabric)


@dataclass
class WatermarkBridge:
    """One worker's view: the fabric's watermark at each routed batch's cut, Spark's per
    batch, the output watermark (only goes up) and the consistency check."""

    node_dir: str
    marks: FabricMarks = field(init=False)
    progress: SparkProgress = field(init=False)
    cuts: dict[int, float | None] = field(default_factory=dict)  # batch -> fabric's at its cut
    routed: int = -1  # newest batch routed
    out: int | None = None
    spark: int | None = None  # Spark's newest watermark
    ahead: int = 0  # batches whose Spark watermark was ahead of the fabric's
    checked: int = -1  # newest batch checked

    def __post_init__(self) -> None:
        self.marks = FabricMarks(self.node_dir)
        self.progress = SparkProgress(self.node_dir)

    def batch_routed(self, batch: int, ends: dict[str, Any], workers: list[str]) -> None:
        """Called for each batch's manifest once its rows were routed."""
        self.cuts[batch] = self.marks.at_cut(ends, workers)
        self.routed = max(self.routed, batch)
        for b in sorted(self.cuts)[:-KEEP_BATCHES]:
            del self.cuts[b]

    def reset(self) -> None:
        """A rollback: Spark starts again from its checkpoint, and so does the output."""
        self.cuts.clear()
        self.routed, self.out, self.checked = -1, None, -1

    def current(self) -> int | None:
        """The output watermark after what was routed; checks the batches reported since."""
        if self.routed < 0:
            return None
        self.progress.refresh()
        self._check()
        latest = self.progress.latest(self.routed)
        spark = latest[1] if latest else None
        if spark is not None:
            self.spark = spark if self.spark is None else max(self.spark, spark)
        wm = combine(spark, latest is not None, self.cuts.get(self.routed))
        if wm is not None and wm != INF and (self.out is None or wm > self.out):
            self.out = int(wm)
        return self.out

    def _check(self) -> None:
        for b in sorted(self.progress.batches):
            if b <= self.checked or b - 1 not in self.cuts:
                continue
            self.checked = b
            spark, fabric = self.progress.batches[b], self.cuts[b - 1]
            if spark is not None and fabric is not None and spark > fabric:
                self.ahead += 1
