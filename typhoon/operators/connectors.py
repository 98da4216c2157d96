"""The connector API: sources over splits, sinks that are idempotent or transactional.

docs/connectors.md has the whole picture; in short:

* A **split source** (:class:`SplitSource`) reads named splits (a Kafka topic's
  partitions, Redis streams, NATS subjects).  Every source worker computes the
  same assignment from the sorted split names (:func:`assign_splits`), reads
  only its own, and its offset is a position per split: the checkpoint holds
  it and a recovery seeks each split back there.  A subclass says how to list
  and fetch, nothing about checkpoints.
* A **transactional sink** (:class:`TransactionalSink`) is Flink's
  ``TwoPhaseCommitSinkFunction`` on our checkpoints.  Rows since the last anchor
  form the open epoch; the anchor closes it (pre-commit: its rows are in this
  worker's checkpoint, so they survive a SIGKILL); once the global checkpoint
  of that epoch is complete (every worker wrote its part) the framework calls
  :meth:`TransactionalSink.checkpoint_complete` and the subclass commits the
  closed epochs in one transaction that also records the newest epoch, so a
  replayed epoch is never written twice.  A rollback drops what was not
  committed (abort); the rows come again by replay.  COMPLETE (the job ended,
  no rollback can follow) commits the rest.
* An **idempotent sink** writes rows under a deterministic id (an upsert key):
  a replay rewrites the same rows, so it needs no transaction.  Without
  ``exactly_once`` a transactional sink writes like that: in batches, as they
  fill, retried with backoff.

Bad records are counted per reason (:class:`Drops`) and left out (or sent to a
dead letter by the connector); they never stop the worker.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from typhoon.operators.base import Bolt, Context, Emit, Spout

log = logging.getLogger(__name__)


class ConnectorError(Exception):
    """An outside server cannot be used; the message is one sentence naming it."""


def assign_splits(splits: Sequence[str], index: int, parallelism: int) -> list[str]:
    """The splits of source worker ``index`` of ``parallelism``: the sorted names dealt
    round robin, so every worker (and every replacement) computes the same answer and
    a split has exactly one reader.  A rescale deals them again with the new count."""
    if parallelism < 1 or not 0 <= index < parallelism:
        raise ValueError(f"worker index {index} is not one of {parallelism}")
    return [s for i, s in enumerate(sorted(set(splits))) if i % parallelism == index]


@dataclass
class Drops:
    """Bad records left out, per reason (the worker's metrics and result show them)."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str, n: int = 1) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + n

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def retry(what: str, call: Callable[[], Any], transient: tuple[type[BaseException], ...],
          attempts: int = 6, first_wait: float = 0.1) -> Any:  # fmt: skip
    """``call()``, retried with doubling waits while it raises a transient error; the
    last error goes up.  Blocking the worker meanwhile is the backpressure: a slow or
    restarting server slows the job instead of growing its memory."""
    wait = first_wait
    for attempt in range(attempts):
        try:
            return call()
        except transient as e:
            if attempt == attempts - 1:
                raise
            log.warning("%s failed (%s); retrying in %.1f s", what, e, wait)
            time.sleep(wait)
            wait = min(wait * 2, 5.0)
    raise AssertionError("unreachable")


def new_run_id() -> str:
    """A sink's run: it names what one submission commits (its epochs start at 1, so a
    new submission must not find the last one's record).  Sorts by start time."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


Entry = tuple[Any, list | None, str]  # (position, row or None if bad, reason if bad)


class SplitSource(Spout):
    """A replayable source over named splits; subclasses implement the three hooks.

    * ``list_splits()`` -> every split name (all workers must agree);
    * ``initial_position(split)`` -> where a split starts (``from:`` of the file);
    * ``fetch(split, position, max_count)`` -> up to ``max_count`` entries after
      ``position``, each ``(position, row, "")`` or ``(position, None, reason)`` for a
      bad record (counted, skipped: its position still advances); an empty list when
      nothing is there now;
    * ``ended(split, position)`` -> True when the split is done (bounded runs).
    """

    splits: list[str]
    POLL_S: ClassVar[float] = 0.01  # nothing new in any split: wait this long, not to spin

    def __init__(self, **args: Any) -> None:
        super().__init__(**args)
        self.splits = []
        self.positions: dict[str, Any] = {}
        self.emitted = 0
        self.drops = Drops()
        self._turn = 0

    def list_splits(self) -> list[str]:
        raise NotImplementedError

    def initial_position(self, split: str) -> Any:
        raise NotImplementedError

    def fetch(self, split: str, position: Any, max_count: int) -> list[Entry]:
        raise NotImplementedError

    def ended(self, split: str, position: Any) -> bool:
        return False

    def open(self, context: Context) -> None:
        super().open(context)
        self.splits = assign_splits(self.list_splits(), context.index, context.parallelism)
        self.positions = {s: self.initial_position(s) for s in self.splits}

    def offset(self) -> dict[str, Any]:
        return {
            "positions": dict(self.positions),
            "emitted": self.emitted,
            "dropped": dict(self.drops.counts),
        }

    def seek(self, offset: Any) -> None:
        positions = offset.get("positions") if isinstance(offset, dict) else None
        if not isinstance(positions, dict) or set(positions) != set(self.splits):
            raise ValueError(
                f"{type(self).__name__} cannot seek to {offset!r}: it needs a position for"
                f" each of its splits {self.splits}"
            )
        self.positions = dict(positions)
        self.emitted = int(offset.get("emitted", 0))
        self.drops = Drops(dict(offset.get("dropped") or {}))

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        live = [s for s in self.splits if not self.ended(s, self.positions[s])]
        if not live:
            return False
        got = 0
        for k in range(len(live)):  # round robin: one busy split does not starve the rest
            split = live[(self._turn + k) % len(live)]
            for position, row, reason in self.fetch(split, self.positions[split], max_count):
                self.positions[split] = position
                if row is None:
                    self.drops.add(reason)
                    continue
                emit(row)
                self.emitted += 1
                got += 1
            if got >= max_count:
                break
        self._turn += 1
        if not got:
            time.sleep(self.POLL_S)
        return True

    def result(self) -> dict[str, Any]:
        return {"emitted": self.emitted, "dropped": dict(self.drops.counts)}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        dropped: dict[str, int] = {}
        for r in results:
            for k, v in r["dropped"].items():
                dropped[k] = dropped.get(k, 0) + v
        return {"emitted": sum(r["emitted"] for r in results), "dropped": dropped}

    def metrics(self) -> dict[str, Any]:
        return {"connector_dropped": self.drops.total}


class TransactionalSink(Bolt):
    """Two-phase commit on checkpoints; subclasses implement the writing hooks.

    * ``write(rows)`` -> write rows now, durably (no guarantee, at_least_once); returns
      how many went in (bad ones are counted in ``drops``);
    * ``commit(epochs)`` -> write every closed epoch's rows (``{epoch: rows}``, ascending)
      and record the newest epoch, all in one transaction; returns the rows written;
    * ``committed_epoch()`` -> the newest epoch recorded for this worker (None: none);
    * ``reset()`` -> forget what a previous run recorded (a fresh submission's epochs
      start over, so a stale record would hide them).

    Under ``exactly_once`` rows wait in epochs as described in the module docstring;
    otherwise they are written once ``batch`` of them are there, on SIGNAL and at the
    end of the stream.
    """

    BATCH: ClassVar[int] = 500

    def __init__(self, **args: Any) -> None:
        super().__init__(**args)
        self.open_rows: list[list] = []  # since the last anchor (or batch, without 2PC)
        self.closed: dict[int, list[list]] = {}  # pre-committed epochs, not committed yet
        self.two_phase = False
        self.written = 0  # rows committed by this instance
        self.commits = 0
        self.fresh = True  # no restore so far: a new submission, not a replacement
        self.last_closed = -1  # newest epoch pre-committed
        self.drops = Drops()

    def write(self, rows: list[list]) -> int:
        raise NotImplementedError

    def commit(self, epochs: dict[int, list[list]]) -> int:
        raise NotImplementedError

    def committed_epoch(self) -> int | None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def open(self, context: Context) -> None:
        super().open(context)
        self.two_phase = context.guarantee == "exactly_once"

    def _start(self) -> None:
        if self.fresh and self.two_phase:
            self.fresh = False
            self.reset()

    def process(self, values: list, emit: Emit) -> None:
        self.process_batch([values], emit)

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        self._start()
        self.open_rows.extend(rows)
        if not self.two_phase and len(self.open_rows) >= self.BATCH:
            self._write_open()

    def _write_open(self) -> None:
        if self.open_rows:
            rows, self.open_rows = self.open_rows, []
            self.written += self.write(rows)
            self.commits += 1

    def on_signal(self, emit: Emit) -> None:
        if not self.two_phase:
            self._write_open()

    def close(self) -> None:
        if not self.two_phase:
            self._write_open()

    # ----- the two phases ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {"open": list(self.open_rows), "closed": dict(self.closed)}

    def restore(self, state: Any) -> None:
        if state is not None:
            self.open_rows = list(state["open"])
            self.closed = {int(e): list(r) for e, r in state["closed"].items()}

    def anchor_ready(self, epoch: int) -> bool:
        """Pre-commit: the snapshot just taken holds the open rows, now epoch ``epoch``'s."""
        self._start()
        # called again until it answers True (held anchors): close the epoch only once
        if self.two_phase and epoch not in self.closed and epoch > self.last_closed:
            self.closed[epoch] = self.open_rows
            self.open_rows = []
            self.last_closed = epoch
        return True

    def rewind(self, generation: int, epoch: int | None) -> None:
        """Abort: after a restore only what the checkpoint holds is left, and of that,
        what an earlier instance already committed is dropped (the recorded epoch)."""
        self.fresh = False
        if not self.two_phase:
            return
        if epoch is None:
            self.open_rows, self.closed = [], {}
            return
        if self.open_rows:  # the rows before anchor ``epoch``: that epoch's
            self.closed[epoch] = self.open_rows
            self.open_rows = []
        self.last_closed = epoch
        done = self.committed_epoch()
        if done is not None:
            self.closed = {e: r for e, r in self.closed.items() if e > done}

    def checkpoint_complete(self, epoch: int) -> None:
        """Commit every closed epoch up to ``epoch``, a complete global checkpoint."""
        if not self.two_phase:
            return
        ready = {e: self.closed[e] for e in sorted(self.closed) if e <= epoch}
        if ready:
            self.written += self.commit(ready)
            for e in ready:
                del self.closed[e]
            self.commits += 1

    def job_complete(self) -> None:
        """COMPLETE: no rollback can follow, so the open rows are final too."""
        if not self.two_phase:
            return
        self._start()
        last = max([*self.closed, self.committed_epoch() or 0]) + 1
        if self.open_rows:
            self.closed[last] = self.open_rows
            self.open_rows = []
        if self.closed:
            self.checkpoint_complete(max(self.closed))

    def abandon(self) -> None:
        """A rollback drops this instance: nothing of it is written."""
        self.open_rows, self.closed = [], {}
        self.close()

    def result(self) -> dict[str, Any]:
        return {"written": self.written, "dropped": dict(self.drops.counts)}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        dropped: dict[str, int] = {}
        for r in results:
            for k, v in r["dropped"].items():
                dropped[k] = dropped.get(k, 0) + v
        return {"written": sum(r["written"] for r in results), "dropped": dropped}

    def metrics(self) -> dict[str, Any]:
        pending = len(self.open_rows) + sum(map(len, self.closed.values()))
        return {"sink_written": self.written, "sink_pending": pending, "sink_commits": self.commits}


class RunIdSink(TransactionalSink):
    """A transactional sink that records its commits under a run id of its own (part
    file names, message ids) instead of under a record a new submission must clear:
    every instance draws one (``self.run``), so ``reset()`` has nothing to forget.

    Under ``exactly_once`` the checkpoint's run id names the record of the committed
    epochs, so a restore puts it back; a rollback to before any checkpoint draws a new
    one (nothing of the old instance was committed).  Otherwise the instance keeps the
    run id it drew: it numbers its parts or batches from 1 again, and under the old run
    id they would replace what the dead instance committed, or be dropped as sent
    before."""

    run: str = ""

    def reset(self) -> None:
        """Nothing to forget (see the class).  Changing the run id here would be wrong:
        a snapshot taken before the first row already holds it."""

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), "run": self.run}

    def restore(self, state: Any) -> None:
        super().restore(state)
        if self.two_phase and state is not None and isinstance(state.get("run"), str):
            self.run = state["run"]

    def rewind(self, generation: int, epoch: int | None) -> None:
        if epoch is None and self.two_phase:
            self.run = new_run_id()  # nothing of the old instance was committed
        super().rewind(generation, epoch)
