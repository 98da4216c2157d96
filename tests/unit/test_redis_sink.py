"""The pure parts of ``redis_stream_sink``: which tuple values a stream entry can carry,
the dead letter's JSON, the arguments; and the commit timing every transactional sink
reports (the real server: tests/connectors/test_redis_sink_server.py)."""

from __future__ import annotations

import json

import pytest

from typhoon.operators import resolve_operator
from typhoon.operators.connectors import CommitTiming
from typhoon.operators.redis_sink import encode_row, encode_value, json_row


def test_values_a_stream_entry_carries_and_the_ones_it_does_not():
    assert encode_value("ü") == "ü".encode()
    assert encode_value(b"\xff") == b"\xff"
    assert encode_value(12) == b"12" and encode_value(0.1) == b"0.1"
    for bad in (None, True, [1], {"a": 1}, float("nan"), float("inf"), "\ud800"):
        assert encode_value(bad) is None, bad
    assert encode_row(["w", "n"], ["a", 3]) == ({"w": b"a", "n": b"3"}, "")
    assert encode_row(["w", "n"], ["a"]) == (None, "wrong_fields")
    assert encode_row(["w", "n"], ["a", None]) == (None, "wrong_type")


def test_a_dead_letter_row_is_always_json():
    assert json.loads(json_row(["a", float("nan"), b"x"])) == ["a", "nan", "b'x'"]
    assert json.loads(json_row([[float("inf")]])) == "[[inf]]"


def test_redis_stream_sink_arguments_are_checked():
    sink = resolve_operator("redis_stream_sink")
    with pytest.raises(ValueError, match="url"):
        sink(url="http://x", stream="s")
    with pytest.raises(ValueError, match="stream"):
        sink(url="redis://h:1/0", stream="")
    with pytest.raises(ValueError, match="distinct"):
        sink(url="redis://h:1/0", stream="s", fields=["a", "a"])
    with pytest.raises(ValueError, match="maxlen"):
        sink(url="redis://h:1/0", stream="s", maxlen=0)
    with pytest.raises(ValueError, match="dead_letter"):
        sink(url="redis://h:1/0", stream="s", dead_letter="")


def test_commit_timing_measures_calls_and_anchor_to_visible():
    t = CommitTiming()
    assert t.metrics() == {}
    for s in (0.3, 0.1, 0.2):
        t.took(s)
    t.closed(1)
    t.closed(2)
    t.committed([1, 2, 7])  # 7 was closed by an earlier instance: no time for it
    m = t.metrics()
    assert (m["sink_commit_s_p50"], m["sink_commit_s_max"]) == (0.2, 0.3)
    assert 0 <= m["sink_visible_s_p50"] <= m["sink_visible_s_max"] < 5
    assert len(t.visible_s) == 2
    t.KEEP = 2
    t.took(9.0)
    assert t.commit_s == [0.2, 9.0]
