"""Lists of rows routed by key (``Router.by_key``, ``process_rows``) do what row by row does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_emit_rows import per_link
from test_framework import Recorder

from benchmarks.emit_path import wordcount
from typhoon.operators import resolve_operator
from typhoon.operators.base import Bolt, Context
from typhoon.operators.sources import SentenceSource
from typhoon.operators.transforms import SplitWords
from typhoon.runtime import policies
from typhoon.runtime.framework import Framework
from typhoon.runtime.hooks import rows_hook
from typhoon.runtime.policies import Router
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound
from typhoon.topology import schedule
from typhoon.topology.keygroups import NO_OWNER
from typhoon.topology.routing import Route

# keys equal across types (True == 1 == 1.0, b"" vs ""), unhashable ones, and a few
# strings that repeat so the remembered path is taken
KEYS = st.one_of(
    st.sampled_from(["a", "b", "hello", "", "1", "True"]),
    st.text(max_size=3),
    st.integers(-3, 3),
    st.booleans(),
    st.floats(-2, 2, allow_nan=False),
    st.binary(max_size=2),
    st.none(),
    st.lists(st.integers(0, 2), max_size=2),
)
ROWS = st.lists(st.lists(KEYS, min_size=1, max_size=3), max_size=40)


def fields_router(groups: list[int], field: int = 0) -> Router:
    hops = sorted({g for g in groups if g >= 0}) or [11]
    return Router(Route(stream=1, policy="fields", next_hops=hops, fields=[field], groups=groups))


def by_select(r: Router, rows: list[list]) -> list[tuple[int, list[list]]]:
    """What ``select`` row by row deals out, each receiver's rows in their order."""
    out: dict[int, list[list]] = {}
    for values in rows:
        out.setdefault(r.select(values), []).append(values)
    return sorted(out.items())


@settings(max_examples=300, deadline=None)
@given(
    calls=st.lists(ROWS, min_size=1, max_size=4),
    groups=st.lists(st.sampled_from([11, 12, 13, NO_OWNER]), min_size=1, max_size=8),
    field=st.integers(0, 1),
    cache=st.sampled_from([2, 8192]),
)
def test_by_key_deals_rows_where_select_sends_them(
    calls: list[list[list]], groups: list[int], field: int, cache: int
) -> None:
    fast, slow = fields_router(groups, field), fields_router(groups, field)
    old = policies.KEY_CACHE
    policies.KEY_CACHE = cache  # a small cache starts over within a call
    try:
        for rows in calls:
            dealt = fast.by_key(rows)
            if dealt is None:  # the framework routes such a list row by row
                assert any(len(v) <= field or isinstance(v[field], list) for v in rows)
                continue
            assert sorted(dealt) == by_select(slow, rows)
            assert all(part for _, part in dealt)
            assert len({dst for dst, _ in dealt}) == len(dealt)
            assert len(fast.adders) <= max(cache, 1)
    finally:
        policies.KEY_CACHE = old


def test_by_key_keeps_keys_equal_across_types_apart() -> None:
    r = fields_router(list(range(1, 65)))
    rows = [["1"], [1], [True], [1.0], [b"1"], ["1"], [True]]
    assert sorted(r.by_key(rows)) == by_select(fields_router(list(range(1, 65))), rows)
    assert set(r.adders) == {"1"}  # only strings are remembered


def split_worker(par: int, batch: int) -> tuple[Framework, Recorder, int]:
    topo = wordcount(par)
    phys = schedule(topo, ["h1", "h2"], 7)
    split = phys.of_node("split")[0].worker_id
    io = Recorder()
    fw = Framework(WorkerSpec(topo, phys, split, batch_size=batch), SplitWords(), io)
    return fw, io, phys.of_node("source")[0].worker_id


WORDS = st.lists(
    st.one_of(st.sampled_from(["a", "bb", "ccc", "a", "dd"]), st.text("xyz", min_size=1)),
    max_size=9,
)


@settings(max_examples=120, deadline=None)
@given(
    par=st.integers(1, 5),
    batch=st.integers(1, 12),
    deliveries=st.lists(st.lists(WORDS, max_size=6), min_size=1, max_size=5),
    flush_after=st.sets(st.integers(0, 4)),
)
def test_process_rows_sends_the_frames_process_sends(
    par: int, batch: int, deliveries: list[list[list[str]]], flush_after: set[int]
) -> None:
    """The split worker's frames per link, counts per link and metrics are the same
    with the list path (process_rows, emit_rows, by_key) as with process and emit."""
    rows_fw, rows_io, src = split_worker(par, batch)
    one_fw, one_io, _ = split_worker(par, batch)
    assert rows_fw._process_rows is not None
    one_fw._process_rows = None
    for i, sentences in enumerate(deliveries):
        rows = [[" ".join(words)] for words in sentences]
        rows_fw.deliver(Inbound(src, 1, [], [list(r) for r in rows]))
        one_fw.deliver(Inbound(src, 1, [], [list(r) for r in rows]))
        if i in flush_after:
            rows_fw.push()
            one_fw.push()
    rows_fw.flush(force=True)
    one_fw.flush(force=True)
    assert per_link(rows_io) == per_link(one_io)
    assert [e for *_, es in rows_io.sent for e in es] or not any(map(any, deliveries))
    assert rows_fw.sent_to == one_fw.sent_to
    assert rows_fw.serializations == one_fw.serializations
    assert rows_fw.unrouted == one_fw.unrouted
    assert rows_fw.tuples_in == one_fw.tuples_in
    assert {s: r.emitted for s, r in rows_fw.routers.items()} == {
        s: r.emitted for s, r in one_fw.routers.items()
    }


def test_rows_no_worker_takes_are_counted_unrouted() -> None:
    fw, io, src = split_worker(2, 4)
    (sid,) = fw.routers
    r = fw.routers[sid].route
    route = Route(sid, "fields", r.next_hops, r.fields, groups=[NO_OWNER] * len(r.groups))
    fw.install_route(route)
    fw.deliver(Inbound(src, 1, [], [["a b c"], ["d"]]))
    fw.flush(force=True)
    assert fw.unrouted == 4
    assert fw.routers[sid].emitted == 4
    assert not [p for *_, ps in io.sent for p in ps]


class OnlyProcess(SplitWords):  # overrides process: the inherited process_rows must not run
    def process(self, values, emit):  # noqa: ANN001, ANN201 - a test double
        emit([values[0].upper()])


class OnlyBatch(SplitWords):  # overrides process_batch: the same
    def process_batch(self, rows, emit):  # noqa: ANN001, ANN201 - a test double
        for values in rows:
            emit([len(values[0])])


def test_process_rows_only_where_it_sits_beside_process_and_process_batch() -> None:
    assert rows_hook(SplitWords()) is not None
    assert rows_hook(OnlyProcess()) is None
    assert rows_hook(OnlyBatch()) is None
    assert rows_hook(Bolt()) is None
    assert rows_hook(resolve_operator("identity")()) is None


def test_split_words_process_rows_emits_what_process_emits_with_a_service_time() -> None:
    rows = [["a b  c"], [""], ["d\te"], ["f"]]
    for cost in (0.0, 1.0):
        op = SplitWords(cost_us=cost)
        one: list = []
        for values in rows:
            op.process(values, one.append)
        lists: list = []
        op.process_rows(rows, lists.append)
        assert [v for vs in lists for v in vs] == one == [[w] for w in "abcdef"]


@pytest.mark.parametrize("chunk", [1, 3, 7, 50])
def test_sentence_source_next_rows_emits_what_next_batch_emits(chunk: int) -> None:
    outs = []
    for use_rows in (True, False):
        src = SentenceSource(count=23, seed=3, words=4, vocabulary=9)
        src.open(Context("t", "source", 1, 1, 2))
        out: list = []
        more, calls = True, 0
        while more:
            if use_rows:
                more = src.next_rows(out.extend, chunk)
            else:
                more = src.next_batch(out.append, chunk)
            calls += 1
            assert src.offset() == {"emitted": len(out)}
        outs.append((out, calls))
    assert outs[0] == outs[1]
    assert len(outs[0][0]) == 11  # worker 1 of 2 takes the odd sentences
