"""The ``peers`` scenario's pure parts: arrival ticks and steady rates, the count and
sequence checks, merging Bytewax processes' results, Typhoon's timed count, the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.arrivals import Arrivals, crossing_time, span_rate, steady_rate
from benchmarks.bytewax_runs import BytewaxRun, flow_args
from benchmarks.operators import TimedCount
from benchmarks.peer_checks import check_sequence, count_diff, expected_word_counts, merge_counts
from benchmarks.scenario import Bench
from benchmarks.scenarios.peers import (
    SYSTEMS,
    Outcome,
    Peers,
    bytewax_outcome,
    fail_on_loss,
    paired,
    typhoon_outcome,
)
from benchmarks.testbed import RunResult
from typhoon.operators.base import Context
from typhoon.operators.sources import SentenceSource


def test_arrivals_bin_by_tick_and_merge_across_workers() -> None:
    a, b = Arrivals(0.1), Arrivals(0.1)
    a.add(5, now=1.01)
    a.add(5, now=1.09)
    b.add(10, now=1.15)
    m = Arrivals.merged([a, b])
    assert m.bins == {10: 10, 11: 10} and m.total == 20
    assert Arrivals.from_dict(m.to_dict()) == m
    with pytest.raises(ValueError, match="ticks differ"):
        Arrivals.merged([a, Arrivals(0.01)])
    with pytest.raises(ValueError, match="not an arrivals record"):
        Arrivals.from_dict({"tick_s": 0, "bins": {}})
    assert Arrivals.merged([]).total == 0


def test_steady_rate_leaves_start_up_and_tail_outside_the_window() -> None:
    a = Arrivals(0.1)
    a.bins[0] = 1  # a slow start
    for tick in range(10, 30):  # 2 s at 1000 tuples/s (100 a tick)
        a.bins[tick] = 100
    a.bins[60] = 1  # a straggler long after
    assert crossing_time(a, 1) == pytest.approx(0.1)
    assert crossing_time(a, 51) == pytest.approx(1.05)
    assert crossing_time(a, 10_000) is None
    assert steady_rate(a) == pytest.approx(1000.0)
    assert span_rate(a) == pytest.approx(2002 / 6.1)  # every arrival: far lower
    short = Arrivals(0.1, {5: 1000})
    assert steady_rate(short) is None  # a window under two ticks is not a rate
    assert steady_rate(Arrivals()) is None and span_rate(Arrivals()) is None
    with pytest.raises(ValueError):
        steady_rate(a, 0.9, 0.1)


def test_expected_counts_are_what_the_spout_emits_over_its_workers() -> None:
    got: dict[str, int] = {}
    for index in range(2):  # two source workers share the sentences
        spout = SentenceSource(count=101, seed=7, words=8, vocabulary=50)
        spout.open(Context("t", "source", index + 1, index, 2))
        rows: list[list] = []
        emit = rows.append
        while spout.next_batch(lambda v, stream=None, emit=emit: emit(v), 10):
            pass
        got = merge_counts([got, count_diff_words(rows)])
    want = expected_word_counts(101, 7, 8, 50)
    assert sum(want.values()) == 808
    assert count_diff(want, got).equal


def count_diff_words(rows: list[list]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (sentence,) in rows:
        for w in sentence.split():
            out[w] = out.get(w, 0) + 1
    return out


def test_count_diff_tells_lost_from_extra() -> None:
    want = {"a": 3, "b": 2}
    d = count_diff(want, {"a": 2, "b": 3, "c": 1})
    assert (d.lost, d.extra, d.words_wrong, d.equal) == (1, 2, 3, False)
    assert count_diff(want, dict(want)).equal
    assert merge_counts([{"a": 1}, {"a": 2, "b": 1}]) == {"a": 3, "b": 1}


def test_sequence_check_over_workers() -> None:
    w0, w1 = bytearray(5), bytearray(5)
    w0[0] = w0[1] = 1
    w1[1] = w1[3] = w1[4] = 1
    c = check_sequence(5, [bytes(w0), bytes(w1)], out_of_range=2)
    assert (c.received, c.missing, c.duplicates, c.out_of_range) == (7, 1, 1, 2)
    with pytest.raises(ValueError, match="cover 4 numbers, not 5"):
        check_sequence(5, [bytes(4)])


def _bytewax_forward(count: int) -> BytewaxRun:
    seen0, seen1 = bytearray(count), bytearray(count)
    for s in range(count):
        (seen0 if s % 3 else seen1)[s] = 1
    parts = [
        {"source_here": True, "received": count - len(range(0, count, 3)),
         "first_s": 10.0, "last_s": 11.0, "seen_hex": bytes(seen0).hex()},
        {"source_here": False, "received": len(range(0, count, 3)),
         "first_s": 10.5, "last_s": 12.0, "seen_hex": bytes(seen1).hex()},
    ]  # fmt: skip
    return BytewaxRun("forward", 2, True, 3.0, parts=parts)


def test_a_bytewax_run_merges_its_processes() -> None:
    run = _bytewax_forward(30)
    assert run.sink_rate() == pytest.approx(30 / 2.0)  # first arrival anywhere to last
    assert run.crossed() == 10
    seq = run.sequence(30)
    assert (seq.received, seq.missing, seq.duplicates) == (30, 0, 0)
    assert "seen_hex" not in run.to_dict()["parts"][0]
    out = bytewax_outcome("bytewax -p 2", run, 30, None, 8)
    assert out.ok and out.crossed == pytest.approx(1 / 3) and out.lost == 0
    arrivals = Arrivals(0.01, {100: 800, 150: 800}).to_dict()
    wc = BytewaxRun(
        "wordcount",
        2,
        True,
        1.0,
        parts=[
            {"counts": {"ka": 3}, "arrivals": arrivals},
            {"counts": {"lo": 1}, "arrivals": arrivals},
        ],
    )
    assert wc.counts() == {"ka": 3, "lo": 1} and wc.arrivals().total == 3200
    out = bytewax_outcome("bytewax -p 2", wc, 1, {"ka": 3, "lo": 2}, 8)
    fail_on_loss(out)
    assert not out.ok and out.lost == 1 and "1 lost" in out.error
    assert not bytewax_outcome("x", BytewaxRun("forward", 1, False, 1.0, "boom"), 1, None, 8).ok
    assert flow_args({"count": 5, "vocabulary_size": 3}) == [
        "--count", "5", "--vocabulary-size", "3",
    ]  # fmt: skip


def test_timed_count_counts_and_times_its_arrivals() -> None:
    results = []
    for index, words in enumerate((["ka", "lo", "ka"], ["mi"])):
        op = TimedCount(key="word")
        op.open(Context("t", "count", index + 1, index, 2, input_fields=["word"]))
        op.process_batch([[w] for w in words[:2]], lambda v, s=None: None)
        op.process([words[2]] if len(words) > 2 else ["mi"], lambda v, s=None: None)
        results.append(op.result())
    merged = TimedCount.merge_results(results)
    assert merged["counts"] == {"ka": 2, "lo": 1, "mi": 2}
    assert Arrivals.from_dict(merged["arrivals"]).total == 5
    run = RunResult("tcp", 1, "wc", True, 2.0, report={"results": {"count": merged}})
    out = typhoon_outcome("wordcount", run, {"ka": 2, "lo": 1, "mi": 2}, 8)
    assert out.ok and out.lost == 0 and out.extra == 0
    out = typhoon_outcome("wordcount", run, {"ka": 2, "lo": 1, "mi": 3}, 8)
    fail_on_loss(out)
    assert not out.ok and out.lost == 1


def _outcome(system: str, workload: str, rate: float, ok: bool = True) -> Outcome:
    return Outcome(system, workload, ok, "" if ok else "x", rate, 1.0, 0, 0, 1.0)


def test_ratios_pair_the_runs_of_a_round_and_the_table_has_every_system(tmp_path: Path) -> None:
    rounds = [
        [_outcome(s, w, r * (2.0 if s in ("sdn", "tcp") else 1.0))
         for s in SYSTEMS for w in ("forward", "wordcount")]
        for r in (100.0, 300.0)
    ]  # fmt: skip
    rounds[1][0] = _outcome("sdn", "forward", 1.0, ok=False)
    value, per_round = paired(rounds, "tcp", "bytewax -p 2", "forward")
    assert value == 2.0 and per_round == [2.0, 2.0]
    value, per_round = paired(rounds, "sdn", "bytewax -p 2", "forward")
    assert per_round == [2.0, None] and value == 2.0  # a failed run gives no ratio
    res = Peers().result(Bench(None, tmp_path, quick=True, repeats=2))  # type: ignore[arg-type]
    Peers().describe(
        res,
        Bench(None, tmp_path, quick=True, repeats=2),  # type: ignore[arg-type]
        rounds,
        {"forward": 10, "sentences": 5},
    )
    assert [row[0] for row in res.tables[0].rows] == list(SYSTEMS)
    assert res.tables[0].rows[0][-1] == "3/4"  # sdn: one of its runs failed
    by_name = {r.name: r for r in res.ratios}
    wc = by_name["peers wordcount tcp / bytewax -p 2, steady sentences/s"]
    assert wc.value == 2.0 and wc.met is True and wc.target == ">= 1.5"
    assert by_name["peers forward tcp / bytewax -p 2, sink tuples/s"].met is False
    assert "**no**" in res.notes[0]
    assert (tmp_path / "peers.png").stat().st_size > 0
