"""Per-tuple service time of ``split_words`` and ``busy`` (scenario bottlenecks)."""

from __future__ import annotations

import time

import pytest

from typhoon.operators import resolve_operator
from typhoon.operators.base import Context
from typhoon.operators.transforms import Busy, ServiceTime, SplitWords


def words_of(op: SplitWords, sentence: str) -> list[list]:
    out: list[list] = []
    op.process([sentence], lambda values, stream="default": out.append(values))
    return out


def test_split_words_without_cost_is_unchanged_and_does_not_sleep(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    op = resolve_operator("split_words")()
    assert words_of(op, "a b  c") == [["a"], ["b"], ["c"]]
    assert slept == [] and op.args == {"cost_us": 0.0}


def test_split_words_cost_sets_its_service_rate():
    op = SplitWords(cost_us=2000)
    t0 = time.perf_counter()
    for _ in range(100):
        assert words_of(op, "one two") == [["one"], ["two"]]
    took = time.perf_counter() - t0
    # 100 sentences at 2 ms: at least 0.2 s minus the last step's sub-millisecond debt
    assert 0.199 <= took < 1.0, took


@pytest.mark.parametrize("bad", [-1, "5", None, True, [100]])
def test_split_words_refuses_a_bad_cost(bad):
    with pytest.raises(ValueError, match="cost_us must be a non-negative number"):
        SplitWords(cost_us=bad)


@pytest.mark.parametrize("bad", [-0.5, "100", True])
def test_busy_refuses_a_bad_cost_with_the_same_message(bad):
    with pytest.raises(ValueError, match="cost_us must be a non-negative number"):
        Busy(cost_us=bad)


def test_service_time_pays_debt_in_steps_of_a_millisecond(monkeypatch):
    slept: list[float] = []
    clock = [0.0]

    def fake_sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s * 1.5  # oversleeps by half: the debt must go negative and catch up

    monkeypatch.setattr(time, "sleep", fake_sleep)
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    service = ServiceTime(0.0004)
    for _ in range(10):
        service.pay()
    # 4 ms owed over 10 tuples, paid in sleeps of >= 1 ms; oversleeping is carried over
    assert slept and all(s >= 0.001 for s in slept)
    assert clock[0] + service.debt == pytest.approx(0.004)
    assert service.debt < 0.001


def test_busy_slow_worker_pays_its_factor():
    op = Busy(cost_us=100, slow_index=1, slow_factor=3)
    op.open(Context("t", "work", worker_id=5, index=1, parallelism=2))
    assert op.service.cost == pytest.approx(300e-6)
