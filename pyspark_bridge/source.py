"""The ``typhoon`` Python data source: read a spark node's offset logs, write its outbox.

* Stream reader: one input partition per worker log with new records;
  offsets are ``{"<worker_id>": {"pos", "seq"}}`` (see ``log.py``).  The
  workers are the configured ones plus any whose log appeared since (a
  scale-up): each new log becomes one more partition from the next
  micro-batch on, starting at position 0, and the offsets of the others do
  not change.  ``commit`` records what Spark committed so each worker trims
  only that.  With the ``cut_batches`` option (a guarantee and the node arg
  ``cut_batches: true``) ``latestOffset`` caps each batch at the oldest
  anchored cut not yet reached (``anchors.cap``), so one batch ends exactly
  there.
* Stream writer (append and complete mode) and batch writer (update mode, via
  ``foreachBatch``): tasks stage rows, the driver-side commit publishes them
  under the batch ID, once (see ``outbox.py``), with the batch's source end
  offsets from Spark's offset log.

Options: ``dir`` (the node directory), ``schema`` (DDL of the input
columns), ``workers`` (comma-separated worker IDs), ``owners`` (comma-separated
worker IDs that route the output, see ``outbox.py``), and for the batch writer
``batch`` (the micro-batch ID).  Rows cross into Arrow
directly: a timestamp column takes epoch seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from pyspark_bridge import anchors, log, outbox, rewind

ROWS_PER_BATCH = 8192  # Arrow record batch size handed to Spark


class TyphoonDataSource(DataSource):
    """Registered as ``typhoon``: ``spark.readStream.format("typhoon")`` and the sinks."""

    @classmethod
    def name(cls) -> str:
        return "typhoon"

    def schema(self) -> str:
        return self.options.get("schema", "")

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LogReader(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return OutboxStreamWriter(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return OutboxBatchWriter(dict(self.options))


@dataclass
class LogPartition(InputPartition):
    """One worker's records in ``[start, end)`` (byte positions)."""

    log_dir: str
    start: int
    end: int


class LogReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.node_dir = Path(options["dir"])
        self.workers = [w for w in options.get("workers", "").split(",") if w]
        self.cut_batches = options.get("cut_batches", "false") == "true"
        self.schema = schema

    def _worker_ids(self) -> list[str]:
        """Configured workers plus any whose log appeared since (a scaled-up node)."""
        return log.worker_ids(self.node_dir, self.workers)

    def initialOffset(self) -> dict:
        return {w: dict(log.ZERO) for w in self.workers}

    def latestOffset(self) -> dict:
        workers = self._worker_ids()
        heads = {
            w: log.read_json(log.worker_dir(self.node_dir, w) / "head", dict(log.ZERO))
            for w in workers
        }
        if not self.cut_batches:
            return heads
        found, eos = anchors.read_node(self.node_dir, workers)  # after the heads (anchors.cap)
        if not any(found.values()):
            return heads
        return anchors.cap(heads, rewind.latest_end(self.node_dir / "checkpoint"), found, eos)

    def partitions(self, start: dict, end: dict) -> list[LogPartition]:
        parts = []
        for w, e in end.items():
            s = start.get(w, log.ZERO)
            if e["pos"] > s["pos"]:
                parts.append(
                    LogPartition(str(log.worker_dir(self.node_dir, w)), s["pos"], e["pos"])
                )
        return parts

    def read(self, partition: LogPartition) -> Iterator[pa.RecordBatch]:
        data = log.read_range(Path(partition.log_dir), partition.start, partition.end)
        to_batch = ArrowRows(self.schema)
        rows: list[Any] = []
        for rec in _records(data):
            rows.append(rec)
            if len(rows) >= ROWS_PER_BATCH:
                yield to_batch(rows)
                rows = []
        if rows:
            yield to_batch(rows)

    def commit(self, end: dict) -> None:
        for w, offset in end.items():
            d = log.worker_dir(self.node_dir, w)
            if d.exists():
                log.commit_offset(d, offset)


def _records(data: bytes) -> Iterator[Any]:
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    return iter(unpacker)


class ArrowRows:
    """Tuples (lists of field values) -> Arrow record batches of the source schema."""

    def __init__(self, schema: StructType) -> None:
        from pyspark.sql.pandas.types import to_arrow_type

        self.names = schema.fieldNames()
        self.types = [to_arrow_type(f.dataType) for f in schema.fields]
        self.width = len(self.names)
        self.micros = [pa.types.is_timestamp(t) for t in self.types]

    def __call__(self, rows: list[Any]) -> pa.RecordBatch:
        w = self.width
        fixed = [r if type(r) is list and len(r) == w else _fit(r, w) for r in rows]
        columns = list(zip(*fixed, strict=True)) if fixed else [()] * w
        arrays = []
        for col, t, micros in zip(columns, self.types, self.micros, strict=True):
            if micros:
                col = [
                    None if v is None or not isinstance(v, (int, float)) else int(v * 1e6)
                    for v in col
                ]
            arrays.append(pa.array(col, type=t))
        return pa.RecordBatch.from_arrays(arrays, names=self.names)


def _fit(row: Any, width: int) -> list[Any]:
    """A tuple with the wrong number of fields: pad with nulls or cut (never fail the batch)."""
    values = list(row) if isinstance(row, (list, tuple)) else [row]
    return (values + [None] * width)[:width]


# ----- output ------------------------------------------------------------------------------


@dataclass
class StagedRows(WriterCommitMessage):
    staged: tuple[int, str, int]


def _stage(options: dict[str, str], batches: Iterator[pa.RecordBatch]) -> StagedRows:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0

    def rows() -> Iterator[tuple]:
        for b in batches:
            yield from zip(*(c.to_pylist() for c in b.columns), strict=True)

    return StagedRows(outbox.stage_rows(outbox.out_dir(options["dir"]), partition, rows()))


def batch_ends(options: dict[str, str], batch: int) -> dict[str, Any] | None:
    """Where batch ``batch`` ends in each log (Spark logged it before running the batch)."""
    try:
        return rewind.batch_end(Path(options["dir"]) / "checkpoint", batch)
    except (FileNotFoundError, ValueError):
        return None


def owners(options: dict[str, str]) -> list[int]:
    """The ``owners`` option: workers that route the output (``outbox.publish``)."""
    return [int(w) for w in options.get("owners", "").split(",") if w.strip()]


def _staged(messages: list[WriterCommitMessage | None]) -> list[outbox.Staged | None]:
    return [m.staged if isinstance(m, StagedRows) else None for m in messages]


class OutboxStreamWriter(DataSourceStreamArrowWriter):
    """Append and complete mode: Spark calls ``commit`` with the batch ID."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedRows:
        return _stage(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        outbox.publish(
            outbox.out_dir(self.options["dir"]),
            batchId,
            _staged(messages),
            owners(self.options),
            batch_ends(self.options, batchId),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        outbox.discard(outbox.out_dir(self.options["dir"]), _staged(messages))


class OutboxBatchWriter(DataSourceArrowWriter):
    """Update mode: ``foreachBatch`` writes each micro-batch here with its ``batch`` option."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedRows:
        return _stage(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        outbox.publish(
            outbox.out_dir(self.options["dir"]),
            int(self.options["batch"]),
            _staged(messages),
            owners(self.options),
            batch_ends(self.options, int(self.options["batch"])),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        outbox.discard(outbox.out_dir(self.options["dir"]), _staged(messages))
