"""What a spark node's workers run: framework and I/O layers as usual, Spark for the operator.

The bolt appends every received tuple to its offset log, routes the rows of
each batch Spark published (once per batch ID), trims the log below what
Spark committed, and at end of input waits until the driver says Spark
processed everything and the last batch was routed (``pump`` returns busy
until then).  Worker index 0 also forwards the driver's Spark progress events
in METRIC_RESP (``spark`` entry).  Nothing here imports pyspark.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import msgpack

from pyspark_bridge.log import SEGMENT_BYTES, OffsetLog, worker_dir
from pyspark_bridge.outbox import OutboxReader, out_dir, replays
from typhoon.operators.base import Bolt, Context, Emit

OUTPUT_MODES = ("append", "update", "complete")
ARGS = ("fields", "schema", "output_mode", "trigger_ms", "params", "dir", "segment_bytes")
FLUSH_S = 0.005  # the log is flushed (made visible to Spark) at most this long after a tuple
TRIM_S = 1.0
MAX_EVENTS = 100  # progress events per METRIC_RESP


def load_function(name: str) -> Callable[..., Any]:
    """``module:function`` -> the DataFrame function (ValueError if it is not one)."""
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError("a spark node names its DataFrame function as module:function")
    fn = getattr(importlib.import_module(module_name), attr, None)
    if not callable(fn) or isinstance(fn, type):
        raise ValueError(f"'{name}' is not a function (DataFrame -> DataFrame)")
    return fn


def check_args(args: dict[str, Any], input_fields: list[str]) -> None:
    """Load-time check of a spark node's args (a typo should not wait for Spark)."""
    for key in args:
        if key not in ARGS and not key.startswith("spark."):
            raise ValueError(f"unknown arg '{key}' (spark nodes take {', '.join(ARGS)}, spark.*)")
    if args.get("output_mode", "append") not in OUTPUT_MODES:
        raise ValueError(f"output_mode must be one of {', '.join(OUTPUT_MODES)}")
    schema = args.get("schema") or {}
    if not isinstance(schema, dict):
        raise ValueError("schema maps input fields to Spark SQL types, e.g. {ts: double}")
    unknown = [f for f in schema if f not in input_fields]
    if unknown:
        raise ValueError(f"schema names {unknown}, which are not input fields {input_fields}")
    if not isinstance(args.get("params") or {}, dict):
        raise ValueError("params must be a mapping (keyword arguments of the function)")


def input_ddl(args: dict[str, Any], input_fields: list[str]) -> str:
    """DDL of the source DataFrame: one column per input field, STRING unless typed in schema."""
    types = args.get("schema") or {}
    return ", ".join(f"`{f}` {types.get(f, 'string')}" for f in input_fields)


class SparkBolt(Bolt):
    """Worker side of a spark node (one subclass per function, made by ``bolt_for``)."""

    function: ClassVar[str] = ""

    def __init__(self, **args: Any) -> None:
        super().__init__(**args)
        self.dir = args.get("dir")
        self.segment_bytes = int(args.get("segment_bytes", SEGMENT_BYTES))
        self.log: OffsetLog | None = None
        self.outbox: OutboxReader | None = None
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.last_flush = 0.0
        self.last_trim = 0.0
        self.eos_marked = False
        self.progress_at = 0  # bytes of progress.jsonl already forwarded

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        check_args(args, input_fields)
        fields = args.get("fields") or getattr(load_function(cls.function), "output_fields", None)
        if not fields:
            raise ValueError(
                "spark nodes declare their output columns: args 'fields' "
                "(or an output_fields attribute on the function)"
            )
        return list(fields)

    def open(self, context: Context) -> None:
        super().open(context)
        if not self.dir:
            raise ValueError(
                f"spark node '{context.node}' has no 'dir'; the launcher (tcp_cluster, agent) "
                "sets it through pyspark_bridge.plan"
            )
        self.log = OffsetLog(worker_dir(self.dir, context.worker_id), self.segment_bytes)
        self.outbox = OutboxReader(out_dir(self.dir), context.worker_id)

    def process(self, values: list, emit: Emit) -> None:
        self.log.append(self._pack(values))  # type: ignore[union-attr]

    def pump(self, emit: Emit, input_done: bool) -> bool:
        """Every event-loop turn: flush the log, route published batches, trim; busy until done."""
        assert self.log is not None and self.outbox is not None, "open() not called"
        now = time.monotonic()
        if self.log.buf and (now - self.last_flush >= FLUSH_S or input_done):
            self.log.flush()
            self.last_flush = now
        self.outbox.poll(emit)
        if now - self.last_trim >= TRIM_S:
            self.last_trim = now
            self.log.trim()
        if not input_done:
            return False
        if not self.eos_marked:
            self.log.mark_eos()
            self.eos_marked = True
        return not self.outbox.finished()

    def metrics(self) -> dict[str, Any]:
        """``spark`` entry of METRIC_RESP: worker 0 forwards the progress events not yet sent.

        ``events`` is a JSON list (METRIC_RESP values are numbers, strings and
        string-keyed maps; a progress event has lists and nulls).
        """
        if self.context is None or self.context.index != 0 or not self.dir:
            return {}
        events = self._new_progress()
        return {
            "spark": {"node": self.context.node, "events": json.dumps(events), "count": len(events)}
        }

    def _new_progress(self) -> list[dict[str, Any]]:
        path = Path(self.dir) / "metrics" / "progress.jsonl"
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                if f.tell() < self.progress_at:  # rotated by the driver
                    self.progress_at = 0
                f.seek(self.progress_at)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.progress_at += len(complete)
        events = [json.loads(line) for line in complete.splitlines() if line.strip()]
        return events[-MAX_EVENTS:]

    def result(self) -> dict[str, Any]:
        log, ob = self.log, self.outbox
        return {
            "appended": log.stats.appended if log else 0,
            "trimmed_segments": log.stats.trimmed_segments if log else 0,
            "batches_routed": ob.stats.batches if ob else 0,
            "rows_out": ob.stats.rows if ob else 0,
            "replays_dropped": replays(out_dir(self.dir)) if self.dir else 0,
        }

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {
            "appended": sum(r["appended"] for r in results),
            "trimmed_segments": sum(r["trimmed_segments"] for r in results),
            "batches": max((r["batches_routed"] for r in results), default=0),
            "rows_out": sum(r["rows_out"] for r in results),
            "replays_dropped": max((r["replays_dropped"] for r in results), default=0),
        }

    def close(self) -> None:
        """Stopped before its input ended (a rolled-back scale-up, a replaced worker): what it
        logged is all it will log, so Spark reads it and the node can still finish."""
        if self.log is not None:
            if not self.eos_marked:
                self.log.mark_eos()
            self.log.close()
