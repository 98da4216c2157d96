"""``keyed_columns`` (a keyed source made with numpy) and ``max_and_prev`` (max and last
value per key): their output equals the pure-Python reference, tuple for tuple."""

from __future__ import annotations

from typing import Any

import pytest

from typhoon.operators import BUILTINS
from typhoon.operators.base import Context
from typhoon.operators.keyed_columns import generate_keyed_columns, keyed_column_row
from typhoon.operators.sources import vocabulary
from typhoon.wire.columns import Columns, VarColumn


def _open(op: Any, index: int = 0, parallelism: int = 1) -> Any:
    op.open(Context("t", "source", 1 + index, index, parallelism))
    return op


def _drain(op: Any, chunk: int) -> list[list[Any]]:
    """Every row the source emits through ``next_columns``, chunk by chunk."""
    rows: list[list[Any]] = []

    def emit_columns(cols: list[Any]) -> None:
        assert isinstance(cols[1], VarColumn)
        rows.extend(Columns(("int64", "str", "int64", "int64"), cols, len(cols[0])).rows())

    while op.next_columns(emit_columns, chunk):
        pass
    return rows


@pytest.mark.parametrize(("parallelism", "chunk"), [(1, 1000), (3, 7)])
def test_numpy_columns_equal_the_python_reference(parallelism: int, chunk: int) -> None:
    got = []
    for i in range(parallelism):
        op = _open(BUILTINS["keyed_columns"](count=400, keys=12, seed=9), i, parallelism)
        got += _drain(op, chunk)
    assert sorted(got, key=lambda r: r[2]) == generate_keyed_columns(400, parallelism, 9, 12)
    assert {type(v) for r in got for v in r} == {int, str}


def test_rows_one_by_one_are_the_same_tuples_and_the_offset_resumes() -> None:
    op = _open(BUILTINS["keyed_columns"](count=50, keys=5, seed=2), 1, 2)
    rows: list[list[Any]] = []
    op.next_batch(rows.append, 20)
    assert op.offset() == {"emitted": 20}
    again = _open(BUILTINS["keyed_columns"](count=50, keys=5, seed=2), 1, 2)
    again.seek({"emitted": 10})
    assert _drain(again, 8)[:10] == rows[10:20]
    vocab = vocabulary(5)
    assert rows == [keyed_column_row(2, 2 * j + 1, 5, vocab) for j in range(20)]


def test_a_seed_outside_32_bits_is_refused() -> None:
    with pytest.raises(ValueError, match="seed"):
        BUILTINS["keyed_columns"](seed=1 << 32)


def test_max_and_prev_emits_the_max_so_far_and_the_previous_value() -> None:
    cls = BUILTINS["max_and_prev"]
    assert cls.output_fields({}, ["key", "value"]) == ["key", "value", "max", "prev"]
    with pytest.raises(ValueError, match="value field"):
        cls.output_fields({"value": "v"}, ["key", "value"])
    op = cls()
    op.peaks, op.key_of, op.index = {}, lambda values: values[0], 1
    out: list[list[Any]] = []
    for row in (["a", 5], ["b", 1], ["a", 3], ["a", 9], ["b", 0]):
        op.process(row, out.append)
    assert out == [["a", 5, 5, -1], ["b", 1, 1, -1], ["a", 3, 5, 5], ["a", 9, 9, 3], ["b", 0, 1, 1]]
    assert op.result() == {"max": {"a": 9, "b": 1}, "last": {"a": 9, "b": 0}}
    merged = cls.merge_results([op.result(), {"max": {"c": 2}, "last": {"c": 2}}])
    assert merged["keys_on_several_workers"] == 0 and merged["max"]["c"] == 2
