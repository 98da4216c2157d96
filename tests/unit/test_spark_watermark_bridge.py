"""A spark node shares the watermark: the pure parts, the bolt, and the framework's hook.

Spark's watermark text to milliseconds; the fabric's marks in the offset logs
and their minimum at a batch's cut; the output watermark (Spark's, bounded by
the fabric's at the cut, only going up) and the batches where Spark's ran
ahead of the fabric's; the bolt marking its log and counting late rows and
routing batches with their watermark; the framework passing on an operator's
own output watermark instead of its input's.  No Spark here
(tests/spark/test_spark_watermarks.py runs it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from test_framework import Recorder
from test_watermarks import watermarks

from pyspark_bridge.log import worker_dir, write_json
from pyspark_bridge.node import SparkBolt, check_args
from pyspark_bridge.outbox import out_dir, publish, stage_rows
from pyspark_bridge.watermarks import (
    MARKS,
    FabricMarks,
    WatermarkBridge,
    append_mark,
    combine,
    spark_ms,
)
from typhoon.operators.base import Bolt, Context
from typhoon.runtime.framework import EOS_PAYLOAD, Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import EOS_STREAM, Inbound
from typhoon.runtime.watermarks import watermark_payload
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import encode_rows

# ----- pure parts ------------------------------------------------------------------------


def test_spark_watermark_text_to_epoch_ms():
    assert spark_ms("1970-01-01T00:00:00.000Z") == 0
    assert spark_ms("1970-01-01T00:00:05.250Z") == 5250
    assert spark_ms("2026-11-27T03:00:01.5Z") == 1_795_748_401_500
    assert spark_ms("1970-01-01T00:00:07Z") == 7000
    assert spark_ms("1969-12-31T23:59:59.000Z") == -1000
    for bad in (None, "", "yesterday", 5, {"a": 1}):
        assert spark_ms(bad) is None


def test_fabric_marks_minimum_at_a_cut(tmp_path: Path):
    for w in ("1", "2"):
        worker_dir(tmp_path, w).mkdir(parents=True)
    append_mark(worker_dir(tmp_path, "1"), 100, 500)
    append_mark(worker_dir(tmp_path, "1"), 250, 900)
    marks = FabricMarks(tmp_path)
    ends = {"1": {"pos": 300, "seq": 3}, "2": {"pos": 40, "seq": 1}}
    assert marks.at_cut(ends, ["1", "2"]) is None  # log 2 has no mark: it holds back
    append_mark(worker_dir(tmp_path, "2"), 40, 700)
    assert marks.at_cut({"1": {"pos": 99, "seq": 1}, "2": ends["2"]}, ["1", "2"]) is None
    assert marks.at_cut({"1": {"pos": 200, "seq": 2}, "2": ends["2"]}, ["1", "2"]) == 500
    (worker_dir(tmp_path, "1") / MARKS).open("a").write('{"pos": 400, "wm"')  # half written
    assert marks.marks["1"][0] == (100, 500)  # still the last one at or before the cut
    assert marks.at_cut(ends, ["1", "2"]) == 700  # min(900 at 250 <= 300, 700 at 40)
    (worker_dir(tmp_path, "1") / MARKS).open("a").write(": 950}\n")
    marks.refresh(["1"])
    assert marks.below("1", 400) == 950
    assert marks.marks["1"] == [(250, 900), (400, 950)]  # the cut passed 250: 100 is gone
    # log 2 read to its end: it no longer counts
    write_json(worker_dir(tmp_path, "2") / "eos", {"pos": 40, "seq": 1})
    assert marks.at_cut(ends, ["1", "2"]) == 900
    write_json(worker_dir(tmp_path, "1") / "eos", {"pos": 300, "seq": 3})
    assert marks.at_cut(ends, ["1", "2"]) == math.inf
    # a lower watermark never lowers a log's marks; a log cut back (rollback) forgets beyond
    append_mark(worker_dir(tmp_path, "1"), 500, 10)
    append_mark(worker_dir(tmp_path, "1"), 120, 600)
    marks.refresh(["1"])
    assert marks.marks["1"] == [(120, 600)]


def test_combine():
    assert combine(None, False, 500) is None  # Spark's not known yet
    assert combine(300, True, None) is None  # a log has no mark at the cut
    assert combine(300, True, 500) == 300
    assert combine(800, True, 500) == 500  # never ahead of what the rows read guarantee
    assert combine(None, True, 500) == 500  # a query without withWatermark
    assert combine(300, True, math.inf) == 300


def progress(node: Path, batch: int, wm: str | None) -> None:
    (node / "metrics").mkdir(exist_ok=True)
    with open(node / "metrics" / "progress.jsonl", "a") as f:
        f.write(json.dumps({"node": "s", "batch": batch, "watermark": wm}) + "\n")


def at(ms: int) -> str:
    return f"1970-01-01T00:00:{ms // 1000:02d}.{ms % 1000:03d}Z"


def test_bridge_output_watermark_follows_routed_batches_and_counts_ahead(tmp_path: Path):
    worker_dir(tmp_path, "1").mkdir(parents=True)
    b = WatermarkBridge(str(tmp_path))
    assert b.current() is None  # nothing routed
    append_mark(worker_dir(tmp_path, "1"), 10, 1000)
    b.batch_routed(0, {"1": {"pos": 10, "seq": 1}}, ["1"])
    assert b.current() is None  # Spark's of batch 0 not reported yet
    progress(tmp_path, 0, at(0))
    assert b.current() == 0
    append_mark(worker_dir(tmp_path, "1"), 20, 2000)
    progress(tmp_path, 1, at(800))  # reported before batch 1 was routed here: not yet
    progress(tmp_path, 2, at(1500))
    assert b.current() == 0
    b.batch_routed(1, {"1": {"pos": 20, "seq": 2}}, ["1"])
    assert b.current() == 800
    # batch 2 ran with 1500 while the rows read up to batch 1's cut only promised 2000: fine
    append_mark(worker_dir(tmp_path, "1"), 30, 2100)
    b.batch_routed(2, {"1": {"pos": 30, "seq": 3}}, ["1"])
    assert b.current() == 1500 and b.ahead == 0
    # batch 3 ran with 2500 > 2100, the fabric's at batch 2's cut: Spark may have dropped
    # rows the fabric had on time; the output still carries no more than the fabric's
    progress(tmp_path, 3, at(2500))
    b.batch_routed(3, {"1": {"pos": 30, "seq": 3}}, ["1"])
    assert b.current() == 2100 and b.ahead == 1
    assert b.spark == 2500
    progress(tmp_path, 4, at(1000))  # never goes back
    b.batch_routed(4, {"1": {"pos": 30, "seq": 3}}, ["1"])
    assert b.current() == 2100 and b.ahead == 1
    b.reset()
    assert b.current() is None


def test_bridge_without_a_spark_watermark_carries_the_fabrics(tmp_path: Path):
    worker_dir(tmp_path, "1").mkdir(parents=True)
    b = WatermarkBridge(str(tmp_path))
    append_mark(worker_dir(tmp_path, "1"), 10, 1000)
    progress(tmp_path, 0, None)
    b.batch_routed(0, {"1": {"pos": 10, "seq": 1}}, ["1"])
    assert b.current() == 1000 and b.ahead == 0


# ----- the bolt --------------------------------------------------------------------------


def test_check_args_time_field():
    check_args({"time_field": "ts"}, ["key", "ts"])
    try:
        check_args({"time_field": "t"}, ["key", "ts"])
    except ValueError as e:
        assert "time_field 't' is not an input field" in str(e)
    else:
        raise AssertionError("a time_field the input lacks was accepted")


def test_bolt_marks_the_fabric_watermark_counts_late_rows_and_routes_spark_watermark(
    tmp_path: Path,
):
    bolt = SparkBolt(dir=str(tmp_path), time_field="ts")
    bolt.open(Context("t", "s", 4, 0, 1, input_fields=["key", "ts"], output_fields=["k", "e"]))
    emitted: list[list] = []
    bolt.process(["a", 100], emitted.append)
    bolt.pump(emitted.append, False)
    bolt.on_watermark(150, emitted.append)
    log_dir = worker_dir(tmp_path, 4)
    first = json.loads((log_dir / MARKS).read_text())
    assert first["wm"] == 150 and first["pos"] == bolt.log.pos  # flushed up to the mark
    bolt.process(["b", 120], emitted.append)  # below 150: late for the fabric
    bolt.process(["c", 160], emitted.append)
    bolt.process(["d", "x"], emitted.append)  # not a time: not counted here
    assert bolt.late_rows == 1
    bolt.on_watermark(300, emitted.append)
    assert bolt.output_watermark() is None
    # Spark publishes batch 0 (reading up to the first mark) and reports its watermark
    outdir = out_dir(tmp_path)
    staged = stage_rows(outdir, 0, [["a", 200]])
    publish(outdir, 0, [staged], [4], {"4": {"pos": first["pos"], "seq": 1}})
    progress(tmp_path, 0, at(90))
    bolt.pump(emitted.append, False)
    assert emitted == [["a", 200]]
    assert bolt.output_watermark() == 90  # min(Spark's 90, the fabric's 150 at the cut)
    end = bolt.log.offset()
    publish(outdir, 1, [], [4], {"4": end})
    progress(tmp_path, 1, at(400))
    bolt.pump(emitted.append, False)
    assert bolt.output_watermark() == 300  # the fabric's at batch 1's cut bounds it
    bolt.on_watermark(math.inf, emitted.append)  # end of input: no mark, the eos is
    assert len((log_dir / MARKS).read_text().splitlines()) == 2
    m = bolt.metrics()
    assert m["spark_late_rows"] == 1 and m["spark_watermark"] == 400
    # batch 1 ran with Spark's 400 while the rows after batch 0's cut only promised 150
    assert m["spark_watermark_ahead"] == 1
    r = bolt.result()
    assert r["late_rows"] == 1 and r["watermark_out"] == 300


def test_complete_mode_sends_no_watermark(tmp_path: Path):
    """Complete mode re-emits every window each batch: no bound holds on its output."""
    bolt = SparkBolt(dir=str(tmp_path), output_mode="complete")
    bolt.open(Context("t", "s", 4, 0, 1, input_fields=["key", "ts"], output_fields=["k"]))
    bolt.on_watermark(150, print)
    outdir = out_dir(tmp_path)
    publish(outdir, 0, [], [4], {"4": bolt.log.offset()})
    progress(tmp_path, 0, at(90))
    bolt.pump(print, False)
    assert bolt.wm is not None and bolt.wm.current() == 90  # it would be, in append mode
    assert bolt.output_watermark() is None


# ----- the framework: an operator that owns its output watermark -------------------------

PIPELINE = """
name: owned
spouts:
  - id: events
    operator: event_source
    args: {count: 10, keys: 2}
    parallelism: 2
    watermark: {time_field: ts, out_of_order_ms: 0}
bolts:
  - id: mid
    operator: identity
  - id: sink
    operator: collect
    parallelism: 2
streams:
  - {from: events, to: mid, grouping: shuffle}
  - {from: mid, to: sink, grouping: shuffle}
"""


class Owning(Bolt):
    """Emits what it got on its next pump; its output watermark is whatever ``out`` is."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[list] = []
        self.seen: list[float] = []
        self.out: int | None = None

    def process(self, values, emit):
        self.pending.append(values)

    def on_watermark(self, wm, emit):
        self.seen.append(wm)

    def pump(self, emit, input_done):
        for v in self.pending:
            emit(v)
        self.pending = []
        return False

    def output_watermark(self):
        return self.out


def test_framework_passes_on_the_operators_own_watermark_not_the_inputs():
    topo = load_topology_text(PIPELINE, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    wid = phys.of_node("mid")[0].worker_id
    op, io = Owning(), Recorder()
    fw = Framework(WorkerSpec(topo, phys, wid, batch_size=1000), op, io)
    a, b = (w.worker_id for w in phys.of_node("events"))
    sinks = sorted(w.worker_id for w in phys.of_node("sink"))
    fw.deliver(Inbound(a, 1, [encode_rows([["k0", 10, 1]])]))
    fw.deliver(Inbound(a, EOS_STREAM, [watermark_payload(200, False, 0, 1)]))
    fw.deliver(Inbound(b, EOS_STREAM, [watermark_payload(120, False, 0, 1)]))
    assert op.seen == [120] and fw.watermark == 120  # the input's reaches the operator
    assert watermarks(io) == []  # and is not passed on
    fw.tick()
    assert watermarks(io) == []  # the operator has none yet
    fw.deliver(Inbound(a, 1, [encode_rows([["k1", 20, 1]])]))
    op.out = 50
    fw.tick()  # emits the row, then the watermark behind it
    assert sorted(d for _, d, _ in watermarks(io)) == sinks
    assert {w[:2] for _, _, w in watermarks(io)} == {(50, False)}
    last_data = max(i for i, x in enumerate(io.sent) if x[2] == 2)
    first_wm = min(i for i, x in enumerate(io.sent) if x[2] == EOS_STREAM)
    assert last_data < first_wm  # behind the rows the pump emitted
    n = len(watermarks(io))
    op.out = 40
    fw.tick()
    op.out = 50
    fw.tick()
    assert len(watermarks(io)) == n  # it only goes up
    assert fw.metrics()["watermark_out"] == 50 and fw.metrics()["watermark"] == 120
    op.out = 70
    fw.tick()
    assert watermarks(io)[-1][2][:2] == (70, False)
    # end of input: +inf reaches the operator, and leaves as end of stream
    fw.deliver(Inbound(a, EOS_STREAM, [EOS_PAYLOAD]))
    fw.deliver(Inbound(b, EOS_STREAM, [EOS_PAYLOAD]))
    assert op.seen[-1] == math.inf
    op.out = 90
    fw.tick()
    assert fw.done
    assert watermarks(io)[-1][2][:2] == (90, False)  # sent before end of stream
    eos = [d for k, d, s, ps in io.sent if s == EOS_STREAM and EOS_PAYLOAD in ps]
    assert sorted(eos) == sinks
