"""Operator state for checkpoints: a source resumed at its offset, a bolt restored from its
snapshot (through msgpack, as a checkpoint stores them) behaves exactly like one never stopped.
"""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from typhoon.operators import BUILTINS, Bolt, Context, Spout, replayable
from typhoon.operators import ads as ads_mod
from typhoon.operators import sinks as sinks_mod
from typhoon.operators import sources as sources_mod
from typhoon.operators.ads import LatencyCollect, write_campaign_table
from typhoon.operators.keyed import keyed_tuple
from typhoon.operators.sinks import SequenceCheck

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def roundtrip(x: Any) -> Any:
    """What a checkpoint gives back: the msgpack form the store keeps."""
    return msgpack.unpackb(msgpack.packb(x, use_bin_type=True), raw=False, strict_map_key=False)


class FakeTime:
    """A clock that stands still, so time-stamped fields and timelines are reproducible."""

    @staticmethod
    def time() -> float:
        return 1_000_000.0

    @staticmethod
    def monotonic() -> float:
        return 5.0

    @staticmethod
    def sleep(_s: float) -> None:
        pass


@pytest.fixture(autouse=True)
def still_clock():
    with (
        mock.patch.object(sources_mod, "time", FakeTime),
        mock.patch.object(ads_mod, "time", FakeTime),
        mock.patch.object(sinks_mod, "time", FakeTime),
    ):
        yield


def context(index: int = 0, parallelism: int = 1, fields: list[str] | None = None) -> Context:
    return Context("t", "n", 7 + index, index, parallelism, input_fields=fields or [])


# ----- sources ------------------------------------------------------------------------------


def drive(spout: Spout, batch: int, calls: int) -> tuple[list, bool]:
    """Call next_batch up to ``calls`` times; the tuples (with their stream) and whether more."""
    out: list = []

    def emit(values: list, stream: str = "default") -> None:
        out.append((list(values), stream))

    more = True
    for _ in range(calls):
        more = spout.next_batch(emit, batch)
        if not more:
            break
    return out, more


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("state") / "lines.txt"
    lines = [f"line {i} " + "é" * (i % 4) for i in range(157)]
    path.write_bytes(("\n".join(lines[:100]) + "\r\n" + "\n".join(lines[100:])).encode())
    return str(path)  # no newline at the end: the last line is still a line


def spout_cases(text_file: str) -> list[tuple[type[Spout], dict[str, Any]]]:
    return [
        (sources_mod.SequenceSource, {"count": 137, "size": 3}),
        (sources_mod.SequenceSource, {"size": 1}),  # endless
        (sources_mod.SentenceSource, {"count": 211, "words": 3, "vocabulary": 20}),
        (sources_mod.SentenceSource, {"path": text_file}),
        (ads_mod.AdEventSource, {"count": 150, "campaigns": 3, "ads": 2}),
        (BUILTINS["keyed_source"], {"count": 120, "keys": 5, "streams": ["a", "b"]}),
        (BUILTINS["file_source"], {"path": text_file}),
        (BUILTINS["pair_source"], {"count": 90, "keys_a": 7, "keys_b": 5, "locality": 0.5}),
        (
            BUILTINS["event_source"],
            {
                "count": 130,
                "seed": 4,
                "disorder_ms": 5,
                "late_every": 7,
                "late_ms": 40,
                "tardy_every": 5,
                "tardy_ms": 3,
                "bad_every": 11,
            },
        ),
        (BUILTINS["nexmark_source"], {"kind": "bid", "count": 700, "seed": 3, "disorder_ms": 9}),
        (BUILTINS["nexmark_source"], {"kind": "person", "count": 900, "seed": 3}),
    ]


SPOUT_IDS = [
    "sequence",
    "sequence-endless",
    "sentence",
    "sentence-file",
    "ad-events",
    "keyed",
    "file",
    "pairs",
    "events",
    "nexmark-bids",
    "nexmark-persons",
]


@pytest.mark.parametrize("case", range(len(SPOUT_IDS)), ids=SPOUT_IDS)
@SETTINGS
@given(
    batch=st.integers(1, 40),
    cut=st.integers(0, 12),
    index_par=st.integers(1, 3).flatmap(lambda p: st.tuples(st.integers(0, p - 1), st.just(p))),
)
def test_source_resumes_at_its_offset(case, text_file, batch, cut, index_par):
    cls, args = spout_cases(text_file)[case]
    index, par = index_par
    calls = 15  # endless sources stop here

    whole = cls(**args)
    whole.open(context(index, par))
    expected, _ = drive(whole, batch, calls)

    first = cls(**args)
    first.open(context(index, par))
    head, more = drive(first, batch, cut)
    offset = roundtrip(first.offset())
    assert first.result() == roundtrip(first.result())
    if more:
        second = cls(**args)
        second.open(context(index, par))
        second.seek(offset)
        tail, _ = drive(second, batch, calls - cut)
        finished = second
    else:
        tail, finished = [], first
    assert head + tail == expected
    assert finished.result() == whole.result()
    for s in (whole, first, finished):
        s.close()


def test_every_builtin_source_is_replayable():
    spouts = [cls for cls in BUILTINS.values() if issubclass(cls, Spout)]
    assert spouts and all(replayable(cls) for cls in spouts)
    assert not replayable(BUILTINS["count_by_key"])


def test_a_source_without_offset_is_not_replayable():
    class Mine(Spout):
        def next_batch(self, emit, max_count):
            return False

    class Half(Spout):
        def offset(self):
            return 0

    assert not Mine.replayable() and not replayable(Mine) and not replayable(Half)
    with pytest.raises(NotImplementedError, match="Mine cannot tell its offset"):
        Mine().offset()
    with pytest.raises(NotImplementedError, match="Mine cannot seek"):
        Mine().seek(0)


def test_seek_rejects_an_offset_of_another_shape():
    s = sources_mod.SequenceSource(count=3)
    s.open(context())
    with pytest.raises(ValueError, match="SequenceSource cannot seek to .*'seq'"):
        s.seek({"emitted": 2})


# ----- bolts -------------------------------------------------------------------------------

KEYS = st.one_of(st.text(max_size=3), st.integers(-5, 5), st.binary(max_size=2))


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("campaigns") / "campaigns.csv"
    write_campaign_table(path, campaigns=3, ads=2)
    return str(path)


def bolt_case(name: str, campaigns: str) -> tuple[Any, list[str], Any]:
    """(factory, input fields, strategy for one row) of each stateful bolt."""
    ad_ids = list(ads_mod.read_campaign_table(campaigns)) + ["no-such-ad"]
    keyed = st.integers(0, 10_000).map(lambda i: keyed_tuple(3, i, 7, "pp"))
    return {
        "count_by_key": (lambda: BUILTINS["count_by_key"](key="w"), ["w"], KEYS.map(lambda k: [k])),
        "sequence_check": (
            SequenceCheck,
            ["src", "seq", "ts", "payload"],
            st.tuples(st.integers(0, 2), st.integers(0, 9000)).map(
                lambda t: [t[0], t[1], 999_999.5, b"x"]
            ),
        ),
        "collect": (lambda: BUILTINS["collect"](limit=20), ["a", "b"], st.tuples(KEYS, KEYS)),
        "key_origins": (
            lambda: BUILTINS["key_origins"](key="k", count="n"),
            ["k", "n"],
            st.tuples(st.integers(0, 5), st.integers(0, 9)).map(list),
        ),
        "digest": (BUILTINS["digest"], ["key", "seq", "value", "pad"], keyed),
        "count_forward": (
            lambda: BUILTINS["count_forward"](key="b"),
            ["a", "b"],
            st.tuples(KEYS, KEYS).map(list),
        ),
        "parse_json": (
            lambda: BUILTINS["parse_json"](keys=["a", "b"]),
            ["event", "ts"],
            st.one_of(
                st.builds(lambda a: [json.dumps({"a": a, "b": 1}), 2.0], st.integers()),
                st.just(["not json", 1.0]),
                st.just(["[1, 2]", 1.0]),
            ),
        ),
        "latency_collect": (
            lambda: LatencyCollect(limit=15),
            ["x", "ts"],
            st.floats(999_990, 999_999).map(lambda t: ["v", t]),
        ),
        "lookup": (
            lambda: BUILTINS["lookup"](table=campaigns, field="ad_id", value_column="campaign_id"),
            ["ad_id", "event_time", "ts"],
            st.tuples(st.sampled_from(ad_ids), st.integers(0, 2000), st.floats(0, 10)).map(list),
        ),
    }[name]


BOLTS = [
    "count_by_key",
    "count_forward",
    "sequence_check",
    "collect",
    "digest",
    "key_origins",
    "parse_json",
    "lookup",
    "latency_collect",
]


def feed(bolt: Bolt, steps: list, out: list) -> None:
    """Steps: ("row", values), ("batch", rows) or ("signal",), as the framework calls them."""

    def emit(values: list, stream: str = "default") -> None:
        out.append((list(values), stream))

    for step in steps:
        if step[0] == "row":
            bolt.process(list(step[1]), emit)
        elif step[0] == "batch":
            rows = [list(r) for r in step[1]]
            if hasattr(bolt, "process_batch"):
                bolt.process_batch(rows, emit)
            else:
                for r in rows:
                    bolt.process(r, emit)
        else:
            bolt.on_signal(emit)


@pytest.mark.parametrize("name", BOLTS)
@SETTINGS
@given(data=st.data())
def test_bolt_restored_from_snapshot_behaves_the_same(name, campaigns, data):
    factory, fields, row = bolt_case(name, campaigns)
    step = st.one_of(
        row.map(lambda r: ("row", r)),
        st.lists(row, max_size=30).map(lambda rs: ("batch", rs)),
        st.just(("signal",)),
    )
    steps = data.draw(st.lists(step, max_size=40))
    cut = data.draw(st.integers(0, len(steps)))

    def fresh() -> Bolt:
        b = factory()
        b.open(context(fields=fields))
        return b

    with mock.patch.object(SequenceCheck, "MAX_SAMPLES", 8):  # exercise the sample thinning
        whole, expected = fresh(), []
        feed(whole, steps, expected)
        feed(whole, [("signal",)], expected)

        first, got = fresh(), []
        feed(first, steps[:cut], got)
        state = roundtrip(first.snapshot())
        assert state is not None
        second = fresh()
        second.restore(state)
        feed(second, steps[cut:] + [("signal",)], got)
        assert got == expected
        assert second.result() == whole.result()
        assert roundtrip(second.snapshot()) == roundtrip(whole.snapshot())


def test_bigger_sequence_check_snapshot_keeps_bitmaps():
    b = SequenceCheck()
    b.open(context(fields=["src", "seq", "ts", "payload"]))
    b.process_batch([[1, s, 999_999.0, b""] for s in range(0, 20_000, 3)], lambda *a: None)
    c = SequenceCheck()
    c.open(context(fields=["src", "seq", "ts", "payload"]))
    c.restore(roundtrip(b.snapshot()))
    assert c.result() == b.result()
    c.process([1, 3, 999_999.0, b""], lambda *a: None)
    assert c.duplicates == 1


STATELESS = ["split_words", "filter", "identity", "busy", "project", "split_streams", "map"]
STATELESS_ARGS = {
    "filter": {"field": "a", "equals": 1},
    "project": {"fields": ["a"]},
    "map": {"field": "a", "multiply": 2},
}


@pytest.mark.parametrize("name", STATELESS)
def test_stateless_bolts_keep_the_default(name):
    bolt = BUILTINS[name](**STATELESS_ARGS.get(name, {}))
    assert bolt.snapshot() is None
    bolt.restore(None)
    with pytest.raises(ValueError, match=f"{type(bolt).__name__} keeps no state"):
        bolt.restore({"x": 1})


# bolts whose state is all keyed state: the framework checkpoints and moves it
# (tests/unit/test_keyed_state.py); their own snapshot stays None
KEYED_ONLY = ["running_count", "max_by_key", "running_max", "max_and_prev"]


@pytest.mark.parametrize("name", KEYED_ONLY)
def test_keyed_only_bolts_have_no_snapshot_of_their_own(name):
    assert BUILTINS[name].keyed
    assert BUILTINS[name]().snapshot() is None


# windows: keyed state (the open windows) plus a snapshot of the watermark they saw
WINDOWED = ["window_aggregate"]


@pytest.mark.parametrize("name", WINDOWED)
@SETTINGS
@given(data=st.data())
def test_windows_restored_from_keyed_state_and_snapshot_behave_the_same(name, data):
    from typhoon.runtime.keyed_state import KeyedStates

    fields = ["key", "ts", "value"]
    args = {"key": "key", "time_field": "ts", "size_ms": 10, "slide_ms": 5,
            "aggregate": "sum", "field": "value", "allowed_lateness_ms": 4}  # fmt: skip

    def fresh() -> Bolt:
        b = BUILTINS[name](**args)
        keyed = KeyedStates(name, "n", 7, [0], 1, {0})
        b.open(Context("t", "n", 7, 0, 1, input_fields=fields, operator=name, keyed=keyed,
                       keyed_declared=True))  # fmt: skip
        return b

    row = st.tuples(st.sampled_from("ab"), st.integers(0, 100), st.integers(0, 9)).map(list)
    step = st.one_of(row.map(lambda r: ("row", r)), st.integers(0, 110).map(lambda w: ("wm", w)))
    steps = data.draw(st.lists(step, max_size=40))
    cut = data.draw(st.integers(0, len(steps)))

    def run(bolt: Bolt, todo: list, out: list) -> None:
        def emit(values: list, stream: str = "default") -> None:
            out.append((list(values), stream))

        for kind, x in todo:
            if kind == "row":
                bolt.process(list(x), emit)
            else:
                bolt.on_watermark(x, emit)

    whole, expected = fresh(), []
    run(whole, steps + [("wm", 10**9)], expected)
    first, got = fresh(), []
    run(first, steps[:cut], got)
    keyed, state = first.context.keyed.pack(), roundtrip(first.snapshot())
    second = fresh()
    second.context.keyed.restore(keyed)
    second.restore(state)
    run(second, steps[cut:] + [("wm", 10**9)], got)
    assert got == expected
    assert second.result() == whole.result()


def test_join_restored_from_keyed_state_and_snapshot_behaves_the_same():
    from typhoon.runtime.keyed_state import KeyedStates

    def fresh() -> Bolt:
        b = BUILTINS["window_join"]("a", "b", "k", "k", "t", "t", 10, 5)
        b.open(Context("t", "j", 7, 0, 1, operator="window_join", keyed_declared=True,
                       keyed=KeyedStates("window_join", "j", 7, [0], 1, {0}),
                       input_nodes={"a": ["k", "t"], "b": ["k", "t"]}))  # fmt: skip
        return b

    steps = [("a", ["x", 1]), ("b", ["x", 4]), ("wm", 5), ("a", ["y", 7]), ("b", ["x", 8]),
             ("b", ["y", 9]), ("a", ["x", 2]), ("wm", 12), ("b", ["y", 14])]  # fmt: skip

    def run(bolt: Bolt, todo: list, out: list) -> None:
        def emit(values: list, stream: str = "default") -> None:
            out.append((list(values), stream))

        for src, x in todo:
            if src == "wm":
                bolt.on_watermark(x, emit)
            else:
                bolt.input = src
                bolt.process(list(x), emit)

    whole, expected = fresh(), []
    run(whole, steps + [("wm", 10**9)], expected)
    assert len(expected) == 8  # worked out by hand: 1 + 4 + 1 + 2 pairs
    for cut in range(len(steps) + 1):
        first, got = fresh(), []
        run(first, steps[:cut], got)
        keyed, state = first.context.keyed.pack(), roundtrip(first.snapshot())
        second = fresh()
        second.context.keyed.restore(keyed)
        second.restore(state)
        run(second, steps[cut:] + [("wm", 10**9)], got)
        assert got == expected
        assert second.result() == whole.result()


def _two_sided(name: str) -> Bolt:
    from typhoon.runtime.keyed_state import KeyedStates

    if name == "stream_join":
        b = BUILTINS[name]("a", "b", "k", "k")
    else:
        b = BUILTINS[name]("a", "b", "k", "k", "t", "e", "t", aggregate="max", field="v",
                           carry=["e"])  # fmt: skip
    b.open(Context("t", "j", 7, 0, 1, operator=name, keyed_declared=True,
                   keyed=KeyedStates(name, "j", 7, [0], 1, {0}),
                   input_nodes={"a": ["k", "t", "e"], "b": ["k", "t", "v"]}))  # fmt: skip
    return b


@pytest.mark.parametrize("name", ["stream_join", "interval_join"])
@SETTINGS
@given(data=st.data())
def test_two_sided_joins_restored_from_keyed_state_and_snapshot_behave_the_same(name, data):
    """Random left tuples ``[k, t, t + d]``, right ones ``[k, t, v]`` and watermarks, cut
    anywhere: keyed state and snapshot put back give what one never stopped does."""
    key = st.sampled_from("xy")
    left = st.tuples(key, st.integers(0, 40), st.integers(1, 12)).map(
        lambda r: ("a", [r[0], r[1], r[1] + r[2]])
    )
    right = st.tuples(key, st.integers(0, 50), st.integers(0, 9)).map(lambda r: ("b", list(r)))
    steps = data.draw(st.lists(st.one_of(left, right, st.integers(0, 55).map(lambda w: ("wm", w))),
                               max_size=30))  # fmt: skip
    cut = data.draw(st.integers(0, len(steps)))

    def run(bolt: Bolt, todo: list, out: list) -> None:
        def emit(values: list, stream: str = "default") -> None:
            out.append((list(values), stream))

        for src, x in todo:
            if src == "wm":
                getattr(bolt, "on_watermark", lambda *_: None)(x, emit)
            else:
                bolt.input = src
                bolt.process(list(x), emit)

    whole, expected = _two_sided(name), []
    run(whole, steps + [("wm", 10**9)], expected)
    first, got = _two_sided(name), []
    run(first, steps[:cut], got)
    keyed, state = first.context.keyed.pack(), roundtrip(first.snapshot())
    second = _two_sided(name)
    second.context.keyed.restore(keyed)
    second.restore(state)
    run(second, steps[cut:] + [("wm", 10**9)], got)
    assert got == expected
    assert second.result() == whole.result()


# sinks into an outside system: their snapshot is the two-phase commit's pending rows,
# tested on the TransactionalSink state machine (tests/unit/test_connectors.py) and with
# a real server (tests/connectors/) or real files (tests/unit/test_file_sink.py)
CONNECTOR_SINKS = ["postgres_sink", "redis_stream_sink", "nats_sink", "file_sink"]


def test_every_builtin_bolt_is_covered():
    """A new built-in bolt must be listed as stateful (tested above) or stateless here."""
    bolts = {n for n, cls in BUILTINS.items() if issubclass(cls, Bolt)}
    windowed = set(WINDOWED) | {"window_join", "stream_join", "interval_join"}
    assert bolts == (
        set(BOLTS[:8]) | set(STATELESS) | set(KEYED_ONLY) | windowed | set(CONNECTOR_SINKS)
    )
