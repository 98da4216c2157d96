"""The Nexmark generator and the small built-ins its queries needed: ``map``, ``filter``'s
``modulo``, ``stream_join``, ``interval_join`` (their runs are tests/unit/test_nexmark_queries.py;
their checkpoints tests/unit/test_operator_state.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from typhoon.operators import BUILTINS, Context
from typhoon.operators.nexmark import (
    AUCTION,
    AUCTION_ID_LEAD,
    BID,
    FIELDS,
    KINDS,
    PERSON,
    PERSON_ID_LEAD,
    US_STATES,
    event_number,
    events_of,
    kind_count,
    kind_of,
    last_base0_auction_id,
    last_base0_person_id,
    nexmark_event,
)
from typhoon.runtime.keyed_state import KeyedStates
from typhoon.topology import TopologyError, load_topology_text

ARGS = {"count": 5000, "seed": 5, "step_us": 1000, "disorder_ms": 30}


def emitted(kind: str, args: dict, index: int, parallelism: int, batch: int = 37) -> list[list]:
    src = BUILTINS["nexmark_source"](kind=kind, **args)
    src.open(Context("t", "n", 1, index, parallelism))
    rows: list[list] = []
    while src.next_rows(rows.extend, batch):
        pass
    assert src.result() == {"emitted": len(rows)}
    return rows


def test_proportions_and_fields():
    kinds = Counter(kind_of(n) for n in range(5000))
    assert kinds == {PERSON: 100, AUCTION: 300, BID: 4600}
    for n in range(200):
        kind, row = nexmark_event(n, ARGS)
        assert kind == kind_of(n) and len(row) == len(FIELDS[kind])
    assert all(kind_count(k, 5000) == kinds[k] for k in KINDS)


def test_the_events_are_a_function_of_seed_and_number():
    assert events_of(BID, ARGS) == events_of(BID, dict(ARGS))
    assert events_of(BID, ARGS) != events_of(BID, {**ARGS, "seed": 6})
    assert nexmark_event(777, ARGS) == nexmark_event(777, {**ARGS})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("parallelism", [1, 3])
def test_workers_share_the_kind_s_events_between_them(kind, parallelism):
    """Worker i of P emits the kind's events i, i+P, ...: together each once, in order."""
    whole = events_of(kind, ARGS)
    parts = [emitted(kind, ARGS, i, parallelism) for i in range(parallelism)]
    for i, part in enumerate(parts):
        assert part == whole[i::parallelism]
    assert sum(len(p) for p in parts) == len(whole) == kind_count(kind, ARGS["count"])


def test_ids_references_and_times_follow_the_nexmark_model():
    people = events_of(PERSON, ARGS)
    auctions = events_of(AUCTION, ARGS)
    bids = events_of(BID, ARGS)
    assert [p[0] for p in people] == list(range(1000, 1000 + len(people)))
    assert [a[0] for a in auctions] == list(range(1000, 1000 + len(auctions)))
    assert {p[5] for p in people} <= set(US_STATES)
    assert {a[8] for a in auctions} == set(range(10, 15))
    assert all(a[4] > a[3] > 0 and a[6] > a[5] for a in auctions)  # reserve > initial bid
    # sellers and bidders are people that exist or are about to (the generator's lead)
    last_person = 1000 + len(people) - 1
    assert all(1000 <= a[7] <= last_person + PERSON_ID_LEAD for a in auctions)
    assert all(1000 <= b[1] <= last_person + PERSON_ID_LEAD for b in bids)
    assert all(1000 <= b[0] <= 1000 + len(auctions) + AUCTION_ID_LEAD for b in bids)
    # half the bids go to the hot auction of their time, three in four auctions to a hot seller
    hot = [
        b[0] == 1000 + last_base0_auction_id(event_number(BID, j)) // 2 * 2
        for j, b in enumerate(bids)
    ]
    assert 0.45 < sum(hot) / len(bids) < 0.6
    hot = [
        a[7] == 1000 + last_base0_person_id(event_number(AUCTION, j)) // 4 * 4
        for j, a in enumerate(auctions)
    ]
    assert 0.7 < sum(hot) / len(auctions) < 0.85
    # event time: n * step plus a jitter within disorder_ms
    for n in range(0, 5000, 7):
        kind, row = nexmark_event(n, ARGS)
        ts = row[FIELDS[kind].index("dateTime")]
        jitter, bound = ts - n * ARGS["step_us"] // 1000, ARGS["disorder_ms"]
        assert 0 <= jitter <= bound


@pytest.mark.parametrize(
    "args, message",
    [
        ({"kind": "bids", "count": 5}, "kind must be one of person, auction, bid"),
        ({"kind": "bid", "count": -1}, "count must be a non-negative integer"),
        ({"kind": "bid", "count": True}, "count must be a non-negative integer"),
        ({"kind": "bid", "count": 5, "step_us": 0}, "step_us and auction_ms must be at least 1"),
        ({"kind": "bid", "count": 5, "rate": -2}, "rate must be a non-negative number"),
    ],
)
def test_bad_generator_args_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        BUILTINS["nexmark_source"](**args)


def test_the_loader_checks_kind_and_the_watermark_field():
    text = """
name: nm
spouts:
  - id: bids
    operator: nexmark_source
    args: {kind: %s, count: 10}
    watermark: {time_field: %s, out_of_order_ms: 5}
bolts:
  - {id: sink, operator: collect}
streams:
  - {from: bids, to: sink, grouping: shuffle}
"""
    topo = load_topology_text(text % ("bid", "dateTime"))
    assert topo.nodes["bids"].output_fields == FIELDS[BID]
    with pytest.raises(TopologyError, match="kind must be one of person, auction, bid"):
        load_topology_text(text % ("bidz", "dateTime"))
    with pytest.raises(TopologyError, match="reads time field 'ts', which 'bids' does not"):
        load_topology_text(text % ("bid", "ts"))


def test_seek_refuses_another_shape():
    src = BUILTINS["nexmark_source"](kind=BID, count=10)
    src.open(Context("t", "n", 1, 0, 1))
    for bad in ({"i": 3, "emitted": 1}, {"j": -1, "emitted": 0}, [3, 1]):
        with pytest.raises(ValueError, match="nexmark_source cannot seek"):
            src.seek(bad)


# ----- map and filter --------------------------------------------------------------------


def bolt(name: str, fields: list[str], **args):
    b = BUILTINS[name](**args)
    b.open(Context("t", "n", 1, 0, 1, input_fields=fields))
    return b


def test_map_converts_and_counts_what_is_not_a_number():
    out: list[list] = []
    m = bolt("map", ["a", "price"], field="price", multiply=0.908)
    for row in (["x", 100], ["y", 2.5], ["z", "12"], ["w", None], ["v", float("nan")], ["u", True]):
        m.process(row, out.append)
    assert out == [["x", 100 * 0.908], ["y", 2.5 * 0.908]]
    assert m.metrics() == {"map_bad_value": 4}
    out.clear()
    m = bolt("map", ["a", "price"], field="price", multiply=0.908, round=0, to="euros")
    m.process(["x", 1000], out.append)
    assert out == [["x", 1000, 908]] and type(out[0][2]) is int
    m = bolt("map", ["price"], field="price", add=1.5, round=1)
    m.process([2], out.append)
    assert out[-1] == [3.5]


def test_map_args_and_fields_are_checked():
    map_cls = BUILTINS["map"]
    assert map_cls.output_fields({"field": "p", "to": "q"}, ["p"]) == ["p", "q"]
    with pytest.raises(ValueError, match="map field 'p' is not one of the input fields"):
        map_cls.output_fields({"field": "p"}, ["a"])
    with pytest.raises(ValueError, match="to field 'a' is already an input field"):
        map_cls.output_fields({"field": "p", "to": "a"}, ["a", "p"])
    for bad, message in (
        ({"multiply": "2"}, "multiply must be a finite number"),
        ({"add": float("inf")}, "add must be a finite number"),
        ({"round": 1.5}, "round must be a number of decimals"),
    ):
        with pytest.raises(ValueError, match=message):
            map_cls(field="p", **bad)


def test_filter_modulo():
    out: list[list] = []
    f = bolt("filter", ["auction"], field="auction", modulo=123, equals=0)
    for row in ([246], [247], [0], ["246"], [12.0], [None]):
        f.process(row, out.append)
    assert out == [[246], [0]]
    assert f.metrics() == {"filter_bad_value": 3}
    assert bolt("filter", ["a"], field="a", equals=1).metrics() == {}
    with pytest.raises(ValueError, match="modulo must be a positive integer"):
        BUILTINS["filter"](field="a", equals=0, modulo=0)


# ----- the joins -------------------------------------------------------------------------


def two_sided(name: str, **args):
    b = BUILTINS[name]("a", "b", "k", "k", **args)
    b.open(Context("t", "j", 7, 0, 1, operator=name, keyed_declared=True,
                   keyed=KeyedStates(name, "j", 7, [0], 1, {0}),
                   input_nodes={"a": ["k", "t", "e"], "b": ["k", "t", "v"]}))  # fmt: skip
    return b


def feed(b, steps: list) -> list[tuple[list, str]]:
    out: list[tuple[list, str]] = []

    def emit(values: list, stream: str = "default") -> None:
        out.append((values, stream))

    for src, x in steps:
        if src == "wm":
            b.on_watermark(x, emit)
        else:
            b.input = src
            b.process(list(x), emit)
    return out


def test_stream_join_pairs_each_once_whatever_side_came_first():
    b = two_sided("stream_join")
    out = feed(b, [("a", ["x", 1, 2]), ("b", ["x", 5, 1]), ("b", ["y", 0, 2]),
                   ("a", ["x", 9, 9]), ("a", ["y", 3, 4]), ("c", ["x", 0, 0])])  # fmt: skip
    assert out == [
        (["x", ["x", 1, 2], ["x", 5, 1]], "default"),
        (["x", ["x", 9, 9], ["x", 5, 1]], "default"),
        (["y", ["y", 3, 4], ["y", 0, 2]], "default"),
    ]
    assert b.result() == {"pairs": 3, "kept": 5}
    assert b.unknown_input == 1


def test_interval_join_aggregates_the_right_tuples_in_each_left_interval():
    b = two_sided("interval_join", left_time="t", left_end="e", right_time="t",
                  aggregate="max", field="v", carry=["e"])  # fmt: skip
    steps = [
        ("b", ["x", 12, 7]),  # before its left: waits for it
        ("a", ["x", 10, 20]),  # [10, 20)
        ("b", ["x", 19, 3]),
        ("b", ["x", 20, 99]),  # the end is not in the interval
        ("b", ["x", 9, 50]),  # nor before the start
        ("a", ["y", 0, 5]),  # no right tuple falls in it: not emitted
        ("wm", 19),
    ]
    assert feed(b, steps) == []
    assert feed(b, [("wm", 20)]) == [(["x", 10, 20, 7, 20], "default")]
    late = feed(b, [("a", ["x", 3, 15]), ("b", ["z", 15, 1])])  # ended, and below the watermark
    assert late == [(["x", 3, 3, ["x", 3, 15]], "late"), (["z", 15, 15, ["z", 15, 1]], "late")]
    assert b.metrics()["window_late"] == 2 and b.metrics()["interval_late_right"] == 1
    # bad times, intervals and values are counted and dropped
    assert feed(b, [("a", ["x", "t", 40]), ("a", ["x", 40, 40]), ("b", ["x", 41, "v"])]) == []
    assert b.metrics()["window_bad_time"] == 3
    # emit_empty: an interval with nothing in it still closes, with the empty aggregate
    e = two_sided("interval_join", left_time="t", left_end="e", right_time="t", emit_empty=True)
    assert feed(e, [("a", ["x", 0, 5]), ("wm", 5)]) == [(["x", 0, 5, 0], "default")]


def test_joins_check_their_inputs_in_the_loader():
    text = """
name: nj
spouts:
  - {id: people, operator: nexmark_source, args: {kind: person, count: 10}}
  - {id: auctions, operator: nexmark_source, args: {kind: auction, count: 10}}
bolts:
  - id: join
    operator: %s
    args: %s
  - {id: sink, operator: collect}
streams:
  - {from: people, to: join, grouping: {type: fields, fields: [id]}}
  - {from: auctions, to: join, grouping: {type: fields, fields: [seller]}}
  - {from: join, to: sink, grouping: global}
"""
    ok = "{left: people, right: auctions, left_key: id, right_key: seller}"
    assert load_topology_text(text % ("stream_join", ok)).nodes["join"].output_fields == (
        "key", "left", "right")  # fmt: skip
    bad = "{left: people, right: bids, left_key: id, right_key: seller}"
    with pytest.raises(TopologyError, match="right 'bids' is not an input of this node"):
        load_topology_text(text % ("stream_join", bad))
    interval = (
        "{left: auctions, right: people, left_key: seller, right_key: id, left_time: dateTime, "
        "left_end: %s, right_time: dateTime, carry: [category]}"
    )
    topo = load_topology_text(text % ("interval_join", interval % "expires"))
    assert topo.nodes["join"].output_fields == ("key", "start", "end", "value", "category")
    with pytest.raises(TopologyError, match="left_end 'closes' is not a field 'auctions'"):
        load_topology_text(text % ("interval_join", interval % "closes"))
    with pytest.raises(ValueError, match="aggregate 'max' needs 'field'"):
        BUILTINS["interval_join"]("a", "b", "k", "k", "t", "e", "t", aggregate="max")
