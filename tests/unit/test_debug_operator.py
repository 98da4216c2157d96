"""Custom debug logic: a user bolt over the records a session shows (typhoon.debug.operator)."""

from __future__ import annotations

import socket
from typing import ClassVar

import pytest
from socketport import Port
from test_debug_worker import frame, run_worker, spec

from typhoon.debug import worker as dw
from typhoon.debug.examples import Tally
from typhoon.debug.operator import DebugOperator, load_bolt
from typhoon.operators import Bolt, OperatorError, Spout

HERE = __name__


class Upper(Bolt):
    fields: ClassVar[tuple[str, ...]] = ("upper", "length")

    def process(self, values, emit):
        if values[0] == "boom":
            raise ValueError("no boom here")
        emit([values[0].upper(), len(values[0])])
        if values[0] == "twice":
            emit([{1, 2}], stream="odd")  # a set has no JSON form: shown as its repr


class NeedsArgs(Bolt):
    def __init__(self, factor):
        super().__init__(factor=factor)


class Source(Spout):
    pass


def record(word: str, **kw) -> dict:
    base = {"time": 1.0, "src": 2, "src_label": "split[0]", "dst": 4, "dst_label": "count[0]",
            "stream": 2, "seq": 0, "fields": {"word": word}, "values": [word]}  # fmt: skip
    return {**base, **kw}


def test_the_bolt_output_replaces_the_tuples_and_errors_are_counted():
    op = DebugOperator.load(f"{HERE}:Upper", "wc", "s1")
    raw = {"time": 1.0, "raw": "Ether / IP", "len": 60}
    out = op.run([record("ab"), record("boom"), raw, record("twice")])
    assert [r.get("values") for r in out] == [["AB", 2], None, ["TWICE", 5], ["{1, 2}"]]
    assert out[1] is raw  # a raw frame is not a tuple: shown as it was
    assert out[0]["fields"] == {"upper": "AB", "length": 2}
    assert out[0]["dst_label"] == "op:Upper" and out[0]["src_label"] == "split[0]"
    assert out[0]["dst"] is None and "op_stream" not in out[0] and out[3]["op_stream"] == "odd"
    assert op.stats() == {"op_tuples": 3, "op_emitted": 3, "op_errors": 1,
                          "op_error": "ValueError: no boom here"}  # fmt: skip


def test_tally_counts_per_first_value():
    op = DebugOperator.load("typhoon.debug.examples:Tally", "wc", "s1")
    out = op.run([record("a"), record("b"), record("a"), record("x", values=[[1], 2])])
    assert [r["values"] for r in out] == [["a", 1], ["b", 1], ["a", 2], [[1], 1]]
    assert out[0]["fields"] == {"value": "a", "seen": 1}
    assert load_bolt("typhoon.debug.examples:Tally") is Tally


@pytest.mark.parametrize(
    "name, message",
    [
        ("nosuch_module_x:C", "cannot import module 'nosuch_module_x'"),
        (f"{HERE}:Missing", "is not a Spout or Bolt class"),
        ("typhoon.debug.filter:parse", "is a function"),
        (f"{HERE}:Source", "is a spout, not a bolt"),
        (f"{HERE}:NeedsArgs", "cannot be built without arguments"),
        ("running_count", "failed to open"),  # keyed: it needs the framework's keyed state
        ("nope", "unknown operator 'nope'"),
    ],
)
def test_bad_operators_are_one_sentence(name, message):
    with pytest.raises(OperatorError, match=message) as e:
        DebugOperator.load(name, "wc", "s1")
    assert "\n" not in str(e.value)


def test_the_debug_worker_ships_what_the_bolt_emitted():
    posted: list[dict] = []
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    op = DebugOperator.load(f"{HERE}:Upper", "wc", "s1")
    worker = dw.DebugWorker(spec(operator=f"{HERE}:Upper"), Port(ours), posted.append, operator=op)
    frames = [frame(["a", "skip", "boom", "bc"], 0)]
    thread = run_worker(worker, theirs, frames, lambda: sum(len(b["records"]) for b in posted) >= 2)
    assert [r["values"] for b in posted for r in b["records"]] == [["A", 1], ["BC", 2]]
    final = posted[-1]["stats"]
    assert final["op_tuples"] == 3 and final["op_emitted"] == 2 and final["op_errors"] == 1
    assert final["matched"] == 3 and not thread.is_alive()


def test_a_bad_operator_is_told_to_the_controller_before_any_tap(tmp_path, monkeypatch):
    path = tmp_path / "spec.json"
    spec(operator="nosuch_module_x:C", report_url="").save(path)
    told: list[dict] = []
    monkeypatch.setattr(dw, "delivery", lambda s, c: (told.append, lambda e: None))
    monkeypatch.setattr(dw, "open_coordinator", lambda url: None)

    class NoTap:
        def __init__(self, *a, **kw):
            raise AssertionError("no TAP for a session whose operator cannot load")

    import typhoon.runtime.tap

    monkeypatch.setattr(typhoon.runtime.tap, "Tap", NoTap)
    assert dw.main([str(path), "--coordinator", "mem://"]) == 1
    assert told[0]["final"] and "cannot import module 'nosuch_module_x'" in told[0]["error"]
