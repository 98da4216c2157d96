"""Weights of a balanced node from metrics and switch counters
(controller.load_balancing.balancer)."""

from __future__ import annotations

import pytest

from controller.load_balancing.balancer import (
    MAX_TRIMS,
    LbSettings,
    NodeBalancer,
    normalize,
    tuples_in,
)

FAST, FAST2, SLOW = 3, 4, 5


def metrics(n: int, proc_us: float, queue: int = 0) -> dict:
    return {"in": {"1": n, "0": 1}, "proc_us": proc_us, "queue": queue}


def feed(nb: NodeBalancer, t: float, counts: dict[int, int], service: dict[int, float], q=None):
    """METRIC_RESPs as the workers send them: running average over all their tuples."""
    for wid, n in counts.items():
        nb.on_metrics(wid, metrics(n, service[wid], (q or {}).get(wid, 0)), t)


def steady(nb: NodeBalancer, service: dict[int, float], seconds: int = 4, start: float = 0.0):
    """Each worker busy all the time at its own speed, one METRIC_RESP a second."""
    for s in range(seconds + 1):
        counts = {wid: int(s * 1e6 / us) for wid, us in service.items()}
        feed(nb, start + s, counts, service)


@pytest.fixture
def nb() -> NodeBalancer:
    b = NodeBalancer("app", "work", LbSettings(min_tuples=100))
    b.set_members([FAST, FAST2, SLOW])
    return b


def test_tuples_in_leaves_out_end_of_stream():
    assert tuples_in({"in": {"0": 3, "1": 10, "2": 5}}) == 15


def test_first_decision_installs_equal_shares_before_any_metrics(nb):
    d = nb.decide(0.0)
    assert d.install == pytest.approx({FAST: 1 / 3, FAST2: 1 / 3, SLOW: 1 / 3})
    assert "workers changed" in d.reason


def test_slow_worker_gets_its_share_of_the_service_rate(nb):
    nb.decide(0.0)
    steady(nb, {FAST: 150, FAST2: 150, SLOW: 450})
    d = nb.decide(5.0)
    assert d.install is not None
    assert d.install[SLOW] == pytest.approx(1 / 7, abs=0.005)
    assert d.install[FAST] == pytest.approx(3 / 7, abs=0.005)
    assert "moved" in d.reason and "w5 450us/tuple" in d.reason


def test_window_average_is_recovered_from_running_averages(nb):
    # 1000 tuples at 100 us, then 1000 more at 300 us: the running average says 200,
    # the second window's own average is 300
    nb.on_metrics(SLOW, metrics(1000, 100.0), 1.0)
    nb.on_metrics(SLOW, metrics(2000, 200.0), 2.0)
    assert nb.workers[SLOW].service_us == pytest.approx(300.0)
    assert nb.workers[SLOW].rate == pytest.approx(1000.0)


def test_small_windows_accumulate_until_min_tuples(nb):
    nb.on_metrics(SLOW, metrics(1000, 100.0), 1.0)
    nb.on_metrics(SLOW, metrics(1050, 110.0), 2.0)  # 50 < 100 tuples: no estimate yet
    assert nb.workers[SLOW].service_us is None
    nb.on_metrics(SLOW, metrics(1200, 120.0), 3.0)
    assert nb.workers[SLOW].service_us == pytest.approx((120 * 1200 - 100_000) / 200)


def test_small_moves_keep_the_installed_weights(nb):
    nb.decide(0.0)
    steady(nb, {FAST: 150, FAST2: 150, SLOW: 450})
    nb.decide(5.0)
    steady(nb, {FAST: 150, FAST2: 160, SLOW: 450}, start=10.0)
    d = nb.decide(15.0)
    assert d.install is None and d.reason.startswith("kept")


def test_queued_work_lowers_a_weight(nb):
    nb.decide(0.0)
    service = {FAST: 150, FAST2: 150, SLOW: 150}
    steady(nb, service)
    feed(nb, 5.0, {w: int(5 * 1e6 / 150) for w in service}, service, q={FAST: 60_000})
    d = nb.decide(5.0)
    assert d.target[FAST] < 0.2 and "queue 60000" in d.reason


def test_port_drops_and_port_down(nb):
    nb.decide(0.0)
    steady(nb, {FAST: 150, FAST2: 150, SLOW: 150})
    nb.on_port(FAST, 0)
    nb.on_port(FAST, 25)
    d = nb.decide(5.0)
    assert d.target[FAST] == pytest.approx(0.2) and "port dropped 25" in d.reason
    nb.on_port(SLOW, 25, up=False)
    d = nb.decide(10.0)
    assert SLOW not in d.target and "port down: w5" in d.reason


def test_hash_skew_is_trimmed_a_few_times_in_a_row_at_most(nb):
    nb.settings = LbSettings(min_tuples=100, min_frames=100, settle_s=1.0, trim=True)
    nb.decide(0.0)
    steady(nb, {FAST: 150, FAST2: 150, SLOW: 450})
    nb.decide(5.0)  # installs 3/7, 3/7, 1/7
    nb.on_buckets({FAST: 0, FAST2: 0, SLOW: 0}, 5.5)  # too soon after the change: ignored
    assert nb.baseline is None
    nb.on_buckets({FAST: 0, FAST2: 0, SLOW: 0}, 7.0)
    nb.on_buckets({FAST: 400, FAST2: 400, SLOW: 200}, 9.0)  # the slow one got 20 %, not 14
    assert nb.achieved()[SLOW] == pytest.approx(0.2)
    warning = nb.split_warning()
    assert warning is None  # 5.7 points: under the 10-point warning
    d = nb.decide(10.0)
    assert d.install is not None and d.install[SLOW] < 1 / 7
    assert "hash skew" in d.reason or "off the configured" in d.reason
    assert nb.workers[SLOW].trim < 1.0 < nb.workers[FAST].trim


def test_split_warning_past_ten_points(nb):
    nb.settings = LbSettings(trim=False, min_frames=100, settle_s=0.0)
    nb.installed = {FAST: 0.45, FAST2: 0.45, SLOW: 0.10}
    nb.changed_at = 0.0
    nb.on_buckets({FAST: 0, FAST2: 0, SLOW: 0}, 1.0)
    nb.on_buckets({FAST: 300, FAST2: 300, SLOW: 400}, 2.0)
    assert "30.0 points apart" in nb.split_warning()
    report = nb.report()
    assert report["difference_points"] == 30.0 and report["frames_counted"] == 1000


def test_counter_reset_starts_a_new_window(nb):
    nb.settings = LbSettings(settle_s=0.0)
    nb.on_buckets({FAST: 100, SLOW: 100}, 1.0)
    nb.on_buckets({FAST: 200, SLOW: 150}, 2.0)
    assert nb.frames_counted() == 150
    nb.on_buckets({FAST: 10, SLOW: 10}, 3.0)  # group re-created: counters went back
    assert nb.frames_counted() == 0


def test_normalize_floor():
    shares = normalize({1: 100.0, 2: 100.0, 3: 0.0}, floor=0.02)
    assert shares[3] == pytest.approx(0.02) and sum(shares.values()) == pytest.approx(1.0)
    assert normalize({1: 0, 2: 0}) == {1: 0.5, 2: 0.5}


def test_members_leaving_are_forgotten(nb):
    nb.set_members([FAST, SLOW])
    assert set(nb.workers) == {FAST, SLOW}
    d = nb.decide(0.0)
    assert set(d.install) == {FAST, SLOW}


def test_trims_stop_after_max_trims(nb):
    nb.settings = LbSettings(min_tuples=100, min_frames=100, settle_s=0.0, trim=True)
    nb.decide(0.0)
    steady(nb, {FAST: 150, FAST2: 150, SLOW: 450})
    nb.decide(5.0)
    t = 5.0
    installs = 0
    for _ in range(MAX_TRIMS + 2):  # the switch keeps giving the slow worker 20 %
        t += 1.0
        nb.on_buckets({FAST: 0, FAST2: 0, SLOW: 0}, t)
        nb.on_buckets({FAST: 400, FAST2: 400, SLOW: 200}, t + 0.5)
        installs += nb.decide(t + 1.0).install is not None
        t += 1.0
    assert installs == MAX_TRIMS


def test_report_takes_closed_windows_while_the_current_one_is_short(nb):
    nb.settings = LbSettings(min_tuples=100, min_frames=100, settle_s=0.0, trim=False)
    nb.decide(0.0)
    steady(nb, {FAST: 150, FAST2: 150, SLOW: 450})
    nb.decide(5.0)  # 3/7, 3/7, 1/7
    nb.on_buckets({FAST: 0, FAST2: 0, SLOW: 0}, 5.5)
    nb.on_buckets({FAST: 42, FAST2: 44, SLOW: 14}, 6.0)
    nb.workers[SLOW].queue = 20000  # the queue term moves the weights again
    d = nb.decide(7.0)
    assert d.install is not None and d.install[SLOW] < 0.1
    nb.on_buckets({FAST: 0, FAST2: 0, SLOW: 0}, 7.5)  # a new window: 50 frames so far
    nb.on_buckets({FAST: 24, FAST2: 24, SLOW: 2}, 8.0)
    report = nb.report()
    assert report["windows"] == 2 and report["frames_counted"] == 150
    # what the 150 frames should have split as: 100 at 3/7, 3/7, 1/7 and 50 at the new shares
    want = {k: (100 * 3 / 7 + 50 * d.install[k]) / 150 for k in (FAST, FAST2)}
    assert report["configured"][str(FAST)] == pytest.approx(want[FAST], abs=1e-4)
    assert report["achieved"] == {"3": 0.44, "4": 0.4533, "5": 0.1067}
    assert report["installed"] == {str(k): round(v, 4) for k, v in d.install.items()}
    nb.on_buckets({FAST: 60, FAST2: 60, SLOW: 10}, 8.5)  # the current window alone is enough
    report = nb.report()
    assert report["windows"] == 1 and report["frames_counted"] == 130
    assert report["configured"] == report["installed"]
