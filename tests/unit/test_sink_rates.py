"""The sinks' recovery after a failure (typhoon/sink_rates.py), and the fault
machine putting it into the incident: pure, with a fake clock."""

from __future__ import annotations

import pytest
from test_fault_detector_machine import APP, ROOT, ids, machine_for

from typhoon.sink_rates import (
    Progress,
    SinkWatch,
    back_at,
    baseline,
    data_in,
    downstream_sinks,
    horizon,
    lowest_ratio,
    window_rate,
)
from typhoon.topology import load_topology

T0 = 1000.0


def feed(p: Progress, rate, start: float, end: float, dt: float = 0.25, counter: int = 0) -> int:
    """Replies every ``dt`` from ``start`` to ``end`` of a worker taking in ``rate(t)``
    tuples/s; its counter at the end."""
    t = start
    while t <= end + 1e-9:
        p.add(t, counter)
        counter += int(rate(t) * dt)
        t += dt
    return counter


def test_progress_interpolates_and_never_goes_back():
    p = Progress()
    p.add(0.0, 100)
    p.add(1.0, 300)
    assert p.at(0.5) == 100 and p.at(-1) == 0 and p.at(5) == 200  # first reply is the start
    assert p.at(0.5) == pytest.approx(100)
    p.add(2.0, 50)  # restored counter: adds nothing ...
    p.add(3.0, 250)
    assert p.at(2.0) == 200 and p.at(3.0) == 200  # ... until it goes past 300 again
    p.add(4.0, 400)
    assert p.at(4.0) == 300 and p.at(3.5) == pytest.approx(250)


def test_a_reply_after_a_long_silence_counts_from_then():
    p = Progress()
    p.add(0.0, 0)
    p.add(1.0, 100)
    p.add(5.0, 500)  # silent for 4 s
    assert p.at(4.9) == 100 and p.at(5.0) == 500


def test_data_in_leaves_out_the_control_stream_and_garbage():
    assert data_in({"in": {"0": 7, "1": 10, "2": 5}}) == 15
    assert data_in({"in": {"1": "x", "2": 3}}) == 3
    assert data_in({"out": {}}) is None and data_in({"in": [1]}) is None


def test_a_sink_that_stopped_for_two_seconds_is_back_after_them():
    a, b = Progress(), Progress()
    feed(a, lambda t: 1000, T0 - 8, T0 + 10)
    # b stops at the failure and takes up again 2 s later
    feed(b, lambda t: 0 if T0 <= t < T0 + 2 else 1000, T0 - 8, T0 + 10)
    assert baseline([a, b], T0) == pytest.approx(2000, rel=0.02)
    back = back_at([a, b], T0)
    # the first whole second at >= 1600/s starts 1.6 s in (0.4 s of b's second missing)
    assert back.after_s == pytest.approx(1.6, abs=0.15)
    assert back.lowest == pytest.approx(1000, rel=0.05)
    assert back.before == pytest.approx(2000, rel=0.02)


def test_no_dip_is_back_at_once_and_a_dead_sink_never():
    a = Progress()
    feed(a, lambda t: 500, T0 - 6, T0 + 3)
    assert back_at([a], T0).after_s == 0.0
    dead = Progress()
    feed(dead, lambda t: 500 if t < T0 else 0, T0 - 6, T0 + 20)
    back = back_at([dead], T0)
    assert back.after_s is None and back.lowest == 0 and back.judged > 0


def test_windows_past_the_horizon_are_not_judged():
    a, late = Progress(), Progress()
    n = feed(a, lambda t: 0 if t < T0 + 1 else 1000, T0 - 6, T0 + 2)
    feed(late, lambda t: 1000, T0 - 6, T0 + 0.5)  # its replies stop: it holds back ...
    assert horizon([a, late]) == pytest.approx(T0 + 0.5)
    assert back_at([a, late], T0).judged == 0
    assert back_at([a, late], T0, until=T0 + 2).judged > 0
    feed(a, lambda t: 1000, T0 + 2.25, T0 + 3, counter=n)  # ... until STALE_S behind
    assert horizon([a, late]) == pytest.approx(T0 + 3)


def test_a_later_call_resumes_where_the_last_left_off():
    a = Progress()
    feed(a, lambda t: 0 if T0 <= t < T0 + 3 else 1000, T0 - 6, T0 + 2)
    first = back_at([a], T0)
    assert first.after_s is None and first.judged > 0 and first.lowest == 0
    feed(a, lambda t: 0 if t < T0 + 3 else 1000, T0 + 2.25, T0 + 8, counter=int(a.raw))
    again = back_at([a], T0, since=first)
    whole = back_at([a], T0)
    assert again.after_s == whole.after_s and again.after_s == pytest.approx(2.8, abs=0.15)
    assert again.lowest == 0


def test_no_baseline_without_a_whole_window_or_any_flow():
    a = Progress()
    feed(a, lambda t: 1000, T0 - 0.5, T0 + 3)
    assert back_at([a], T0) is None
    idle = Progress()
    feed(idle, lambda t: 0, T0 - 5, T0 + 3)
    assert back_at([idle], T0) is None and back_at([], T0) is None


def test_lowest_ratio_and_window_rate():
    a = Progress()
    feed(a, lambda t: 500 if T0 + 1 <= t < T0 + 2 else 1000, T0 - 2, T0 + 4)
    assert window_rate([a], T0 - 1, T0) == pytest.approx(1000, rel=0.01)
    assert lowest_ratio([a], T0, T0 + 3, 1000) == pytest.approx(0.5, abs=0.03)
    assert lowest_ratio([a], T0, T0 + 0.5, 1000) is None
    assert lowest_ratio([a], T0, T0 + 3, 0) is None


def test_downstream_sinks():
    wc = load_topology(ROOT / "topologies" / "wordcount.yaml")
    assert downstream_sinks(wc, "source") == {"count"} == downstream_sinks(wc, "count")
    pipes = load_topology(ROOT / "topologies" / "pipelines.yaml")
    assert downstream_sinks(pipes, "split_2") == {"count_2"}


def test_the_incident_says_when_the_sinks_were_back():
    machine, core, clock, physical = machine_for(
        load_topology(ROOT / "topologies" / "wordcount.yaml")
    )
    counts, splits = ids(physical, "count"), ids(physical, "split")
    sent = {w: 0 for w in counts + splits}

    def report(rate_of) -> None:
        for w in sent:
            sent[w] += int(rate_of(w) * 0.25)
            machine.metrics(APP, w, {"in": {"0": 3, "1": sent[w]}}, clock.now)
        clock.now += 0.25

    for _ in range(24):  # 6 s at 1000/s into each count worker
        report(lambda w: 1000)
    machine.worker_down(APP, splits[0], "h1", 11, "deleted", clock.now)
    (incident,) = machine.incidents
    for _ in range(8):  # the count workers at half their rate for 2 s
        report(lambda w: 500)
        machine.tick()
    assert incident.sinks == ["count"] and incident.back_at_80_ms is None
    assert incident.sink_rate_before == pytest.approx(4000, rel=0.02)
    assert incident.sink_rate_lowest == pytest.approx(2000, rel=0.05)
    for _ in range(12):
        report(lambda w: 1000)
        machine.tick()
    # half rate over [detection - 0.25, detection + 1.75): 1 s windows from 1.35 s on
    assert incident.back_at_80_ms == pytest.approx(1400, abs=150)
    d = incident.to_dict()
    assert d["back_at_80_ms"] == incident.back_at_80_ms and d["sinks"] == ["count"]


def test_the_baseline_waits_until_every_sink_replied_past_the_detection():
    """Judged right at the detection, the baseline's last window would be read flat past
    the sinks' last replies (a rate too low, and the sinks then "back" at once): the watch
    says nothing until every sink has replied since, and keeps no answer from before."""
    watch = SinkWatch()
    for t in range(11):
        watch.note("app", 1, "sink", {"in": {"1": 500 * t}}, float(t))
        watch.note("app", 2, "sink", {"in": {"1": 500 * t}}, float(t) + 0.5)
    assert watch.judge("app", {"sink"}, 10.2, 10.5) is None  # worker 1 last replied at 10
    assert watch.pending == {}
    watch.note("app", 1, "sink", {"in": {"1": 5000}}, 11.0)  # stalled since the failure
    back = watch.judge("app", {"sink"}, 10.2, 11.0)
    assert back is not None and back.before == 1000.0 and back.after_s is None
