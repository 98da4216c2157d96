"""What a spark node's workers run: framework and I/O layers as usual, Spark for the operator.

The bolt appends every received tuple to its offset log, routes the rows of
each batch Spark published (once per batch ID), trims the log below what
Spark committed, and at end of input waits until the driver says Spark
processed everything and the last batch was routed (``pump`` returns busy
until then).  Worker index 0 also forwards the driver's Spark progress events
in METRIC_RESP (``spark`` entry).  Nothing here imports pyspark.

Under a guarantee the bolt takes part in the job's checkpoints
(docs/guarantees.md, "Spark nodes"): its snapshot is its log position and the
log's identity; it writes an anchor there for Spark (``anchors.py``) and holds
the epoch's anchor until it routed ``B_E``, the last batch that read nothing
past the node's cut, and routes nothing after ``B_E`` until then.  On
a rollback it asks the driver to take Spark back (``rewind.py``) and, until the
driver answers, keeps what arrives in memory and routes nothing.  A
replacement continues the dead worker's log and routes its output (the log
identity in the snapshot), so Spark's partitions and the outbox owners stay.

Watermarks (``watermarks.py``): the fabric's watermark reaching the bolt is
marked in its log and rows below it are counted (``time_field``); its output
carries Spark's watermark, bounded by the fabric's at the batches routed.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import msgpack

from pyspark_bridge import anchors, rewind
from pyspark_bridge.log import SEGMENT_BYTES, ZERO, OffsetLog, worker_dir, worker_ids, write_json
from pyspark_bridge.outbox import OutboxReader, out_dir, replays
from pyspark_bridge.watermarks import INF, WatermarkBridge, append_mark
from typhoon.operators.base import Bolt, Context, Emit
from typhoon.operators.windowing import is_time

OUTPUT_MODES = ("append", "update", "complete")
ARGS = (
    "fields",
    "schema",
    "output_mode",
    "trigger_ms",
    "params",
    "dir",
    "segment_bytes",
    "guarantee",
    "cut_batches",
    "time_field",
)
FLUSH_S = 0.005  # the log is flushed (made visible to Spark) at most this long after a tuple
TRIM_S = 1.0
MAX_EVENTS = 100  # progress events per METRIC_RESP
KEEP_ANCHORS = 4  # under a guarantee the log keeps what the last few anchored epochs need


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
    time_field = args.get("time_field")
    if time_field is not None and time_field not in input_fields:
        raise ValueError(f"time_field '{time_field}' is not an input field {input_fields}")
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
        self.guarded = args.get("guarantee", "none") != "none"
        self.log: OffsetLog | None = None
        self.outbox: OutboxReader | None = None
        self.log_id: int | None = None  # whose log and outbox parts (a replacement adopts them)
        self.restored: dict[str, int] = dict(ZERO)
        self.snapped: dict[str, int] = dict(ZERO)  # log head at the last snapshot()
        self.anchored: dict[int, float] = {}  # epoch -> when it was checkpointed, until released
        self.unwritten: dict[int, dict[str, int]] = {}  # anchors taken while waiting
        self.released: list[int] = []  # log position B_E read up to, of the last anchors passed
        self.waiting: int | None = None  # generation of a rollback the driver has not done yet
        self.waiting_since = 0.0
        self.arrived: list[bytes] = []  # records received while waiting
        self.anchor_ms: list[float] = []  # snapshot -> anchor released
        self.rollback_ms: list[float] = []  # rollback asked -> driver done
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.last_flush = 0.0
        self.last_trim = 0.0
        self.eos_marked = False
        self.progress_at = 0  # bytes of progress.jsonl already forwarded
        self.time_field: str | None = args.get("time_field")
        self.time_index: int | None = None
        self.fabric_wm: float | None = None  # the fabric's watermark at the input
        self.late_rows = 0  # rows whose time was below it when they arrived
        self.wm: WatermarkBridge | None = None
        # complete mode re-emits every window each batch: no bound holds on its output
        self.owns_no_bound = args.get("output_mode", "append") == "complete"

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
        # the log opens at the first tuple or turn: a replacement learns whose log it
        # continues from its checkpoint first (restore), and must not start one of its own
        if self.time_field is not None and self.time_field in context.input_fields:
            self.time_index = context.input_fields.index(self.time_field)
        self.wm = WatermarkBridge(str(self.dir))

    def _open_log(self) -> OffsetLog:
        if self.log is None:
            assert self.context is not None, "open() not called"
            if self.log_id is None:
                self.log_id = self.context.worker_id
            self.log = OffsetLog(worker_dir(self.dir, self.log_id), self.segment_bytes)
            self.outbox = OutboxReader(out_dir(self.dir), self.log_id)
        return self.log

    def process(self, values: list, emit: Emit) -> None:
        i, low = self.time_index, self.fabric_wm
        if i is not None and low is not None and i < len(values):
            ts = values[i]
            if is_time(ts) and ts < low:
                self.late_rows += 1  # Spark gets it all the same; its watermark decides
        if self.waiting is not None:
            self.arrived.append(self._pack(values))
            return
        (self.log or self._open_log()).append(self._pack(values))

    def pump(self, emit: Emit, input_done: bool) -> bool:
        """Every event-loop turn: flush the log, route published batches, trim; busy until done."""
        if self.waiting is not None and not self._rewound():
            return True  # the driver is taking Spark back: nothing is read or routed
        log = self.log or self._open_log()
        assert self.outbox is not None
        now = time.monotonic()
        if log.buf and (now - self.last_flush >= FLUSH_S or input_done):
            log.flush()
            self.last_flush = now
        self.outbox.poll(emit, self._before if self.anchored else None, self._batch_routed)
        if now - self.last_trim >= TRIM_S:
            self.last_trim = now
            log.trim(self._trim_limit())
        if not input_done:
            return False
        if not self.eos_marked:
            self.log.mark_eos()
            self.eos_marked = True
        return not self.outbox.finished()

    # ----- watermarks (watermarks.py) -------------------------------------------------------

    def on_watermark(self, wm: float, emit: Emit) -> None:
        """The fabric's watermark at the input: marked in the log where it stands."""
        self.fabric_wm = wm
        if wm == INF or self.waiting is not None:
            return  # the end of input is the log's eos mark
        log = self.log or self._open_log()
        append_mark(log.dir, log.pos + log.buf_bytes, int(wm))  # before the rows are visible
        log.flush()
        self.last_flush = time.monotonic()

    def _batch_routed(self, manifest: dict[str, Any]) -> None:
        assert self.wm is not None
        self.wm.batch_routed(
            int(manifest["batch"]), manifest.get("ends") or {}, worker_ids(self.dir)
        )

    def output_watermark(self) -> int | None:
        """What the node's output links carry (the framework sends it when it goes up)."""
        if self.wm is None or self.waiting is not None or self.owns_no_bound:
            return None  # (complete mode: its links close at end of stream only)
        if self.fabric_wm is None:
            return None  # no watermark reached the input: no log has a mark, no bound holds
        return self.wm.current()

    # ----- guaranteed processing (docs/guarantees.md, "Spark nodes") -----------------------

    def snapshot(self) -> Any:
        """The log position at this checkpoint and whose log it is (Spark keeps the rest)."""
        if self.waiting is not None:  # the log continues at the cut with what arrived since
            self.snapped = {
                "pos": self.restored["pos"] + sum(map(len, self.arrived)),
                "seq": self.restored["seq"] + len(self.arrived),
            }
        else:
            log = self.log or self._open_log()
            log.flush()
            self.snapped = log.offset()
        return {"log": self.log_id, **self.snapped}

    def restore(self, state: Any) -> None:
        if not isinstance(state, dict) or "log" not in state:
            raise ValueError(f"not a spark node's checkpoint: {state!r}")
        self.log_id = int(state["log"])
        self.restored = {"pos": int(state["pos"]), "seq": int(state["seq"])}

    def anchor_ready(self, epoch: int) -> bool:
        """Anchor ``epoch`` may pass once ``B_E`` is routed and nothing after it (anchors.py)."""
        if epoch not in self.anchored:  # just checkpointed: mark the place for Spark
            if self.log is None:  # the driver is cutting the log: written once it is done
                self.unwritten[epoch] = dict(self.snapped)
            else:
                anchors.append_anchor(self.log.dir, epoch, self.snapped)
            self.anchored[epoch] = time.monotonic()
        if self.waiting is not None or self.outbox is None:
            return False
        if min(self.anchored) != epoch:
            return False  # the framework asks for the oldest first
        if not self._before(self.outbox.peek()):
            return False
        self.anchor_ms.append((time.monotonic() - self.anchored.pop(epoch)) * 1000)
        # a rollback to this epoch re-reads the log from where the batches routed so far ended
        self.released.append(int((self.outbox.ends.get(str(self.log_id)) or ZERO)["pos"]))
        del self.released[:-KEEP_ANCHORS]
        return True

    def _before(self, manifest: dict[str, Any] | None) -> bool:
        """The oldest held anchor goes before ``manifest``'s batch (None: not published yet)."""
        assert self.outbox is not None
        # the manifest was read first: a worker whose anchor is missing now was not read past it
        found, eos = anchors.read_node(Path(self.dir), worker_ids(self.dir))
        c = anchors.cut(min(self.anchored), found, eos)
        if anchors.reached(self.outbox.ends, c):
            return True
        return manifest is not None and anchors.crosses(manifest.get("ends") or {}, c)

    def _trim_limit(self) -> int | None:
        """Under a guarantee the log keeps what a rollback to the last anchors re-reads."""
        if not self.guarded:
            return None
        return self.released[0] if len(self.released) == KEEP_ANCHORS else 0

    def rewind(self, generation: int, epoch: int | None) -> None:
        """The job went back to ``epoch``: ask the driver to take Spark back to it too."""
        assert self.context is not None and self.dir
        if self.log_id is None:
            self.log_id = self.context.worker_id  # no checkpoint yet: from the start
        self.anchored.clear()
        self.unwritten.clear()
        if self.wm is not None:
            self.wm.reset()
        self.fabric_wm = None
        self.waiting, self.waiting_since = generation, time.monotonic()
        body = {"generation": generation, "epoch": epoch, **self.restored, "time": time.time()}
        anchors.write_request(Path(self.dir), str(self.log_id), body)

    def _rewound(self) -> bool:
        """The driver did our rollback: continue the log where it was cut."""
        ack = rewind.acked(Path(self.dir))
        if ack is None or int(ack.get("generation", -1)) < (self.waiting or 0):
            return False
        self.log = self.outbox = None
        log = self._open_log()
        if log.offset() != self.restored:
            raise rewind.RewindError(
                f"{log.dir}: the driver cut the log at {log.offset()}, not at {self.restored}"
            )
        for record in self.arrived:
            log.append(record)
        self.arrived = []
        log.flush()
        for epoch, at in sorted(self.unwritten.items()):
            anchors.append_anchor(log.dir, epoch, at)
        self.unwritten.clear()
        self.rollback_ms.append((time.monotonic() - self.waiting_since) * 1000)
        self.waiting = None
        self.eos_marked = False
        return True

    def abandon(self) -> None:
        """Dropped by a rollback: what it buffered is after the checkpoint, and nothing ends."""
        if self.log is not None:
            self.log.file.close()
            self.log = None

    def metrics(self) -> dict[str, Any]:
        """``spark`` entry of METRIC_RESP: worker 0 forwards the progress events not yet sent.

        ``events`` is a JSON list (METRIC_RESP values are numbers, strings and
        string-keyed maps; a progress event has lists and nulls).  Every worker
        reports its watermark counts (``spark_late_rows``, ``spark_watermark``,
        ``spark_watermark_ahead``).
        """
        out = self._watermark_counts()
        if self.context is None or self.context.index != 0 or not self.dir:
            return out
        events = self._new_progress()
        return {
            **out,
            "spark": {
                "node": self.context.node,
                "events": json.dumps(events),
                "count": len(events),
            },
        }

    def _watermark_counts(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spark_late_rows": self.late_rows}
        if self.wm is not None:
            out["spark_watermark_ahead"] = self.wm.ahead
            if self.wm.spark is not None:
                out["spark_watermark"] = self.wm.spark
        return out

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
        guarantee = {}
        if self.guarded:
            guarantee = {"anchor_ms": self.anchor_ms, "rollback_ms": self.rollback_ms}
        return {
            **guarantee,
            "appended": log.stats.appended if log else 0,
            "trimmed_segments": log.stats.trimmed_segments if log else 0,
            "batches_routed": ob.stats.batches if ob else 0,
            "rows_out": ob.stats.rows if ob else 0,
            "replays_dropped": replays(out_dir(self.dir)) if self.dir else 0,
            "late_rows": self.late_rows,
            "watermark_ahead": self.wm.ahead if self.wm else 0,
            "watermark_out": self.wm.out if self.wm else None,
        }

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        timings = {
            k: [x for r in results for x in r[k]]
            for k in ("anchor_ms", "rollback_ms")
            if all(k in r for r in results)
        }
        return {
            **timings,
            "appended": sum(r["appended"] for r in results),
            "trimmed_segments": sum(r["trimmed_segments"] for r in results),
            "batches": max((r["batches_routed"] for r in results), default=0),
            "rows_out": sum(r["rows_out"] for r in results),
            "replays_dropped": max((r["replays_dropped"] for r in results), default=0),
            "late_rows": sum(r.get("late_rows", 0) for r in results),
            # every worker checks every batch it routed: the largest count is the node's
            "watermark_ahead": max((r.get("watermark_ahead", 0) for r in results), default=0),
            "watermark_out": [r.get("watermark_out") for r in results],
        }

    def close(self) -> None:
        """Stopped before its input ended (a rolled-back scale-up, a replaced worker): what it
        logged is all it will log, so Spark reads it and the node can still finish."""
        if self.log is not None:
            if not self.eos_marked:
                self.log.mark_eos()
            self.log.close()
            if self.guarded:  # the driver may stop once every worker closed
                write_json(self.log.dir / "closed", {"time": time.time()})
