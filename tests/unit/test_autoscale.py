"""Autoscaler decisions (controller/autoscaling/autoscaler.py) on synthetic metric streams
and a fake clock."""

from dataclasses import replace

import pytest

from controller.autoscaling.autoscaler import (
    NodeScaler,
    ScaleSettings,
    WorkerLoad,
    WorkerSample,
    spark_signal,
    worker_signal,
)

S = ScaleSettings(
    queue_high=1000, queue_low=50, up_window_s=3, down_window_s=10, cooldown_s=5,
    min_parallelism=1, max_parallelism=4, max_step=1,
)  # fmt: skip


def run(scaler: NodeScaler, queues, parallelism: int, t0: float = 0.0, dt: float = 0.5):
    """Feed one mean queue depth per tick; return (time, decision) of every decision."""
    out = []
    for i, q in enumerate(queues):
        now = t0 + i * dt
        sig = worker_signal([WorkerSample(q, 10.0, now)], scaler.settings)
        scaler.observe(sig, now)
        d = scaler.decide(parallelism, now)
        if d is not None:
            out.append((now, d))
            if d.target is not None:
                parallelism = d.target
    return out


def test_scale_up_only_after_the_window_holds():
    out = run(NodeScaler("split", S), [5000] * 7, parallelism=2)
    assert len(out) == 1
    at, d = out[0]
    assert at == 3.0 and (d.current, d.target, d.action) == (2, 3, "scale up")
    assert "mean queue 5000" in d.reason and "queue_high 1000" in d.reason


def test_a_break_restarts_the_window():
    # 2.5 s over, one sample below, 2.5 s over: never 3 s in a row
    out = run(NodeScaler("split", S), [5000] * 6 + [500] + [5000] * 6, parallelism=2)
    assert out == []


def test_between_thresholds_nothing_happens():
    assert run(NodeScaler("split", S), [500] * 100, parallelism=2) == []


def test_scale_down_needs_the_longer_window():
    out = run(NodeScaler("split", S), [10] * 25, parallelism=3)
    assert [(t, d.target, d.action) for t, d in out] == [(10.0, 2, "scale down")]


def test_cooldown_after_a_decision():
    out = run(NodeScaler("split", S), [5000] * 40, parallelism=1)
    times = [t for t, _ in out]
    # 3 s window, then cooldown 5 s, then a fresh 3 s window: 3, 11, 19
    assert times == [3.0, 11.0, 19.0]
    assert [d.target for _, d in out] == [2, 3, 4]


def test_max_parallelism_is_a_keep_with_its_reason():
    out = run(NodeScaler("split", S), [5000] * 7, parallelism=4)
    assert len(out) == 1 and out[0][1].target is None
    assert "max_parallelism 4" in out[0][1].reason and out[0][1].action == "keep"


def test_min_parallelism_is_a_keep_once_per_window():
    out = run(NodeScaler("split", S), [10] * 45, parallelism=1)
    assert [t for t, _ in out] == [10.0, 20.5]
    assert all(d.target is None and "min_parallelism 1" in d.reason for _, d in out)


@pytest.mark.parametrize(("queue", "step", "target"), [(5000, 1, 3), (5000, 4, 6), (2500, 4, 5)])
def test_max_step_and_load_size_the_step(queue, step, target):
    s = replace(S, max_step=step, max_parallelism=8)
    out = run(NodeScaler("split", s), [queue] * 7, parallelism=2)
    assert out[0][1].target == target  # ceil(2 x load), at most max_step more


def test_recommend_only_decides_but_says_so():
    s = replace(S, recommend_only=True)
    out = run(NodeScaler("split", s), [5000] * 7, parallelism=2)
    d = out[0][1]
    assert d.recommend_only and d.target == 3 and d.action == "recommend scale up"


def test_reset_restarts_windows_and_cools_down():
    sc = NodeScaler("split", S)
    run(sc, [5000] * 5, parallelism=2)  # 2 s of overload, no decision yet
    sc.reset(2.0)  # someone else's update: cooldown to 7 s, then a full window
    out = run(sc, [5000] * 20, parallelism=3, t0=2.5)
    assert [(t, d.target) for t, d in out] == [(10.0, 4)]


def test_processing_time_threshold():
    s = replace(S, proc_high_us=200, queue_high=0)
    sig = worker_signal([WorkerSample(0, 400, 0), WorkerSample(0, 300, 0)], s)
    assert sig.over and "proc_high_us 200" in sig.reason and sig.load == pytest.approx(1.75)
    sig = worker_signal([WorkerSample(0, 100, 0)], s)
    assert not sig.over and sig.under


def test_idle_needs_both_queue_and_processing_time_when_set():
    s = replace(S, proc_low_us=50)
    assert not worker_signal([WorkerSample(0, 80, 0)], s).under
    assert worker_signal([WorkerSample(0, 20, 0)], s).under


def test_no_samples_no_signal_and_no_decision():
    sc = NodeScaler("split", S)
    assert worker_signal([], S) is None
    sc.observe(None, 0)
    assert sc.decide(2, 100) is None


def test_worker_load_is_windowed_not_since_start():
    load = WorkerLoad()
    # 10000 tuples at 10 us, then 1000 more at 100 us: cumulative average 18.2 us
    load.update({"in": {"0": 5, "1": 10000}, "proc_us": 10.0, "queue": 3}, 1.0)
    s = load.update({"in": {"1": 11000}, "proc_us": (10000 * 10 + 1000 * 100) / 11000}, 2.0)
    assert s.proc_us == pytest.approx(100.0)
    s = load.update({"in": {"1": 11000}, "proc_us": 18.18, "queue": 7}, 3.0)
    assert s.proc_us == pytest.approx(100.0) and s.queue == 7  # idle interval keeps it


def test_spark_behind_when_processed_below_input():
    sig = spark_signal({"input_rows_per_s": 1000, "processed_rows_per_s": 500, "batch_ms": 150},
                       200, S)  # fmt: skip
    assert sig.over and "processed < 0.9 x input" in sig.reason and sig.load == 2.0


def test_spark_behind_when_batch_exceeds_trigger_raw_names():
    p = {"inputRowsPerSecond": 100, "processedRowsPerSecond": 100, "batchDuration": 500}
    sig = spark_signal(p, 200, S)
    assert sig.over and "batch > trigger 200" in sig.reason


def test_spark_idle_and_normal():
    idle = {"input_rows_per_s": 100, "processed_rows_per_s": 120, "batch_ms": 20}
    assert spark_signal(idle, 200, S).under
    ok = {"input_rows_per_s": 100, "processed_rows_per_s": 100, "batch_ms": 150}
    sig = spark_signal(ok, 200, S)
    assert not sig.over and not sig.under
    assert spark_signal({"batch": 3}, 200, S) is None


def test_spark_progress_held_for_a_window_scales_the_node_up():
    sc = NodeScaler("enrich", S)
    behind = {"input_rows_per_s": 1000, "processed_rows_per_s": 400, "batch_ms": 450}
    out = []
    for i in range(10):
        now = i * 0.5
        sc.observe(spark_signal(behind, 200, S), now)
        d = sc.decide(1, now)
        if d:
            out.append((now, d))
    assert [(t, d.target) for t, d in out] == [(3.0, 2)]
