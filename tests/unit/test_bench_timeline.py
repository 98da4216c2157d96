"""Throughput over time (benchmarks/timeline.py) and the fault detector's crash test."""

from __future__ import annotations

import pytest

from benchmarks.timeline import CounterLog, cv, dip, mean_rate, tick_rates
from controller.recovery.fault_detector import crashed


def test_counter_log_interpolates_sums_workers_and_skips_repeats():
    log = CounterLog()
    for t, v in [(0.0, 0), (1.0, 100), (1.0, 100), (2.0, 300)]:
        log.add("a", t, v)
    log.add("b", 0.5, 0)
    log.add("b", 2.5, 200)
    assert log.samples["a"] == [(0.0, 0), (1.0, 100), (2.0, 300)]
    assert log.value_at("a", 1.5) == pytest.approx(200)
    assert log.value_at("a", 9.0) == 300  # after the last report: the last value
    assert log.value_at("b", 0.0) == 0  # before its first report: nothing yet
    assert log.first_time(["a", "b"]) == 0.5 and log.last_time(["a", "b"]) == 2.0
    rates = log.rates(0.5, 2.0, 0.5)
    assert [t for t, _ in rates] == [0.5, 1.0, 1.5]
    # a: 50, 100, 100 tuples per half second; b: 50 per half second
    assert [r for _, r in rates] == pytest.approx([200, 300, 300])


def test_tick_rates_bins_whole_ticks_and_counts_empty_ticks_as_zero():
    timeline = {"10": 5, "11": 5, "13": 10}  # ticks of 0.1 s
    rates = tick_rates(timeline, 0.1, 1.0, 1.4, 0.2)
    assert [round(t, 6) for t, _ in rates] == [1.0, 1.2]
    assert [r for _, r in rates] == pytest.approx([50, 50])


def test_mean_cv_and_dip():
    series = [(0.0, 100.0), (1.0, 100.0), (2.0, 40.0), (3.0, 0.0), (4.0, 90.0), (5.0, 110.0)]
    assert mean_rate(series, 0, 2) == 100
    assert mean_rate(series, 10, 20) is None
    assert cv(series, 0, 2) == 0
    assert cv([(0.0, 50.0), (1.0, 150.0)], 0, 2) == pytest.approx(0.5)
    d = dip(series, 2.0, 100.0, 1.0)
    assert d.below_s == 2.0  # 40 and 0 are under 80
    assert d.recovered_s == 2.0  # the last low bin ends 2 s after the disturbance
    assert d.deficit == pytest.approx(60 + 100 + 10 - 10)
    assert dip(series, 4.0, 100.0, 1.0).recovered_s is None


@pytest.mark.parametrize(
    ("state", "code", "expected"),
    [("exited", -9, True), ("exited", 1, True), ("exited", 0, False),
     ("exited", None, False), ("running", None, False)],
)  # fmt: skip
def test_crashed_only_for_an_error_exit(state, code, expected):
    assert crashed(state, code) is expected
