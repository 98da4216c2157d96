"""``emit_columns`` delivers exactly the rows ``emit_rows`` of the same rows delivers:
the same values on each link in the same order, the same counts; as column blocks
where the stream declares columns (docs/performance.md, "Columns")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_emit_rows import TOPOLOGY
from test_emit_rows import framework as rows_framework
from test_framework import Recorder

from typhoon.operators import resolve_operator
from typhoon.operators.sources import SequenceColumns
from typhoon.runtime.framework import Framework
from typhoon.runtime.hooks import batch_hook
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import Control, ControlTuple, is_block
from typhoon.wire.column_pack import as_columns, entry_cuts, pack_slice
from typhoon.wire.columns import entry_rows, unpack_block
from typhoon.wire.layout import pack_block, parse_layout

COLUMNS = "{src: int64, seq: int64, ts: float64, payload: bytes}"
GROUPINGS = [
    "shuffle",
    "global",
    "forward",
    "all",
    "local_or_shuffle",
    "{type: fields, fields: [seq]}",
    "{type: fields, fields: [src]}",
    "{type: fields, fields: [payload]}",  # a bytes key
    "{type: fields, fields: [src, seq]}",  # several fields
    "{type: fields, fields: [ts]}",  # a float key (by its bits)
    "{type: fields, fields: [payload, src]}",
    "{type: direct, fields: [payload], table: {\"b''\": 1}}",
    '{type: direct, fields: [seq], table: {"3": 1, "7": 0}}',
]
LAYOUT = parse_layout({"src": "int64", "seq": "int64", "ts": "float64", "payload": "bytes"})


def framework(
    grouping: str, par: int, batch: int, multicast: bool, declared: bool = True
) -> tuple[Framework, Recorder]:
    """test_emit_rows' source, of ``sequence_columns``, its streams' columns declared."""
    columns = f"\n    columns: {COLUMNS}" if declared else ""
    if grouping == "forward":
        par = 1  # forward: one partner per sender
    if "direct" in grouping:
        par = max(par, 2)  # its table names worker 1
    return rows_framework(grouping, par, batch, multicast, "sequence_columns", columns)


def per_link(io: Recorder) -> dict[tuple, list]:
    """Every row sent on each link, in order (entries of either kind)."""
    out: dict[tuple, list] = {}
    for kind, dst, stream, ps in io.sent:
        for p in ps:
            out.setdefault((kind, dst, stream), []).extend(entry_rows(p))
    return out


TS = [0.0, -0.0, 0.25, -1e300, 0.0]  # -0.0 and 0.0 pack (so hash) apart


def rows_of(seq: int, n: int, payloads: list[bytes]) -> list[list]:
    return [[1 + k % 3, seq + k, TS[k % 5], payloads[k % len(payloads)]] for k in range(n)]


def as_cols(rows: list[list], numpy: bool) -> dict:
    cols = {f: [r[i] for r in rows] for i, f in enumerate(LAYOUT.names)}
    if numpy:
        cols["src"] = np.asarray(cols["src"], dtype=np.int64)
        cols["seq"] = np.asarray(cols["seq"], dtype=np.int32)  # any int dtype fits int64
        cols["ts"] = np.asarray(cols["ts"], dtype=np.float64)
    return cols


@settings(max_examples=150, deadline=None)
@given(
    grouping=st.sampled_from(GROUPINGS),
    par=st.integers(1, 4),
    batch=st.integers(1, 12),
    multicast=st.booleans(),
    declared=st.booleans(),
    numpy=st.booleans(),
    chunks=st.lists(st.tuples(st.integers(0, 40), st.booleans()), min_size=1, max_size=5),
    payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=4),
)
def test_emit_columns_delivers_what_emit_rows_delivers(
    grouping: str,
    par: int,
    batch: int,
    multicast: bool,
    declared: bool,
    numpy: bool,
    chunks: list[tuple[int, bool]],
    payloads: list[bytes],
) -> None:
    ref, io_ref = framework(grouping, par, batch, multicast, declared)
    cut, io_cut = framework(grouping, par, batch, multicast, declared)
    seq = 0
    for n, as_rows in chunks:  # columns, with some row emits between them
        rows = rows_of(seq, n, payloads)
        seq += n
        ref.emit_rows([list(r) for r in rows])
        if as_rows:
            cut.emit_rows([list(r) for r in rows])
        else:
            cut.emit_columns(as_cols(rows, numpy))
    ref.flush(force=True)
    cut.flush(force=True)
    assert per_link(io_cut) == per_link(io_ref)
    assert cut.sent_to == ref.sent_to
    assert cut.serializations == ref.serializations
    assert cut.unrouted == ref.unrouted
    assert {s: r.emitted for s, r in cut.routers.items()} == {
        s: r.emitted for s, r in ref.routers.items()
    }
    assert all(len(p) <= cut.entry_cap for *_, ps in io_cut.sent for p in ps)
    m = cut.metrics()
    columns_sent = sum(n for n, as_rows in chunks if not as_rows)
    reasons = m.get("columns_as_rows", {})
    if not declared and columns_sent:
        assert reasons == {"no_layout": 2 * columns_sent}
        assert not any(is_block(p) for *_, ps in io_cut.sent for p in ps)
    elif declared and columns_sent:  # 'other' (shuffle) always goes as blocks
        assert m["columns_out"] >= columns_sent
        assert reasons == {}  # every grouping, keyed on any fields, deals blocks


def test_blocks_packed_from_columns_are_the_row_path_blocks() -> None:
    rows = rows_of(5, 300, [b"", b"abc", b"x" * 90])
    cols = as_columns(LAYOUT, as_cols(rows, True))
    assert cols is not None
    assert pack_slice(cols, 0, 300) == pack_block(LAYOUT, rows)
    assert pack_slice(cols, 17, 40) == pack_block(LAYOUT, rows[17:40])
    cuts = entry_cuts(cols, 1000)
    blocks = [pack_slice(cols, a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
    assert all(len(b) <= 1000 for b in blocks)
    assert [r for b in blocks for r in unpack_block(b).rows()] == rows
    big = rows_of(0, 2, [b"y" * 5000])  # a row larger than an entry: a block of its own
    cols = as_columns(LAYOUT, as_cols(big, False))
    assert cols is not None and entry_cuts(cols, 1000) == [0, 1, 2]


@pytest.mark.parametrize(
    ("column", "values"),
    [
        ("seq", [1, 2.0]),  # a float in an int64 column
        ("seq", [True, False]),  # msgpack keeps a bool apart from an int
        ("seq", [1 << 63, 1]),  # outside int64
        ("seq", np.array([1 << 63, 1], dtype=np.uint64)),
        ("ts", np.array([1, 2], dtype=np.int64)),  # ints in a float64 column
        ("payload", ["a", "b"]),  # str in a bytes column
    ],
)
def test_values_that_do_not_fit_go_as_rows_and_are_counted(column: str, values) -> None:
    cols = {"src": [1, 1], "seq": [1, 2], "ts": [0.5, 0.5], "payload": [b"", b""], column: values}
    assert as_columns(LAYOUT, cols) is None
    fw, io = framework("shuffle", 1, 100, False)
    fw.emit_columns(cols)
    fw.flush(force=True)
    expect = [list(r) for r in zip(*(list(cols[f]) for f in LAYOUT.names), strict=True)]
    assert [r for rows in per_link(io).values() for r in rows if r[0] == 1] == expect * 2
    assert fw.metrics()["columns_as_rows"] == {"unfit": 4}  # two streams, two rows each


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"src": [1], "seq": [1], "ts": [0.5]}, "missing \\['payload'\\]"),
        ({"src": [1], "seq": [1], "ts": [0.5], "payload": [b""], "x": [1]}, "unknown \\['x'\\]"),
        ({"src": [1, 2], "seq": [1], "ts": [0.5], "payload": [b""]}, "different lengths"),
        ([[1], [1]], "2 columns for a stream of 4"),
    ],
)
def test_a_malformed_emit_is_a_clear_error(data, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        as_columns(LAYOUT, data)


def test_rows_emitted_before_columns_leave_first_on_each_link() -> None:
    fw, io = framework("shuffle", 1, 1000, False)
    fw.emit_rows(rows_of(0, 5, [b"a"]))  # still batched (batch size 1000)
    fw.emit_columns(as_cols(rows_of(5, 5, [b"b"]), True))
    fw.flush(force=True)
    for rows in per_link(io).values():
        seqs = [r[1] for r in rows]
        assert seqs == sorted(seqs)


def test_the_columnar_source_emits_blocks_of_exactly_sequence_source_tuples() -> None:
    assert batch_hook(SequenceColumns(count=1), "next_columns", "next_batch") is not None
    outs = []
    for name in ("sequence_source", "sequence_columns"):
        fw, io = framework("shuffle", 3, 50, False)
        fw.op = resolve_operator(name)(count=20_000, size=7)
        fw._next_columns = batch_hook(fw.op, "next_columns", "next_batch")
        fw._next_rows = batch_hook(fw.op, "next_rows", "next_batch")
        fw.op.open(fw.context)
        fw.control(ControlTuple(Control.ACTIVATE, {}))
        while not fw.done:
            fw.step_spout()
            fw.flush()
        outs.append(({k: [r[:2] + r[3:] for r in v] for k, v in per_link(io).items()}, io))
    assert outs[0][0] == outs[1][0]
    blocks = [p for *_, ps in outs[1][1].sent for p in ps if is_block(p)]
    assert sum(unpack_block(b).n for b in blocks) == 2 * 20_000  # every tuple, in blocks


def test_a_bolt_emits_columns_through_its_context() -> None:
    fw, io = framework("shuffle", 2, 100, False)
    assert fw.context.emit_columns == fw.emit_columns
    fw.context.emit_columns([[1, 1], [0, 1], [0.5, 0.5], [b"", b"z"]])
    fw.flush(force=True)
    assert sorted(r for rows in per_link(io).values() for r in rows) == sorted(
        [[1, 0, 0.5, b""], [1, 1, 0.5, b"z"]] * 2
    )
    assert fw.metrics()["columns_out"] == 4


def test_under_upstream_backup_blocks_are_recorded_and_replayed_as_rows_are(tmp_path) -> None:
    """A guarantee with partial rollback: the transport records every entry that leaves
    (blocks too), and a replay resends them and counts their rows on the link."""
    text = TOPOLOGY.format(
        spout="sequence_columns", par=1, grouping="shuffle", columns=f"\n    columns: {COLUMNS}"
    )
    text += (
        f"config: {{guarantee: exactly_once, partial_rollback: true, "
        f"checkpoint_store: '{tmp_path}'}}\n"
    )
    topo = load_topology_text(text, "t.yaml")
    phys = schedule(topo, ["h1", "h2"], 7)
    wid = phys.of_node("source")[0].worker_id
    io = Recorder()
    fw = Framework(
        WorkerSpec(topo, phys, wid, batch_size=100),
        resolve_operator("sequence_columns")(count=10),
        io,
    )
    assert fw.backup is not None
    rows = rows_of(0, 500, [b"p" * 40])
    fw.emit_columns(as_cols(rows, True))
    (sink,) = phys.of_node("sink")
    first = [(s, p) for kind, d, s, ps in io.sent if d == sink.worker_id for p in ps]
    assert first and all(is_block(p) for _, p in first)
    assert fw.backup.after(sink.worker_id, None) == first  # recorded as sent, in order
    io.sent.clear()
    assert fw.replay(fw.gen + 1, None, [sink.worker_id])
    again = [p for kind, d, s, ps in io.sent if d == sink.worker_id and s != 0 for p in ps]
    assert [r for p in again for r in entry_rows(p)] == rows
    assert fw.sent_to[(sink.worker_id, first[0][0])] == 500


class Chained:
    """A receiver in this process (a chain): what it is handed by function call."""

    def __init__(self) -> None:
        self.items: list = []

    def deliver(self, item) -> None:
        self.items.append(item)


def test_a_chained_receiver_gets_the_blocks_by_function_call() -> None:
    fw, io = framework("shuffle", 1, 100, False)
    (dst,) = fw.routers[1].hops
    fw.chained[dst] = peer = Chained()
    rows = rows_of(0, 300, [b"c" * 10])
    fw.emit_columns(as_cols(rows, True))
    assert not [d for _, d, s, _ in io.sent if d == dst]  # nothing on the network
    got = [r for item in peer.items for p in item.payloads for r in entry_rows(p)]
    assert got == rows and all(is_block(p) for item in peer.items for p in item.payloads)
    assert fw.sent_to[(dst, 1)] == 300


RELAY = """
name: relay
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: mid
    operator: identity
  - id: sink
    operator: sequence_check
    parallelism: 2
streams:
  - from: source
    to: mid
    grouping: shuffle
    columns: {columns}
  - from: mid
    to: sink
    grouping: shuffle{out}
"""


@pytest.mark.parametrize("declared", [True, False])
def test_identity_passes_blocks_on_as_blocks(declared: bool) -> None:
    """A relay that gets columns sends them on as columns: blocks where its output
    declares them (no row built), the same rows, counted, where it does not."""
    out = f"\n    columns: {COLUMNS}" if declared else ""
    topo = load_topology_text(RELAY.format(columns=COLUMNS, out=out), "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    (mid,) = phys.of_node("mid")
    (src,) = phys.of_node("source")
    io = Recorder()
    fw = Framework(WorkerSpec(topo, phys, mid.worker_id, batch_size=100),
                   resolve_operator("identity")(), io)  # fmt: skip
    rows = rows_of(0, 400, [b"r" * 20])
    fw.deliver(
        Inbound(src.worker_id, 1, [pack_block(LAYOUT, rows[:250]), pack_block(LAYOUT, rows[250:])])
    )
    fw.flush(force=True)
    sent = [p for *_, ps in io.sent for p in ps]
    assert sorted(r for p in sent for r in entry_rows(p)) == sorted(rows)
    assert all(is_block(p) for p in sent) == declared
    m = fw.metrics()
    assert m["columns_in"] == 400
    assert m.get("columns_as_rows", {}) == ({} if declared else {"no_layout": 400})
