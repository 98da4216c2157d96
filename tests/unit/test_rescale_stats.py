"""The rescale benchmark's pure parts: per-second series, targets, migration figures,
and its operators' bookkeeping (benchmarks/rescale_stats.py, benchmarks/keyed_ops.py)."""

from __future__ import annotations

import pytest

from benchmarks.keyed_ops import KeyedSource, PaddedFlushCount, RescaleSink, expected_count
from benchmarks.rescale_stats import assess, migration_figures, quantile, second_stats
from typhoon.operators.base import Context
from typhoon.topology.keygroups import round_id


def test_quantile_is_nearest_rank():
    vs = [float(i) for i in range(1, 101)]
    assert quantile(vs, 0.99) == 99.0
    assert quantile(vs, 0.5) == 50.0
    assert quantile([7.0], 0.99) == 7.0


def test_second_stats_keeps_an_empty_second_as_zero():
    bins = {10: [0.001, 0.003, 0.002], 12: [0.5]}
    assert second_stats(bins) == [
        (10, 3, 0.002, 0.003),
        (11, 0, None, None),
        (12, 1, 0.5, 0.5),
    ]
    assert second_stats({}) == []


def test_assess_reads_the_targets_off_the_series():
    series = [
        (100, 1000, 0.001, 0.010),
        (101, 1000, 0.001, 0.012),
        (102, 1000, 0.001, 0.011),
        (103, 400, 0.050, 0.030),  # the migration: a dip and a spike
        (104, 1600, 0.002, 0.015),
        (105, 1000, 0.001, 0.010),
    ]
    a = assess(series, (100.0, 103.0), [(103.2, 104.5)])
    assert a.pre_rate == 1000
    assert a.p99_before == 0.011
    assert a.min_rate == 400
    assert a.p99_during == 0.030
    assert a.below_half == 1
    assert a.min_ratio == pytest.approx(0.4)
    assert a.p99_ratio == pytest.approx(0.030 / 0.011)
    # a stall with nothing arriving counts as a 0 second, and has no p99
    stalled = assess([*series[:3], (103, 0, None, None)], (100.0, 103.0), [(103.0, 103.9)])
    assert stalled.min_rate == 0 and stalled.p99_during is None and stalled.below_half == 1
    assert assess([], (0, 1), []).min_ratio is None


def test_migration_figures_join_old_and_new_owners():
    old = {
        "1": {"out": 4, "in": 0, "keys": 100, "shipped": {"7": 3_000_000, "8": 1_000_000},
              "ship_started": 50.0, "ship_ms": 120.0, "group_pause_ms": {}, "loaded": {}},
    }  # fmt: skip
    new7 = {
        "1": {"out": 0, "in": 3, "keys": 75, "group_pause_ms": {"0": 10.0, "1": 30.0, "2": 0.0},
              "loaded": {"5": {"at": 50.5, "bytes": 3_000_000, "window_ms": 700.0}}},
    }  # fmt: skip
    new8 = {
        "1": {"out": 0, "in": 1, "keys": 25, "group_pause_ms": {"3": 20.0},
              "loaded": {"5": {"at": 51.0, "bytes": 1_000_000}}},
        "2": {"out": 1, "in": 0, "keys": 25, "shipped": {"5": 500_000}, "ship_started": 60.0},
    }  # fmt: skip
    back = {"2": {"in": 1, "group_pause_ms": {"3": 5.0}, "loaded": {"8": {"at": 60.25}}}}
    up, down = migration_figures([old, new7, new8, back])
    assert (up.id, up.groups, up.keys, up.bytes) == (1, 4, 100, 4_000_000)
    assert up.transfer_s == pytest.approx(1.0) and up.mb_s == pytest.approx(4.0)
    assert sorted(up.pauses_ms) == [0.0, 10.0, 20.0, 30.0]
    assert up.pause_median_ms == 15.0 and up.pause_max_ms == 30.0
    assert up.waits_ms == [700.0] and down.waits_ms == []
    assert down.bytes == 500_000 and down.mb_s == pytest.approx(2.0)


def test_the_rounds_of_a_stepwise_migration_count_as_one_update():
    r0, r1 = str(round_id(3, 0)), str(round_id(3, 1))
    old = {
        r0: {"out": 2, "keys": 10, "shipped": {"7": 1000}, "ship_started": 10.0, "ship_ms": 4.0},
        r1: {"out": 2, "keys": 10, "shipped": {"7": 1000}, "ship_started": 10.5, "ship_ms": 6.0},
        "3": {"out": 1, "keys": 5, "shipped": {"7": 500}, "ship_started": 11.0, "ship_ms": 2.0},
        "5": {"out": 1, "keys": 5, "shipped": {"9": 500}, "ship_started": 20.0, "ship_ms": 1.0},
    }
    new = {
        r0: {"in": 2, "group_pause_ms": {"0": 1.0, "1": 2.0}, "loaded": {"5": {"at": 10.1}}},
        r1: {"in": 2, "group_pause_ms": {"2": 3.0, "3": 4.0}, "loaded": {"5": {"at": 10.6}}},
        "3": {"in": 1, "group_pause_ms": {"4": 5.0}, "loaded": {"5": {"at": 11.5}}},
    }
    up, down = migration_figures([old, new])
    assert (up.id, up.rounds, up.groups, up.keys, up.bytes) == (3, 3, 5, 25, 2500)
    assert up.ship_ms == 6.0 and up.transfer_s == pytest.approx(1.5)
    assert sorted(up.pauses_ms) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert (down.id, down.rounds, down.groups) == (5, 1, 1)


def test_expected_count_matches_the_source_numbering():
    src = KeyedSource(count=10, keys=4)
    src.open(Context("t", "source", 1, 0, 1))
    rows: list[list] = []
    assert src.next_batch(lambda v, stream="default": rows.append(v), 100) is False
    seen: dict[int, int] = {}
    for k, _, _ in rows:
        seen[k] = seen.get(k, 0) + 1
    assert seen == {k: expected_count(k, 10, 4) for k in range(4)} == {0: 3, 1: 3, 2: 2, 3: 2}
    with pytest.raises(ValueError):
        KeyedSource(keys=0)


def test_flush_count_and_sink_add_up_the_partials():
    count = PaddedFlushCount(pad=16)
    count.open(Context("t", "count", 2, 0, 1, input_fields=["key", "seq", "ts"]))
    sink = RescaleSink()
    out: list[list] = []
    emit = lambda v, stream="default": out.append(v)  # noqa: E731
    count.process_batch([[1, 0, 1.0], [2, 1, 1.0], [1, 2, 1.0]], emit)
    count.on_signal(emit)  # Listing 2: the cache goes downstream and starts again
    count.process_batch([[1, 3, 1.0]], emit)
    count.on_signal(emit)
    sink.process_batch(out, emit)
    r = sink.result()
    assert r["tuples"] == 4 and r["flushed"] == 3 and r["flushed_bytes"] == 3 * 16
    assert r["totals"] == {"1": 3, "2": 1}
    assert r["max"] == {"1": 2, "2": 1}  # the running counts restarted: not the counts
    done = count.result()
    assert done["flushes"] == 2 and done["largest_bytes"] == done["first_bytes"] > 32
    with pytest.raises(ValueError):
        PaddedFlushCount(pad=-1)
