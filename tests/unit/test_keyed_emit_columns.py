"""Fields and direct groupings on column blocks, keyed on any field types or on several
fields: the rows of a key go to the receiver they go to as rows (``emit_rows``), and
they leave as blocks (no ``columns_as_rows``).  ``key_codes`` numbers keys exactly as
msgpack packs them (the hash the row path takes)."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_framework import Recorder

from typhoon.operators import resolve_operator
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import is_block
from typhoon.wire.column_pack import as_columns, key_codes
from typhoon.wire.columns import entry_rows
from typhoon.wire.layout import ColumnLayout

TYPES = ("int64", "float64", "bool", "bytes", "str")
VALUES = {
    "int64": st.integers(-3, 3) | st.sampled_from([-(1 << 63), (1 << 63) - 1]),
    "float64": st.sampled_from([0.0, -0.0, 1.5, float("inf"), float("nan")]),
    "bool": st.booleans(),
    "bytes": st.sampled_from([b"", b"a", b"a\0", b"\0", b"ab", b"b" * 40]),
    "str": st.sampled_from(["", "a", "a\0", "é", "ab", "z" * 30]),
}


@st.composite
def keyed_columns(draw: Any) -> tuple[ColumnLayout, list[list[Any]], list[int]]:
    kinds = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=4))
    n = draw(st.integers(1, 60))
    rows = [[draw(VALUES[k]) for k in kinds] for _ in range(n)]
    fields = draw(st.lists(st.integers(0, len(kinds) - 1), max_size=3, unique=True))
    layout = ColumnLayout(tuple(f"f{i}" for i in range(len(kinds))), tuple(kinds))
    return layout, rows, fields


@settings(max_examples=300, deadline=None)
@given(case=keyed_columns())
def test_equal_codes_exactly_where_the_keys_pack_the_same(case: Any) -> None:
    layout, rows, fields = case
    cols = as_columns(layout, [[r[i] for r in rows] for i in range(len(layout.types))])
    assert cols is not None
    codes, firsts = key_codes(cols, fields)
    packed = [msgpack.packb([r[f] for f in fields], use_bin_type=True) for r in rows]
    for i in range(len(rows)):
        assert packed[int(firsts[codes[i]])] == packed[i]  # the key's first row: same key
        for j in range(i):
            assert (codes[i] == codes[j]) == (packed[i] == packed[j]), (rows[i], rows[j])


TOPOLOGY = """
name: keyedcols
spouts:
  - {{id: source, operator: keyed_columns}}
bolts:
  - {{id: peak, operator: max_and_prev, parallelism: 5}}
streams:
  - from: source
    to: peak
    grouping: {grouping}
    columns: {{key: int64, name: str, seq: int64, value: int64}}
"""
GROUPINGS = [
    "{type: fields, fields: [name]}",
    "{type: fields, fields: [key, name]}",
    "{type: fields, fields: [name, value]}",
    "{type: fields, fields: [key]}",
    '{type: direct, fields: [name], table: {"ka": 0, "lo": 4}}',
    "{type: direct, fields: [key, name], table: {\"[1, 'lo']\": 3}}",
]


def framework(grouping: str) -> tuple[Framework, Recorder]:
    topo = load_topology_text(TOPOLOGY.format(grouping=grouping), "t.yaml")
    phys = schedule(topo, ["h1", "h2"], 7)
    wid = phys.of_node("source")[0].worker_id
    io = Recorder()
    op = resolve_operator("keyed_columns")(count=10)
    return Framework(WorkerSpec(topo, phys, wid, batch_size=16), op, io), io


def per_link(io: Recorder) -> dict[Any, list]:
    out: dict[Any, list] = {}
    for _, dst, _, ps in io.sent:
        for p in ps:
            out.setdefault(dst, []).extend(entry_rows(p))
    return out


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_a_key_goes_to_the_same_worker_as_columns_and_as_rows(grouping: str) -> None:
    from typhoon.operators.keyed_columns import generate_keyed_columns

    rows = generate_keyed_columns(3000, 1, 4, 40)
    ref, io_ref = framework(grouping)
    cut, io_cut = framework(grouping)
    ref.emit_rows([list(r) for r in rows])
    ref.flush(force=True)
    key, name, seq, value = zip(*rows, strict=True)
    cut.emit_columns([np.asarray(key), list(name), np.asarray(seq), np.asarray(value)])
    cut.flush(force=True)
    got, want = per_link(io_cut), per_link(io_ref)
    assert got == want  # each receiver: the same rows in the same order
    assert len(got) >= 3  # the keys were spread, not all sent one way
    (router,) = cut.routes["default"]
    for dst, received in got.items():  # each row where the row path's select puts it
        assert {router.select(r) for r in received} == {dst}
    assert all(is_block(p) for *_, ps in io_cut.sent for p in ps)
    assert not cut.metrics()["columns_as_rows"]
    assert cut.columns_out == len(rows)
