"""The pure parts of the connector API: split assignment, Redis entry decoding, and the
two-phase commit state machine of a transactional sink (an in-memory table)."""

from __future__ import annotations

import pytest

from typhoon.operators import resolve_operator
from typhoon.operators.base import Context
from typhoon.operators.connectors import (
    SplitSource,
    TransactionalSink,
    assign_splits,
    epochs_after,
    json_ok,
)
from typhoon.operators.redis_source import decode_entry, parse_id


def test_every_split_has_exactly_one_reader_for_any_parallelism():
    splits = [f"p{i}" for i in range(7)]
    for parallelism in range(1, 10):
        owned = [assign_splits(splits, i, parallelism) for i in range(parallelism)]
        flat = [s for o in owned for s in o]
        assert sorted(flat) == sorted(splits)
        assert max(map(len, owned)) - min(map(len, owned)) <= 1
    # the order the names come in does not matter: every worker computes the same
    assert assign_splits(list(reversed(splits)), 1, 3) == assign_splits(splits, 1, 3)
    with pytest.raises(ValueError):
        assign_splits(splits, 3, 3)


def test_redis_entries_decode_in_field_order_and_bad_ones_say_why():
    assert decode_entry(["a", "b"], {b"b": b"2", b"a": b"1"}) == (["1", "2"], "")
    assert decode_entry(["a"], {b"a": b"\xff"}) == (None, "not_utf8")
    assert decode_entry(["a", "b"], {b"a": b"1"}) == (None, "wrong_fields")
    assert decode_entry(["a"], {b"a": b"1", b"c": b"3"}) == (None, "wrong_fields")
    # types: numbers for the fields named (an event time), text for the rest
    assert decode_entry(["k", "ts"], {b"k": b"a", b"ts": b"17"}, {"ts": "int"}) == (["a", 17], "")
    assert decode_entry(["v"], {b"v": b"2.5"}, {"v": "float"}) == ([2.5], "")
    for bad in (b"soon", b"1.5", b""):
        assert decode_entry(["ts"], {b"ts": bad}, {"ts": "int"}) == (None, "bad_value")
    assert decode_entry(["v"], {b"v": b"nan"}, {"v": "float"}) == (None, "bad_value")
    assert parse_id("17-3") == (17, 3) and parse_id("2-0") < parse_id("10-0")
    with pytest.raises(ValueError):
        parse_id("latest")


def test_connector_arguments_are_checked():
    src = resolve_operator("redis_stream_source")
    with pytest.raises(ValueError, match="url"):
        src(url="http://x", stream="s", fields=["a"])
    with pytest.raises(ValueError, match="entry ID"):
        src(url="redis://h:1/0", stream="s", fields=["a"], **{"from": "yesterday"})
    with pytest.raises(ValueError, match="until"):
        src(url="redis://h:1/0", stream="s", fields=["a"], until="forever")
    with pytest.raises(ValueError, match="types"):
        src(url="redis://h:1/0", stream="s", fields=["a"], types={"b": "int"})
    with pytest.raises(ValueError, match="types"):
        src(url="redis://h:1/0", stream="s", fields=["a"], types={"a": "date"})
    sink = resolve_operator("postgres_sink")
    with pytest.raises(ValueError, match="either key"):
        sink(dsn="postgresql://h/db", table="t")
    with pytest.raises(ValueError, match="either key"):
        sink(dsn="postgresql://h/db", table="t", key=["a"], append=True)

    for name, args in (
        ("redis_stream_source", {"url": "redis://h:1/0", "stream": "s", "fields": ["a"]}),
        ("nats_source", {"url": "nats://h:1", "stream": "S"}),
    ):
        with pytest.raises(ValueError, match=f"^{name} has no argument bogus, to$"):
            resolve_operator(name)(**args, **{"from": "end", "to": 1, "bogus": 2})
        with pytest.raises(ValueError, match="rate must be a non-negative number"):
            resolve_operator(name)(**args, rate=-1)


def test_from_and_until_end_bound_each_split_by_the_ends_kept_in_the_offset():
    """``RangeSplitSource`` (both sources' positions): ``from`` start, end or a
    position; ``until: end`` stops at the end found at open, and a seek puts back the
    checkpoint's ends, not the ones a replacement would find."""
    redis = resolve_operator("redis_stream_source")
    src = redis(url="redis://h:1/0", stream=["a", "b"], fields=["f"], until="end")
    src.ends = {"a": "10-2", "b": "0-0"}
    src.splits = ["a", "b"]
    assert src.initial_position("a") == "0-0"  # from: start
    assert not src.ended("a", "9-9") and src.ended("a", "10-2") and src.ended("b", "0-0")
    assert not src.past_end("a", "10-2") and src.past_end("a", "10-10")  # (10,10) > (10,2)
    saved = {**src.offset(), "positions": {"a": "3-0", "b": "0-0"}}
    assert saved["until"] == {"a": "10-2", "b": "0-0"}
    again = redis(url="redis://h:1/0", stream=["a", "b"], fields=["f"], until="end")
    again.splits, again.ends = ["a", "b"], {"a": "99-0", "b": "5-0"}  # what is there now
    again.seek(saved)
    assert again.ends == {"a": "10-2", "b": "0-0"} and again.positions["a"] == "3-0"
    endless = redis(url="redis://h:1/0", stream="a", fields=["f"], **{"from": "end"})
    endless.ends = {"a": "7-1"}
    assert endless.initial_position("a") == "7-1" and not endless.ended("a", "99-0")
    nats = resolve_operator("nats_source")(url="nats://h:1", stream="S", **{"from": 41})
    nats.ends = {">": 50}
    assert nats.initial_position(">") == 41 and nats.list_splits() == [">"]
    assert not nats.ended(">", 50)  # no until: endless


class MemorySplits(SplitSource):
    """Splits as in-memory lists; position = entries consumed."""

    def __init__(self, data: dict[str, list]) -> None:
        super().__init__()
        self.data = data

    def list_splits(self) -> list[str]:
        return list(self.data)

    def initial_position(self, split: str) -> int:
        return 0

    def fetch(self, split, position, max_count):
        rows = self.data[split][position : position + max_count]
        return [
            (position + i + 1, None if r is None else [r], "bad" if r is None else "")
            for i, r in enumerate(rows)
        ]

    def ended(self, split, position) -> bool:
        return position >= len(self.data[split])


def _drain(src: SplitSource, out: list, max_count: int = 2) -> None:
    while src.next_batch(lambda v, stream="default": out.append(v[0]), max_count):
        pass


def test_a_split_source_resumes_each_split_at_its_checkpointed_position():
    data = {"a": [1, 2, None, 3], "b": [10, 20, 30], "c": [100]}
    ctx = Context("t", "src", 1, 0, 1)
    first = MemorySplits(data)
    first.open(ctx)
    out: list = []
    first.next_batch(lambda v, stream="default": out.append(v[0]), 2)
    saved = first.offset()
    rest: list = []
    _drain(first, rest)
    again = MemorySplits(data)
    again.open(ctx)
    again.seek(saved)
    replay: list = []
    _drain(again, replay)
    # exactly what followed the offset (splits interleave in turns; each keeps its order)
    assert sorted(replay) == sorted(rest)
    for split in data.values():
        assert [v for v in replay if v in split] == [v for v in rest if v in split]
    assert sorted(out + rest) == [1, 2, 3, 10, 20, 30, 100]
    assert again.result()["dropped"] == {"bad": 1}
    with pytest.raises(ValueError, match="position for each"):
        again.seek({"positions": {"a": 0}})


class MemorySink(TransactionalSink):
    """A table in a dict shared by the instances (as a database outlives workers)."""

    def __init__(self, db: dict) -> None:
        super().__init__()
        self.db = db

    def write(self, rows):
        self.db.setdefault("rows", []).extend(rows)
        return len(rows)

    def commit(self, epochs):
        rows = [r for e in sorted(epochs) for r in epochs[e]]
        self.db.setdefault("rows", []).extend(rows)
        self.db["epoch"] = max(epochs)
        return len(rows)

    def committed_epoch(self):
        return self.db.get("epoch")

    def reset(self):
        self.db.pop("epoch", None)


def _sink(db: dict, guarantee: str = "exactly_once") -> MemorySink:
    s = MemorySink(db)
    s.open(Context("t", "sink", 3, 0, 1, guarantee=guarantee))
    return s


def test_exactly_once_commits_an_epoch_only_when_its_global_checkpoint_completes():
    db: dict = {"epoch": 99}  # a previous run's record: a fresh submission clears it
    s = _sink(db)
    s.process_batch([["a"], ["b"]], None)
    assert "epoch" not in db
    s.anchor_ready(1)
    s.anchor_ready(1)  # the framework asks again until True: the epoch stays closed once
    s.process_batch([["c"]], None)
    s.anchor_ready(2)
    s.process_batch([["d"]], None)
    assert "rows" not in db  # pre-committed only
    s.checkpoint_complete(1)
    assert db == {"rows": [["a"], ["b"]], "epoch": 1}
    s.checkpoint_complete(2)
    s.job_complete()
    assert db["rows"] == [["a"], ["b"], ["c"], ["d"]]


def test_a_rollback_aborts_what_was_not_committed_and_a_replay_is_not_written_twice():
    db: dict = {}
    s = _sink(db)
    s.process_batch([["a"]], None)
    snap1 = s.snapshot()
    s.anchor_ready(1)
    s.process_batch([["b"]], None)
    snap2 = s.snapshot()
    s.anchor_ready(2)
    s.process_batch([["c"]], None)  # after anchor 2: lost with the worker
    s.checkpoint_complete(2)  # epochs 1 and 2 in one transaction
    assert db == {"rows": [["a"], ["b"]], "epoch": 2}
    # the worker is killed; the job rolls back to epoch 2: the replacement restores its
    # checkpoint of epoch 2, whose rows are committed already, and gets ["c"] by replay
    again = MemorySink(db)
    again.open(Context("t", "sink", 3, 0, 1, guarantee="exactly_once"))
    again.restore(snap2)
    again.rewind(1, 2)
    assert again.closed == {} and again.open_rows == []
    again.process_batch([["c"]], None)
    again.job_complete()
    assert db["rows"] == [["a"], ["b"], ["c"]]
    # a rollback to epoch 1 before anything was committed keeps epoch 1's rows to commit
    db2: dict = {}
    third = MemorySink(db2)
    third.open(Context("t", "sink", 3, 0, 1, guarantee="exactly_once"))
    third.restore(snap1)
    third.rewind(1, 1)
    assert third.closed == {1: [["a"]]}
    third.abandon()  # and a later rollback drops the instance: nothing of it is written
    assert db2 == {}


def test_without_exactly_once_rows_are_written_in_batches_and_at_the_end():
    db: dict = {}
    s = _sink(db, guarantee="at_least_once")
    s.BATCH = 3
    s.process_batch([["a"], ["b"]], None)
    assert "rows" not in db
    s.process_batch([["c"]], None)
    assert len(db["rows"]) == 3
    s.process_batch([["d"]], None)
    s.on_signal(None)
    assert len(db["rows"]) == 4 and s.result()["written"] == 4


def test_a_commit_writes_only_the_epochs_after_the_recorded_one():
    epochs = {4: [["d"]], 2: [["b"]], 3: [["c"]]}
    assert list(epochs_after(epochs, None).items()) == [(2, [["b"]]), (3, [["c"]]), (4, [["d"]])]
    assert epochs_after(epochs, 2) == {3: [["c"]], 4: [["d"]]}
    assert epochs_after(epochs, 4) == {} and epochs_after(epochs, 9) == {}
    assert json_ok([["a", 1, None]]) and not json_ok([[b"x"]]) and not json_ok([float("nan")])
