"""``window_aggregate`` against a brute-force reference (hypothesis), without a worker.

The operator runs over a real keyed state (every key group owned) and is fed
tuples interleaved with rising watermarks, as a worker would feed it.  The
reference recomputes every window from the list of tuples: which windows hold a
time, which tuples the watermark made too late, what each window's aggregate is.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from typhoon.operators.base import Context
from typhoon.operators.windowing import WindowSpec, window_starts
from typhoon.operators.windows import LATE_STREAM, WindowAggregate
from typhoon.runtime.keyed_state import KeyedStates

FIELDS = ["key", "ts", "value"]


def make_op(**args) -> WindowAggregate:
    op = WindowAggregate(key="key", time_field="ts", **args)
    keyed = KeyedStates("window_aggregate", "w", 1, [0], 1, {0})
    op.open(
        Context(
            "t",
            "w",
            1,
            0,
            1,
            input_fields=FIELDS,
            operator="window_aggregate",
            keyed=keyed,
            keyed_declared=True,
        )
    )
    return op


def feed(op: WindowAggregate, script: list) -> tuple[list, list]:
    """Run ``script`` (``("t", tuple)`` or ``("w", watermark)``), then +inf.

    Returns the window results as ``(watermark at emission, [key, start, end, value])``
    and the tuples sent to ``late``."""
    out: list = []
    late: list = []
    wm = [-math.inf]

    def emit(values, stream="default"):
        if stream == LATE_STREAM:
            late.append(values)
        else:
            out.append((wm[0], values))

    for kind, item in script + [("w", math.inf)]:
        if kind == "t":
            op.process(list(item), emit)
        else:
            wm[0] = max(wm[0], item)
            op.on_watermark(wm[0], emit)
    return out, late


def aggregate(name: str, values: list):
    if name == "count":
        return len(values)
    if name == "sum":
        return sum(values)
    if name == "min":
        return min(values)
    if name == "max":
        return max(values)
    if name == "avg":
        return sum(values) / len(values)
    return len(set(values))


def reference(script: list, size, slide, lateness, agg) -> tuple[dict, list]:
    """Final value per (key, start, end) and the tuples beyond the lateness."""
    slide = slide or size
    wm = -math.inf
    members: dict = defaultdict(list)
    late = []
    for kind, item in script:
        if kind == "w":
            wm = max(wm, item)
            continue
        key, ts, value = item
        starts = [s for s in window_starts(ts, size, slide) if s + size + lateness > wm]
        # brute force: every multiple of slide whose window holds ts
        every = [
            s for s in range(int(ts // slide) * slide - size, ts + 1, slide) if s <= ts < s + size
        ]
        assert sorted(starts) == sorted(s for s in every if s + size + lateness > wm)
        if not starts:
            late.append(item)
        for s in starts:
            members[(key, s, s + size)].append(value)
    return {w: aggregate(agg, vs) for w, vs in members.items()}, late


events = st.lists(
    st.one_of(
        st.tuples(
            st.just("t"), st.tuples(st.sampled_from("abc"), st.integers(0, 300), st.integers(-5, 9))
        ),
        st.tuples(st.just("w"), st.integers(0, 320)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    script=events,
    shape=st.sampled_from([(10, None), (10, 5), (12, 4), (7, 7), (1, None)]),
    lateness=st.sampled_from([0, 5, 30]),
    agg=st.sampled_from(["count", "sum", "min", "max", "avg", "distinct"]),
)
def test_tumbling_and_sliding_match_brute_force(script, shape, lateness, agg):
    size, slide = shape
    op = make_op(
        size_ms=size, slide_ms=slide, aggregate=agg, field="value", allowed_lateness_ms=lateness
    )
    out, late = feed(op, script)
    want, want_late = reference(script, size, slide, lateness, agg)
    final = {}
    for wm, (key, start, end, value) in out:
        assert wm >= end, "a window was emitted before the watermark passed its end"
        final[(key, start, end)] = value
    assert final == pytest.approx(want)
    assert [v[3] for v in late] == [list(t) for t in want_late]
    assert [v[1] for v in late] == [t[1] for t in want_late]
    # each window once when complete, then once per tuple it took within the lateness
    assert not op.state.data, "+inf leaves no window open"


def in_order(draw_list: list, disorder: int) -> list:
    """Tuples with bounded disorder, each after the watermark max-time - disorder."""
    script = []
    high = -math.inf
    for key, ts, value in draw_list:
        script.append(("t", (key, ts, value)))
        high = max(high, ts)
        script.append(("w", high - disorder))
    return script


@settings(max_examples=300, deadline=None)
@given(
    base=st.lists(
        st.tuples(st.sampled_from("ab"), st.integers(0, 200), st.integers(0, 9)), max_size=40
    ),
    gap=st.sampled_from([1, 5, 20]),
    agg=st.sampled_from(["count", "sum", "max"]),
)
def test_sessions_match_merged_intervals(base, gap, agg):
    disorder = 50
    # bounded disorder: sort, then let each time move back at most `disorder`
    rows = sorted(base, key=lambda r: r[1])
    script = in_order(rows, disorder)
    op = make_op(gap_ms=gap, aggregate=agg, field="value")
    out, late = feed(op, script)
    assert late == []
    sessions = []  # brute force: [start, end) = union of [ts, ts + gap) per key
    for key in "ab":
        spans = sorted((ts, ts + gap, v) for k, ts, v in rows if k == key)
        cur = None
        for s, e, v in spans:
            if cur is not None and s < cur[2]:
                cur[2] = max(cur[2], e)
                cur[3].append(v)
            else:
                cur = [key, s, e, [v]]
                sessions.append(cur)
    want = sorted([k, s, e, aggregate(agg, vs)] for k, s, e, vs in sessions)
    got = sorted(v for _, v in out)
    assert got == want  # each session exactly once
    for wm, (_, _, end, _) in out:
        assert wm >= end


def test_late_tuple_within_lateness_updates_then_beyond_goes_to_late():
    op = make_op(size_ms=10, aggregate="count", allowed_lateness_ms=5)
    script = [
        ("t", ("a", 1, 0)),
        ("t", ("a", 3, 0)),
        ("w", 10),
        ("t", ("a", 4, 0)),
        ("w", 15),
        ("t", ("a", 5, 0)),
        ("t", ("a", 12, 0)),
    ]
    out, late = feed(op, script)
    assert [v for _, v in out] == [["a", 0, 10, 2], ["a", 0, 10, 3], ["a", 10, 20, 1]]
    assert late == [["a", 5, 5, ["a", 5, 0]]]
    assert op.metrics()["window_late"] == 1


def test_bad_times_and_values_are_counted_drops():
    op = make_op(size_ms=10, aggregate="sum", field="value")
    out, late = feed(
        op,
        [
            ("t", ("a", "x", 1)),
            ("t", ("a", None, 1)),
            ("t", ("a", True, 1)),
            ("t", ("a", math.nan, 1)),
            ("t", ("a", 1, "9")),
            ("t", ("a", 2, 4)),
        ],
    )
    assert [v for _, v in out] == [["a", 0, 10, 4]]
    assert op.metrics()["window_bad_time"] == 4
    assert op.metrics()["window_bad_value"] == 1
    assert late == []


def test_window_state_is_keyed_and_survives_snapshot():
    op = make_op(size_ms=10, aggregate="avg", field="value")
    feed_rows = [("t", ("a", 1, 2)), ("t", ("b", 2, 4)), ("w", 5)]
    out, _ = feed(op, feed_rows[:2])  # ends with +inf: both emitted
    assert sorted(v for _, v in out) == [["a", 0, 10, 2.0], ["b", 0, 10, 4.0]]
    op2 = make_op(size_ms=10, aggregate="avg", field="value")
    emitted = []
    op2.process(["a", 1, 2], lambda v, s="default": emitted.append(v))
    packed = op2.context.keyed.pack()
    state = op2.snapshot()
    op3 = make_op(size_ms=10, aggregate="avg", field="value")
    op3.context.keyed.restore(packed)
    op3.restore(state)
    op3.on_watermark(10, lambda v, s="default": emitted.append(v))
    assert emitted == [["a", 0, 10, 2.0]]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (WindowSpec(), "has neither"),
        (WindowSpec(size=10, slide=20), "slide_ms 20 is larger than size_ms 10"),
        (WindowSpec(size=10, gap=5), "not both"),
        (WindowSpec(slide=5, gap=5), "slide_ms needs size_ms"),
        (WindowSpec(size=0), "positive"),
        (WindowSpec(size=10, aggregate="median"), "aggregate must be one of"),
        (WindowSpec(size=10, lateness=-1), "at least 0"),
    ],
)
def test_spec_problems(spec, problem):
    assert problem in spec.problem()


def test_window_starts():
    assert window_starts(7, 10, 10) == [0]
    assert window_starts(7, 10, 5) == [5, 0]
    assert window_starts(-3, 10, 5) == [-5, -10]
    assert window_starts(10, 10, 10) == [10]


def test_validate_refuses_a_bad_window_with_exit_2():
    """The loader's sentence, as ``typhoon validate`` prints it, and exit code 2."""
    import subprocess
    import sys
    from pathlib import Path

    bad = Path(__file__).parent / "fixtures" / "topologies" / "bad"
    cli = [sys.executable, "-m", "typhoon_cli", "validate", "window_slide_larger_than_size.yaml"]
    done = subprocess.run(cli, cwd=bad, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    want = (bad / "window_slide_larger_than_size.expected").read_text().strip()
    assert done.stderr.strip() == f"error: {want}"


def test_validate_shows_a_spouts_watermark():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cli = [sys.executable, "-m", "typhoon_cli", "validate", "topologies/windows.yaml"]
    done = subprocess.run(cli, cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    spout = next(line for line in done.stdout.splitlines() if "spout events" in line)
    assert "watermark={'time_field': 'ts', 'out_of_order_ms': 200" in spout
