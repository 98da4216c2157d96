"""The benchmark sink's row-batch paths: the same verdicts as ``sequence_check``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.operators import BenchSink, set_bits
from typhoon.operators.base import Context
from typhoon.operators.sinks import SequenceCheck, decode_bitmap

FIELDS = ["src", "seq", "ts", "payload"]


def opened(op):  # noqa: ANN001, ANN201 - any sequence-checking bolt
    op.open(Context("t", "sink", 2, 0, 1, input_fields=FIELDS))
    return op


@given(lo=st.integers(0, 300), n=st.integers(0, 300), pre=st.sets(st.integers(0, 700)))
def test_set_bits_sets_exactly_the_range(lo: int, n: int, pre: set[int]) -> None:
    bm = bytearray(4)
    for b in pre:
        set_bits(bm, b, b + 1)
    set_bits(bm, lo, lo + n)
    got = int.from_bytes(bm, "little")
    want = sum(1 << b for b in pre | set(range(lo, lo + n)))
    assert got == want


def batches_of(seqs: list[int], cuts: list[int]) -> list[list[list]]:
    rows = [[s % 2 + 1, q, 1.0, b""] for s, q in seqs]
    out, i = [], 0
    for c in cuts:
        if i < len(rows):
            out.append(rows[i : i + c])
            i += c
    if i < len(rows):
        out.append(rows[i:])
    return out


@settings(max_examples=300, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 400)), max_size=300),
    runs=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 300), st.integers(1, 80))),
    cuts=st.lists(st.integers(1, 50)),
    cheap=st.booleans(),
)
def test_batches_give_the_verdicts_of_a_row_by_row_check(
    seqs: list[tuple[int, int]], runs: list, cuts: list[int], cheap: bool
) -> None:
    # consecutive runs (the cheap path) mixed with arbitrary arrivals (gaps, duplicates,
    # reordering, two sources)
    order = [(s, lo + k) for s, lo, n in runs for k in range(n)] + seqs
    ref, sink = opened(SequenceCheck()), opened(BenchSink(cheap=cheap))
    for batch in batches_of(order, cuts):
        for values in batch:
            ref.process(values, lambda *a: None)
        sink.process_batch(batch, lambda *a: None)
    a, b = ref.result(), sink.result()
    for key in ("received", "duplicates"):
        assert a[key] == b[key], key
    assert {s: decode_bitmap(v) for s, v in a["bitmaps"].items()} == {
        s: decode_bitmap(v) for s, v in b["bitmaps"].items()
    }
    if not cheap:
        assert a["out_of_order"] == b["out_of_order"]
        assert b["sampled_batches"] == 0


def test_consecutive_batches_take_the_cheap_path_and_a_repeat_does_not() -> None:
    sink = opened(BenchSink(cheap=True))
    rows = [[1, q, 1.0, b""] for q in range(100)]
    sink.process_batch(rows[:60], None)
    sink.process_batch(rows[60:], None)
    sink.process_batch(rows[50:70], None)  # a repeat: checked row by row, 20 duplicates
    r = sink.result()
    assert r["sampled_batches"] == 2
    assert r["received"] == 120 and r["duplicates"] == 20
    assert decode_bitmap(r["bitmaps"]["1"]) == (1 << 100) - 1


def test_acks_every_row_of_a_batch() -> None:
    sink = opened(BenchSink(ack=True, cheap=True))
    out = []
    rows = [[1, q, 1.0, (q + 7).to_bytes(8, "little") + b"xx"] for q in range(5)]
    sink.process_batch(rows, lambda values, stream="default": out.append(values))
    assert out == [[1, q, 1.0, q + 7] for q in range(5)]
