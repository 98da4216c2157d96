"""``file_sink`` on real files: driven through the hooks the framework calls (process,
snapshot/anchor, checkpoint completion, restore/rewind, abandon, close), reading the
directory as an outside reader would (committed files = names without a leading dot)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from typhoon.operators import BUILTINS
from typhoon.operators.base import Context
from typhoon.operators.file_sink import FileSink


def ctx(guarantee: str, index: int = 0) -> Context:
    return Context("job", "sink", 7, index, 2, input_fields=["word", "n"], guarantee=guarantee)


def sink(path: Path, guarantee: str = "exactly_once", **args) -> FileSink:
    s = FileSink(path=str(path), **args)
    s.open(ctx(guarantee))
    return s


def committed(path: Path) -> list[list]:
    """What a reader sees: the rows of every committed jsonl part, in name order."""
    rows: list[list] = []
    for f in sorted(path.iterdir()):
        if not f.name.startswith("."):
            rows += [json.loads(line) for line in f.read_text().splitlines()]
    return rows


def in_progress(path: Path) -> list[str]:
    return sorted(f.name for f in path.iterdir() if f.name.startswith("."))


def test_registered_and_arguments_checked(tmp_path):
    assert BUILTINS["file_sink"] is FileSink
    with pytest.raises(ValueError, match="format"):
        FileSink(path=str(tmp_path), format="xml")
    with pytest.raises(ValueError, match="roll_bytes"):
        FileSink(path=str(tmp_path), roll_bytes=0)
    with pytest.raises(ValueError, match="path"):
        FileSink(path="")


def test_exactly_once_a_rollback_never_exposes_a_row_it_takes_back(tmp_path):
    out = tmp_path / "out"
    s = sink(out)
    s.process_batch([["a", 1], ["b", 1]], None)
    snap1 = s.snapshot()
    s.anchor_ready(1)
    assert committed(out) == []  # pre-committed: in the checkpoint only
    s.process_batch([["a", 2]], None)
    snap2 = s.snapshot()
    s.anchor_ready(2)
    s.checkpoint_complete(1)
    assert committed(out) == [["a", 1], ["b", 1]]
    s.process_batch([["c", 1]], None)  # epoch 3's rows, never checkpointed
    assert committed(out) == [["a", 1], ["b", 1]]
    # the job rolls back to epoch 2 (not complete when the worker died): the replacement
    # restores its checkpoint of 2; epoch 2's rows were never committed, epoch 1's were
    s.abandon()
    assert committed(out) == [["a", 1], ["b", 1]] and in_progress(out) == []
    again = FileSink(path=str(out))
    again.open(ctx("exactly_once"))
    again.restore(snap2)
    again.rewind(1, 2)
    assert again.closed == {2: [["a", 2]]}
    assert committed(out) == [["a", 1], ["b", 1]]
    again.process_batch([["c", 1]], None)  # the replay
    again.anchor_ready(3)
    again.checkpoint_complete(3)
    assert committed(out) == [["a", 1], ["b", 1], ["a", 2], ["c", 1]]
    # a replacement from epoch 1 (committed already) writes epoch 1 not again
    third = FileSink(path=str(out))
    third.open(ctx("exactly_once"))
    third.restore(snap1)
    third.rewind(2, 1)
    assert third.closed == {}
    assert third.commit({1: [["a", 1]]}) == 0  # a commit retried after it went through
    third.job_complete()
    assert committed(out) == [["a", 1], ["b", 1], ["a", 2], ["c", 1]]
    assert again.result() == {"written": 2, "dropped": {}, "files": 1}


def test_a_commit_killed_before_its_rename_leaves_nothing_visible(tmp_path, monkeypatch):
    out = tmp_path / "out"
    s = sink(out)
    s.process_batch([["a", 1]], None)
    snap = s.snapshot()
    s.anchor_ready(1)
    import typhoon.operators.file_sink as fs

    def killed(src, dst):
        raise KeyboardInterrupt  # the process dies between the write and the rename

    monkeypatch.setattr(fs.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        s.checkpoint_complete(1)
    monkeypatch.undo()
    assert committed(out) == [] and in_progress(out) == []
    # a SIGKILL leaves the in-progress file; the replacement removes it and commits again
    (out / ".part-job+sink+0-x-0000000001.jsonl").write_text('["a", 1]\n')
    again = FileSink(path=str(out))
    again.open(ctx("exactly_once"))
    assert in_progress(out) == []
    again.restore(snap)
    again.rewind(1, 1)
    again.job_complete()
    assert committed(out) == [["a", 1]]


def test_a_new_submission_starts_its_epochs_under_a_new_run(tmp_path):
    out = tmp_path / "out"
    first = sink(out)
    first.process_batch([["a", 1]], None)
    first.anchor_ready(1)
    first.checkpoint_complete(1)
    first.close()
    second = sink(out)  # epochs from 1 again: a stale record must not hide them
    second.process_batch([["b", 1]], None)
    second.anchor_ready(1)
    second.checkpoint_complete(1)
    assert sorted(committed(out)) == [["a", 1], ["b", 1]]
    assert len([f for f in out.iterdir()]) == 2


def test_bad_rows_are_counted_and_dead_lettered(tmp_path):
    out, dead = tmp_path / "out", tmp_path / "dead.jsonl"
    s = sink(out, guarantee="none", dead_letter=str(dead))
    s.process_batch([["a", 1], ["short"], ["b", b"\xff"], ["c", float("nan")], ["d", 2]], None)
    s.close()
    assert committed(out) == [["a", 1], ["d", 2]]
    assert s.result() == {
        "written": 2,
        "dropped": {"wrong_fields": 1, "not_json": 2},
        "files": 1,
    }
    letters = [json.loads(line) for line in dead.read_text().splitlines()]
    assert [d["reason"] for d in letters] == ["wrong_fields", "not_json", "not_json"]
    assert letters[0]["row"] == ["short"] and letters[1]["row"] == ["b", repr(b"\xff")]


def test_without_a_guarantee_parts_roll_by_size_and_commit_on_close(tmp_path):
    out = tmp_path / "out"
    s = sink(out, guarantee="none", format="csv", header=True, roll_bytes=200)
    s.BATCH = 10
    for i in range(50):
        s.process_batch([[f"w{i}", i]], None)
        # whatever is visible is whole: committed files never change or grow
        for f in out.iterdir():
            if not f.name.startswith("."):
                assert f.read_text().splitlines()[0] == "word,n"
    assert len(list(out.iterdir())) >= 2  # rolled by size before the end
    s.close()
    assert in_progress(out) == []
    rows = []
    for f in sorted(out.iterdir()):
        with open(f, newline="") as fh:
            body = list(csv.reader(fh))
        assert body[0] == ["word", "n"]
        rows += body[1:]
    assert rows == [[f"w{i}", str(i)] for i in range(50)]


def test_without_a_guarantee_parts_roll_by_age(tmp_path, monkeypatch):
    import typhoon.operators.file_sink as fs

    now = [1000.0]
    monkeypatch.setattr(fs.time, "monotonic", lambda: now[0])
    out = tmp_path / "out"
    s = sink(out, guarantee="none", roll_s=5)
    s.process_batch([["a", 1]], None)
    now[0] += 4
    s.process_batch([["b", 1]], None)
    assert committed(out) == []  # younger than roll_s, fewer than BATCH rows
    now[0] += 2
    s.process_batch([["c", 1]], None)
    assert committed(out) == [["a", 1], ["b", 1], ["c", 1]]
    s.close()


def test_at_least_once_rows_written_before_a_checkpoint_are_visible_at_it(tmp_path):
    out = tmp_path / "out"
    s = sink(out, guarantee="at_least_once")
    s.BATCH = 2
    s.process_batch([["a", 1], ["b", 1], ["c", 1]], None)  # a batch written to the open part
    assert committed(out) == [] and in_progress(out)
    snap = s.snapshot()  # the checkpoint holds no row: all of them must be committed
    assert snap["open"] == [] and committed(out) == [["a", 1], ["b", 1], ["c", 1]]
    s.process_batch([["d", 1], ["e", 1]], None)
    s.abandon()  # a rollback: the open part's rows come again by replay, not from it
    assert committed(out) == [["a", 1], ["b", 1], ["c", 1]] and in_progress(out) == []


def test_at_least_once_a_restored_instance_never_replaces_a_committed_part(tmp_path):
    """The framework replaces the operator on every rollback (a relaunch or in place) and
    restores the checkpoint into the new instance; its parts count from 1 again."""
    out = tmp_path / "out"
    s = sink(out, guarantee="at_least_once")
    s.BATCH = 1
    s.process_batch([["a", 1]], None)
    snap = s.snapshot()  # part 1 committed
    s.process_batch([["b", 1]], None)
    s.snapshot()  # part 2, after the checkpoint the rollback goes back to
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    assert len(before) == 2
    s.abandon()
    again = FileSink(path=str(out))
    again.open(ctx("at_least_once"))
    again.restore(snap)
    again.rewind(1, 1)
    again.BATCH = 1
    again.process_batch([["b", 1]], None)  # the replay
    again.snapshot()
    again.process_batch([["c", 1]], None)
    again.close()
    after = {f.name: f.read_bytes() for f in out.iterdir()}
    assert {k: after[k] for k in before} == before  # the committed parts as they were
    assert sorted(committed(out)) == [["a", 1], ["b", 1], ["b", 1], ["c", 1]]
    assert len(after) == 4 and in_progress(out) == []


def test_a_part_is_never_committed_over_an_existing_one(tmp_path):
    from typhoon.operators.file_sink import PartWriter

    final = tmp_path / "part-x-0000000001.jsonl"
    final.write_text('["old"]\n')
    w = PartWriter(final, "jsonl", ["w"], header=False)
    w.write('["new"]\n')
    with pytest.raises(FileExistsError, match="committed part"):
        w.commit()
    assert final.read_text() == '["old"]\n' and in_progress(tmp_path) == []


def test_parquet_rows_with_the_wrong_types_are_counted(tmp_path):
    import pyarrow.parquet as pq  # pyspark[sql] brings it into the venv

    out = tmp_path / "out"
    s = sink(out, format="parquet")
    s.process_batch([["a", 1], ["b", "not a number"], ["c", 3]], None)
    s.anchor_ready(1)
    s.checkpoint_complete(1)
    (f,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    assert f.suffix == ".parquet"
    assert pq.read_table(f).to_pylist() == [{"word": "a", "n": 1}, {"word": "c", "n": 3}]
    assert s.result()["dropped"] == {"wrong_type": 1}


def test_a_checkpoint_before_the_first_row_names_the_run_the_rows_commit_under(tmp_path):
    out = tmp_path / "out"
    s = sink(out)
    snap1 = s.snapshot()  # the first anchor comes before any row
    s.anchor_ready(1)
    s.process_batch([["a", 1]], None)
    s.anchor_ready(2)
    s.checkpoint_complete(2)
    assert committed(out) == [["a", 1]]
    # a replacement restored from epoch 1 (the doc's case of a later part failing to
    # verify): the record under the checkpoint's run says epoch 2 is committed
    again = FileSink(path=str(out))
    again.open(ctx("exactly_once"))
    again.restore(snap1)
    again.rewind(1, 1)
    assert again.committed_epoch() == 2
    again.process_batch([["a", 1]], None)  # the replay of epoch 2
    again.anchor_ready(2)
    again.checkpoint_complete(2)
    assert committed(out) == [["a", 1]]
