"""The receive path hands every entry of a frame to ``process_batch`` at once.

Punctuation (stream 0) and control arrive apart from data frames, so watermarks,
anchors and end of stream keep their place between the batches; counts and
errors stay per arrival.  Built-in operators' batch paths do what ``process``
does row by row.
"""

from __future__ import annotations

import math

import msgpack
import pytest
from test_framework import Recorder
from test_row_batches import FORWARD

from typhoon.operators.ads import LatencyCollect, Project
from typhoon.operators.base import Context
from typhoon.operators.sinks import Collect, SequenceCheck
from typhoon.operators.transforms import Filter
from typhoon.runtime.framework import EOS_PAYLOAD, Framework
from typhoon.runtime.hooks import batch_hook
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import EOS_STREAM, Inbound
from typhoon.runtime.watermarks import watermark_payload
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import ControlTuple, encode_rows


def _entry(first: int, n: int, src: int = 1) -> bytes:
    return encode_rows([[src, i, 0.0, b""] for i in range(first, first + n)])


class Spy(SequenceCheck):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def process_batch(self, rows, emit):
        self.calls.append(("rows", [r[1] for r in rows]))
        super().process_batch(rows, emit)

    def on_watermark(self, wm, emit):
        self.calls.append(("wm", wm))

    def on_signal(self, emit):
        self.calls.append(("eos",))


def _sink(op: SequenceCheck) -> Framework:
    topo = load_topology_text(FORWARD, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    sink = phys.of_node("sink")[0].worker_id
    return Framework(WorkerSpec(topo, phys, sink), op, Recorder())


def _run_poll(fw: Framework, items: list) -> None:
    """What the worker's event loop does with one poll's items."""
    for item in items:
        if isinstance(item, ControlTuple):
            fw.control(item)
        else:
            fw.deliver(item)


def test_punctuation_between_frames_keeps_its_place_between_batches() -> None:
    op = Spy()
    fw = _sink(op)
    src = next(iter(fw.upstream))
    out = [
        Inbound(src, 1, [_entry(0, 30, src)]),
        Inbound(src, 1, [_entry(30, 20, src), _entry(50, 10, src)]),  # one frame, two entries
        Inbound(src, EOS_STREAM, [watermark_payload(5000, False, 0, 1)]),
        Inbound(src, 1, [_entry(60, 40, src)]),
        Inbound(src, EOS_STREAM, [EOS_PAYLOAD]),
    ]
    _run_poll(fw, out)
    assert op.calls == [
        ("rows", list(range(30))),
        ("rows", list(range(30, 60))),  # a frame's entries in one call
        ("wm", 5000),
        ("rows", list(range(60, 100))),
        ("wm", math.inf),  # end of stream: every window closes, then the flush
        ("eos",),
    ]
    assert fw.tuples_in == {1: 100} and fw.received_from == {(src, 1): 100}
    assert op.received == 100 and op.duplicates == 0 and op.out_of_order == 0
    assert fw.done


def test_a_malformed_entry_in_a_run_is_counted_and_the_rest_runs_in_order() -> None:
    op = Spy()
    fw = _sink(op)
    src = next(iter(fw.upstream))
    bad_row = msgpack.packb([[src, 10, 0.0, b""], "not a row", [src, 11, 0.0, b""]])
    fw.deliver(Inbound(src, 1, [_entry(0, 10, src), b"\xc1junk", bad_row, _entry(12, 3, src)]))
    assert op.calls == [("rows", [*range(12), 12, 13, 14])]
    assert fw.io.stats.drops == {"malformed_batch": 1, "malformed_tuple": 1}
    assert fw.tuples_in == {1: 15} and fw.received_from == {(src, 1): 15}


def test_an_error_in_a_batch_is_raised_by_deliver_and_not_counted_as_received() -> None:
    class Failing(Spy):
        def process_batch(self, rows, emit):
            raise ValueError(f"bad row {rows[-1][1]}")

    op = Failing()
    fw = _sink(op)
    src = next(iter(fw.upstream))
    with pytest.raises(ValueError, match="bad row 19"):
        fw.deliver(Inbound(src, 1, [_entry(0, 10, src), _entry(10, 10, src)]))
    assert fw.tuples_in == {} and fw.received_from == {}


def _runs() -> list[list[list]]:
    """Batches as links deliver them: consecutive runs per source, plus a repeated run,
    one that goes back, a jump ahead, two sources mixed, and short batches."""
    batches = []
    for src in (3, 4):
        batches += [[[src, s, s, b""] for s in range(a, a + 100)] for a in range(0, 1000, 100)]
    batches.append([[3, s, s, b""] for s in range(500, 600)])  # every one a duplicate
    batches.append([[4, s, s, b""] for s in range(5000, 5100)])  # ahead: the bitmap grows
    batches.append([[4, s, s, b""] for s in range(2000, 2100)])  # behind the highest
    batches.append([[3, s, s, b""] for s in range(1000, 1050)] + [[4, 7, 7, b""]])
    batches.append([[3, s, s, b""] for s in range(1050, 1055)])  # short: row by row
    batches.append([[3, s, s, b""] for s in range(1055, 1155)])
    return batches


def test_sequence_check_batches_count_what_process_counts(monkeypatch) -> None:
    monkeypatch.setattr("typhoon.operators.sinks.time.time", lambda: 0.0)
    monkeypatch.setattr(SequenceCheck, "MAX_SAMPLES", 64)  # the stride doubles on the way
    ctx_fields = ["src", "seq", "ts", "payload"]
    one, batched = SequenceCheck(), SequenceCheck()
    for op in (one, batched):
        op.open(Context("t", "n", 1, 0, 1, input_fields=ctx_fields))
    for rows in _runs():
        for r in rows:
            one.process(r, None)
        batched.process_batch(rows, None)
        assert batched.stride == one.stride and batched._tick == one._tick
    assert batched.latencies == one.latencies and len(one.latencies) > 10
    a, b = one.result(), batched.result()
    a.pop("timeline"), b.pop("timeline")
    assert a == b
    assert a["duplicates"] == 101 and a["out_of_order"] == 100
    assert batched.highest == one.highest


def test_sequence_check_batches_after_a_restore_find_the_duplicates_above_highest() -> None:
    ctx = Context("t", "n", 1, 0, 1, input_fields=["src", "seq", "ts", "payload"])
    first = SequenceCheck()
    first.open(ctx)
    first.process_batch([[3, s, 0.0, b""] for s in range(100)], None)
    state = first.snapshot()
    state["highest"][3] = 10  # bits above the highest (an older snapshot's bookkeeping)
    again = SequenceCheck()
    again.open(ctx)
    again.restore(state)
    again.process_batch([[3, s, 0.0, b""] for s in range(50, 150)], None)
    assert again.duplicates == 50 and again.received == 200


def _same_as_row_by_row(make, rows: list[list], fields: list[str], chunk: int = 37) -> tuple:
    """What ``make()``'s process_batch emits and reports, against process row by row."""
    ctx = Context("t", "n", 1, 0, 1, input_fields=fields)
    one, batched = make(), make()
    one.open(ctx)
    batched.open(ctx)
    assert batch_hook(batched) is not None
    out_one: list = []
    out_batched: list = []
    for r in rows:
        one.process(r, lambda v, stream="default": out_one.append(v))
    for i in range(0, len(rows), chunk):
        part = rows[i : i + chunk]
        batched.process_batch(part, lambda v, stream="default": out_batched.append(v))
    assert out_one == out_batched
    return one, batched, out_one


@pytest.mark.parametrize(
    "args",
    [
        {"field": "auction", "modulo": 7, "equals": 0},
        {"field": "auction", "values": [3, 5, "x"]},
        {"field": "bidder", "equals": "b2"},
    ],
)
def test_filter_batches_pass_what_process_passes_and_count_bad_values(args) -> None:
    rows = [[a, f"b{a % 4}", a * 1.5] for a in range(300)]
    rows[40][0] = "not a number"  # under modulo: counted and dropped, its batch row by row
    rows[41][0] = True
    one, batched, out = _same_as_row_by_row(
        lambda: Filter(**args), rows, ["auction", "bidder", "price"]
    )
    assert out  # something passed
    assert one.metrics() == batched.metrics()
    if "modulo" in args:
        assert batched.bad_value == 2


def test_project_and_collect_batches_do_what_process_does() -> None:
    rows = [[a, f"b{a}", a * 1.5, a % 3] for a in range(200)]
    fields = ["auction", "bidder", "price", "k"]
    _same_as_row_by_row(lambda: Project(fields=["price", "auction"]), rows, fields)
    _same_as_row_by_row(lambda: Project(fields=["bidder"]), rows, fields)
    one, batched, _ = _same_as_row_by_row(lambda: Collect(limit=50), rows, fields)
    assert one.result() == batched.result() and batched.count == 200
    assert len(batched.tuples) == 50
    assert batch_hook(LatencyCollect()) is None  # overrides process only: row by row
