"""Column blocks: a stream's declared layout, packed by the sender, read as columns.

The block must give back exactly the rows the msgpack row batch gives (values and
their Python types), refuse rows that do not fit (the sender sends those as a row
batch, counted), and any malformed block is a WireError on the wire and a counted
drop in a worker.  Operators' ``process_columns`` do what ``process`` does row by row.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_framework import Recorder
from test_row_batches import FORWARD

from typhoon.operators.ads import Project
from typhoon.operators.base import Context
from typhoon.operators.sinks import SequenceCheck
from typhoon.operators.transforms import Filter
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound, rows_in
from typhoon.topology import TopologyError, load_topology_text, schedule
from typhoon.wire import WireError, decode_rows, encode_rows, parse_layout
from typhoon.wire.columns import Columns, entry_rows, unpack_block
from typhoon.wire.layout import describe_block, is_block, pack_block

LAYOUT = "{src: int64, seq: int64, ts: float64, payload: bytes}"
COLUMNS = FORWARD.replace("grouping: shuffle", f"grouping: shuffle\n    columns: {LAYOUT}")
FWD = parse_layout({"src": "int64", "seq": "int64", "ts": "float64", "payload": "bytes"})


def _rows(first: int, n: int, src: int = 1) -> list[list]:
    return [[src, i, 1e9 + i / 8, b"p" * (i % 5)] for i in range(first, first + n)]


# ----- the block itself ---------------------------------------------------------------------

VALUES = {
    "int64": st.integers(-(2**63), 2**63 - 1),
    "float64": st.floats(allow_nan=False),
    "bool": st.booleans(),
    "bytes": st.binary(max_size=20),
    "str": st.text(max_size=10),
}


@st.composite
def layouts_and_rows(draw: st.DrawFn) -> tuple:
    types = draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=6))
    layout = parse_layout({f"f{i}": t for i, t in enumerate(types)})
    row = st.tuples(*(VALUES[t] for t in types)).map(list)
    return layout, draw(st.lists(row, min_size=1, max_size=40))


@settings(deadline=None, max_examples=150)
@given(layouts_and_rows())
def test_a_block_gives_back_the_rows_the_row_batch_gives(case: tuple) -> None:
    layout, rows = case
    block = pack_block(layout, rows)
    assert block is not None and is_block(block) and rows_in(block) == len(rows)
    back = unpack_block(block).rows()
    want = decode_rows(encode_rows(rows))
    assert back == want == rows
    assert [list(map(type, r)) for r in back] == [list(map(type, r)) for r in want]
    assert entry_rows(block) == rows and entry_rows(encode_rows(rows)) == rows


@settings(deadline=None, max_examples=60)
@given(layouts_and_rows(), st.data())
def test_slices_takes_and_concatenations_keep_the_rows(case: tuple, data: st.DataObject) -> None:
    layout, rows = case
    cols = unpack_block(pack_block(layout, rows))
    n = len(rows)
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    assert cols[a:b].rows() == rows[a:b]
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    assert cols.take(mask).rows() == [r for r, m in zip(rows, mask, strict=True) if m]
    assert cols.rows_at(np.flatnonzero(mask)) == cols.take(mask).rows()
    parts = [cols[:a], cols.take(mask), cols[b:]]
    want = rows[:a] + [r for r, m in zip(rows, mask, strict=True) if m] + rows[b:]
    assert Columns.concat(parts).rows() == want


@pytest.mark.parametrize(
    "rows",
    [
        [[1, 2, 0.5, b""], [1, True, 0.5, b""]],  # bool is not int64 (msgpack keeps them apart)
        [[1, 2, 1, b""]],  # an int is not float64: it would come back as a float
        [[1, 2**63, 0.5, b""]],  # beyond int64
        [[1, 2, 0.5, "text"]],  # str is not bytes
        [[1, 2, 0.5]],  # a row of another length
        [[1, 2, 0.5, b""], (1, 2, 0.5, b"", 9)],
        ["not a row"],
    ],
)
def test_rows_that_do_not_fit_the_layout_are_refused(rows: list) -> None:
    assert pack_block(FWD, rows) is None


def test_a_str_that_is_not_utf8_is_refused() -> None:
    layout = parse_layout({"s": "str"})
    assert pack_block(layout, [["ok"], ["\ud800"]]) is None


def _corrupt(block: bytes) -> list[bytes]:
    """Blocks broken in each way :func:`unpack_block` must catch."""
    ints = parse_layout({"a": "int64", "b": "str", "c": "bool"})
    good = pack_block(ints, [[1, "é", True], [2, "xy", False]])
    assert good is not None
    k = 3
    at = 3 + k + 4  # the first column's values
    return [
        b"",
        b"\xc1",
        block[:-1],  # truncated
        block + b"\x00",  # trailing bytes
        block[:1] + b"\x02" + block[2:],  # another version
        block[:3] + b"\x09" + block[4:],  # unknown type code
        block[:2] + b"\x00" + block[3:],  # no columns
        block[: 3 + 4] + (10**6).to_bytes(4, "little") + block[3 + 4 + 4 :],  # rows past the end
        good[: at + 16] + (5).to_bytes(4, "little") + good[at + 20 :],  # offsets out of order
        good.replace("é".encode(), b"\xc3\x28"),  # not UTF-8
        good[:-2] + b"\x02" + good[-1:],  # a bool byte that is neither 0 nor 1
    ]


def test_malformed_blocks_are_wire_errors() -> None:
    block = pack_block(FWD, _rows(0, 5))
    assert block is not None
    for bad in _corrupt(block):
        with pytest.raises(WireError):
            unpack_block(bad)
    for cut in range(len(block)):
        with pytest.raises(WireError):
            unpack_block(block[:cut])


@settings(deadline=None, max_examples=300)
@given(st.data())
def test_any_mutated_block_is_rows_or_a_wire_error(data: st.DataObject) -> None:
    layout = parse_layout({"a": "int64", "b": "str", "c": "bytes", "d": "bool", "e": "float64"})
    block = bytearray(
        pack_block(layout, [[i, "ü" * i, b"b" * i, i % 2 == 0, i / 3] for i in range(4)])
    )
    for _ in range(data.draw(st.integers(1, 4))):
        block[data.draw(st.integers(0, len(block) - 1))] = data.draw(st.integers(0, 255))
    try:
        cols = unpack_block(bytes(block))
    except WireError:
        return
    rows = cols.rows()  # a block that decodes gives rows of its declared types
    assert len(rows) == cols.n and all(len(r) == len(cols.types) for r in rows)


def test_the_dissector_says_what_a_block_is() -> None:
    block = pack_block(FWD, _rows(0, 3))
    assert describe_block(block) == "column block v1: 3 rows of [int64, int64, float64, bytes]"
    assert "truncated" in describe_block(block[:5])


# ----- the declaration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("columns", "error"),
    [
        ("{src: int64, seq: int64, ts: float64}", "but 'source' emits [src, seq, ts, payload]"),
        ("{seq: int64, src: int64, ts: float64, payload: bytes}", "in that order"),
        ("{src: int64, seq: int32, ts: float64, payload: bytes}", "has type 'int32'"),
        ("[int64]", "must be a mapping"),
        ("{}", "should be non-empty"),
    ],
)
def test_a_bad_layout_is_a_clear_error(columns: str, error: str) -> None:
    text = FORWARD.replace("grouping: shuffle", f"grouping: shuffle\n    columns: {columns}")
    with pytest.raises(TopologyError, match=error.replace("[", r"\[").replace("]", r"\]")):
        load_topology_text(text, "t.yaml")


def test_the_layout_travels_with_the_topology() -> None:
    topo = load_topology_text(COLUMNS, "t.yaml")
    (s,) = topo.streams
    assert list(s.columns.items()) == list(zip(FWD.names, FWD.types, strict=True))
    again = type(topo).from_dict(topo.to_dict())
    assert again.streams[0].columns == s.columns


# ----- in a worker --------------------------------------------------------------------------


def _worker(text: str, node: str, op) -> Framework:
    topo = load_topology_text(text, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    wid = phys.of_node(node)[0].worker_id
    return Framework(WorkerSpec(topo, phys, wid, batch_size=1000), op, Recorder())


def test_the_sender_packs_blocks_and_sends_unfit_rows_as_a_counted_row_batch() -> None:
    from typhoon.operators import resolve_operator

    fw = _worker(COLUMNS, "source", resolve_operator("sequence_source")(count=10))
    rows = _rows(0, 300)
    entries = fw._entries(rows, 1)
    assert entries and all(is_block(e) for e in entries)
    assert [r for e in entries for r in entry_rows(e)] == rows
    assert all(len(e) <= fw.entry_cap for e in entries)
    odd = [*_rows(300, 5), [1, 305, 7, b""]]  # an int ts: not float64
    (entry,) = fw._entries(odd, 1)
    assert not is_block(entry) and decode_rows(entry) == odd
    assert fw.metrics()["columns_unfit"] == 6


class Spy(SequenceCheck):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def process_batch(self, rows, emit):
        self.calls.append("rows")
        super().process_batch(rows, emit)

    def process_columns(self, cols, emit):
        self.calls.append("columns")
        super().process_columns(cols, emit)


def test_the_receiver_hands_blocks_to_process_columns_and_counts_bad_ones() -> None:
    op = Spy()
    fw = _worker(COLUMNS, "sink", op)
    src = next(iter(fw.upstream))
    blocks = [pack_block(FWD, _rows(a, 50, src)) for a in range(0, 200, 50)]
    fw.deliver(Inbound(src, 1, blocks[:2]))  # one frame, two entries: one call
    other = parse_layout({"a": "int64", "b": "int64", "c": "int64", "d": "int64"})
    wrong = pack_block(other, [[src, 100, 0, 0]])  # types other than the stream declares
    fw.deliver(Inbound(src, 1, [blocks[2], b"\xc1\x01junk", wrong]))
    fw.deliver(Inbound(src, 1, [blocks[3], encode_rows(_rows(200, 10, src))]))  # mixed: rows
    assert op.calls == ["columns", "columns", "rows"]
    assert fw.io.stats.drops == {"malformed_block": 2}
    assert fw.tuples_in == {1: 210} and fw.received_from == {(src, 1): 210}
    assert op.received == 210 and op.duplicates == 0 and op.out_of_order == 0
    assert fw.metrics()["columns_in"] == 200  # the rows of the good blocks


def test_a_block_on_a_worker_without_columns_is_a_counted_malformed_batch() -> None:
    op = Spy()
    fw = _worker(FORWARD, "sink", op)
    src = next(iter(fw.upstream))
    fw.deliver(Inbound(src, 1, [pack_block(FWD, _rows(0, 5, src)), encode_rows(_rows(5, 5, src))]))
    assert fw.io.stats.drops == {"malformed_batch": 1}
    assert op.received == 5


# ----- operators: columns do what rows do ---------------------------------------------------


def _faulty(seed: int) -> list[list]:
    rng = random.Random(seed)
    rows = []
    for src in (3, 4):
        seqs = list(range(2000, 4000))
        seqs[100:300] = sorted(seqs[100:300], reverse=True)  # out of order
        seqs += rng.sample(range(2000, 4000), 40)  # duplicates
        rows += [[src, s, 1e9 + s, b"x"] for s in seqs if s % 97]  # and gaps
    part = rows[2500:3000]
    rng.shuffle(part)  # the two sources interleaved
    return rows[:2500] + part + rows[3000:]


def _both(make, rows: list[list], chunk: int, fields=("src", "seq", "ts", "payload"), layout=FWD):
    ctx = Context("t", "n", 1, 0, 1, input_fields=list(fields))
    one, cols = make(), make()
    one.open(ctx)
    cols.open(ctx)
    out_one: list = []
    out_cols: list = []
    for r in rows:
        one.process(r, lambda v, stream="default": out_one.append(v))
    for i in range(0, len(rows), chunk):
        block = unpack_block(pack_block(layout, rows[i : i + chunk]))
        cols.process_columns(block, lambda v, stream="default": out_cols.append(v))
    return one, cols, out_one, out_cols


@pytest.mark.parametrize("chunk", [1, 7, 100])
def test_sequence_check_columns_count_what_rows_count(chunk: int) -> None:
    rows = [*_rows(0, 1000, 3), *_faulty(5)]
    one, cols, _, _ = _both(SequenceCheck, rows, chunk)
    a, b = one.result(), cols.result()
    for r in (a, b):
        r.pop("timeline"), r.pop("latency_s")
    assert a == b and a["duplicates"] > 0 and a["out_of_order"] > 0
    assert len(one.latencies) == len(cols.latencies) and one.stride == cols.stride


def test_sequence_check_samples_like_rows_across_a_halving(monkeypatch) -> None:
    monkeypatch.setattr(SequenceCheck, "MAX_SAMPLES", 64)
    monkeypatch.setattr("typhoon.operators.sinks.time.time", lambda: 2e9)  # one clock for both
    rows = _rows(0, 1000, 3)
    one, cols, _, _ = _both(SequenceCheck, rows, 37)
    assert one.stride == cols.stride > 1 and len(one.latencies) == len(cols.latencies)
    assert one._tick == cols._tick
    assert one.latencies == cols.latencies


@pytest.mark.parametrize(
    "args",
    [
        {"field": "seq", "modulo": 7, "equals": 0},
        {"field": "seq", "modulo": 5, "values": [1, 3.0, True, -1, 9, 2.5, math.inf]},
        {"field": "seq", "values": [4, 9.0, 16, "x"]},
        {"field": "payload", "values": [b"pp", b""]},
        {"field": "ts", "modulo": 3, "equals": 0},  # float64: every value a bad one
        {"field": "seq", "modulo": 2**70, "equals": 5},  # beyond int64's arithmetic
    ],
)
def test_filter_columns_pass_what_rows_pass(args: dict) -> None:
    rows = [[1, s, 1e9 + s, b"p" * (s % 3)] for s in range(-50, 400)]
    one, cols, out_one, out_cols = _both(lambda: Filter(**args), rows, 64)
    assert out_one == out_cols and one.bad_value == cols.bad_value
    assert [list(map(type, r)) for r in out_one] == [list(map(type, r)) for r in out_cols]


@pytest.mark.parametrize("keep", [["seq"], ["payload", "src"], ["ts", "seq", "payload"]])
def test_project_columns_emit_what_rows_emit(keep: list[str]) -> None:
    rows = _rows(0, 300, 2)
    _, _, out_one, out_cols = _both(lambda: Project(keep), rows, 64)
    assert out_one == out_cols
