"""Checkpoints of one worker: punctuations on the wire and a background writer.

Guaranteed processing (``config: guarantee``, docs/guarantees.md) follows the
SAND paper's consistent checkpoints (Chandy-Lamport anchors through every
worker) with a global rollback on failure:

* **anchor** ``[["anchor", epoch]]``: sources send one every
  ``checkpoint_interval_ms``; a worker that has it from every input (aligned
  under ``exactly_once``) writes its state for ``epoch`` and passes it on;
* **mark** ``[["mark", generation, epoch]]``: after a rollback to ``epoch`` a
  worker tells each receiver that what follows on this link belongs to the new
  ``generation``; a receiver rolls back too when it first hears of it, and
  drops data of older generations still in flight.

Both travel on the reserved stream 0 like end of stream, one row batch of one
punctuation.  State is serialized on the event loop (msgpack: a consistent
copy) and written by a thread, so the disk stays off the hot path.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

import msgpack

from typhoon.wire import decode_value

if TYPE_CHECKING:
    from typhoon.checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)

EPOCHS_PER_GENERATION = 1_000_000  # epoch = generation * this + n: a rollback never reuses one


def anchor_payload(epoch: int) -> bytes:
    data: bytes = msgpack.packb([["anchor", epoch]], use_bin_type=True)
    return data


def mark_payload(generation: int, epoch: int | None) -> bytes:
    data: bytes = msgpack.packb(
        [["mark", generation, -1 if epoch is None else epoch]], use_bin_type=True
    )
    return data


def handoff_payload(stream: int, migration: int) -> bytes:
    """A sender's last word on ``stream`` under the key groups before ``migration``."""
    data: bytes = msgpack.packb([["handoff", stream, migration]], use_bin_type=True)
    return data


# the end of stream of a sender that a reconfiguration takes off this link (drained, or
# released): a rollback must not wait for it again
LEAVING_PAYLOAD = msgpack.packb([["eos", "leaving"]], use_bin_type=True)


def punctuation(payload: bytes) -> tuple[str, int, int]:
    """``(kind, a, b)`` of a stream-0 entry: ``eos`` (1: leaving), ``anchor`` (epoch), ``mark``
    (generation, epoch; -1 = from the start), ``handoff`` (stream, migration) or ``wm``
    (a watermark: its fields come from ``typhoon.runtime.watermarks.parse_watermark``).
    Anything else is ``("", 0, 0)``."""
    try:
        rows = decode_value(payload)  # strict, like every decoder of received bytes
        row = rows[0]
        kind = row[0]
    except Exception:
        return ("", 0, 0)
    if kind == "eos":  # ["eos", "leaving"]: the sender leaves this link for good
        return ("eos", int(len(row) > 1 and row[1] == "leaving"), 0)
    if kind == "wm":  # a watermark (typhoon.runtime.watermarks.parse_watermark)
        return ("wm", 0, 0)
    if kind == "anchor" and len(row) == 2 and type(row[1]) is int:
        return ("anchor", row[1], 0)
    if kind in ("mark", "handoff") and len(row) == 3 and type(row[1]) is int:
        if type(row[2]) is int:
            return (kind, row[1], row[2])
    return ("", 0, 0)


class Checkpointer:
    """Writes this worker's state per epoch to the store, on a background thread.

    A store that cannot be opened or written is reported (``error``, ``failed``)
    and the run goes on: the epoch stays incomplete, so the previous global
    checkpoint remains the one a recovery uses.
    """

    def __init__(
        self, url: str | None, app: str, part: str, store: CheckpointStore | None = None
    ) -> None:
        self.part = part
        self.written: int | None = None  # newest epoch on disk
        self.failed = 0
        self.error = ""
        self.bytes = 0
        self.write_ms = 0.0
        self._queue: queue.Queue[tuple[int, bytes] | None] = queue.Queue()
        self.store: CheckpointStore | None = store
        if store is None:
            from typhoon.checkpoint import CheckpointError, open_store

            try:
                self.store = open_store(url, app)
            except CheckpointError as e:
                self.error = str(e)
                log.error("checkpoints of %s are not written: %s", part, e)
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def save(self, epoch: int, state: dict[str, Any]) -> None:
        """Serialize now (a consistent copy), write later."""
        data = msgpack.packb(state, use_bin_type=True)
        self._queue.put((epoch, data))

    def load(self, epoch: int) -> dict[str, Any]:
        """This worker's state of ``epoch`` (CheckpointError, CorruptCheckpoint)."""
        return self.load_part(epoch, self.part)

    def load_part(self, epoch: int, part: str) -> dict[str, Any]:
        """The state ``part`` wrote for ``epoch`` (another worker's of the same node, for
        keyed state whose owner changed since)."""
        from typhoon.checkpoint import CheckpointError

        if self.store is None:
            raise CheckpointError(f"no checkpoint store ({self.error})")
        data = self.store.read(epoch, part)
        state: dict[str, Any] = msgpack.unpackb(data, raw=False, strict_map_key=False)
        return state

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            finally:
                self._queue.task_done()

    def _write(self, epoch: int, data: bytes) -> None:
        from typhoon.checkpoint import CheckpointError

        if self.store is None:
            self.failed += 1
            return
        t0 = time.perf_counter()
        try:
            self.store.write(epoch, self.part, data)
        except CheckpointError as e:
            self.failed += 1
            self.error = str(e)
            log.error("checkpoint %d of %s not written: %s", epoch, self.part, e)
            return
        self.write_ms = (time.perf_counter() - t0) * 1000
        self.bytes = len(data)
        self.written = epoch

    def flush(self) -> None:
        """Wait until every queued state is written (tests, shutdown)."""
        self._queue.join()

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "checkpoint_epoch": -1 if self.written is None else self.written,
            "checkpoint_failed": self.failed,
            "checkpoint_bytes": self.bytes,
            "checkpoint_write_ms": round(self.write_ms, 3),
        }
        if self.error:
            out["checkpoint_error"] = self.error
        return out

    def close(self, timeout: float = 5.0) -> None:
        """Let queued writes finish (bounded)."""
        self._queue.put(None)
        self._thread.join(timeout)
