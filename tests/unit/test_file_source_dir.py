"""``file_source`` over a directory: files as splits owned by name hash, new files picked
up when following, a position per file in the offset, dot files skipped."""

from __future__ import annotations

import msgpack
import pytest
from test_file_source import read_all

from typhoon.operators import Context
from typhoon.operators.file_dir import owner
from typhoon.operators.file_sink import FileSink
from typhoon.operators.files import FileSource


def opened(path, index: int = 0, parallelism: int = 1, **args) -> FileSource:
    src = FileSource(path=str(path), **args)
    src.open(Context("t", "src", index, index, parallelism))
    return src


def read(src: FileSource, calls: int = 200) -> tuple[list[str], bool]:
    return read_all(src, batch=3, calls=calls)


def test_workers_share_the_files_and_skip_dot_files(tmp_path):
    names = [f"f{i}.log" for i in range(7)]
    for n in names:
        (tmp_path / n).write_text("".join(f"{n}:{j}\n" for j in range(5)) + f"{n}:last")
    (tmp_path / ".part-in-progress.log").write_text("never\n")
    (tmp_path / "other.txt").write_text("not matched\n")
    got = []
    for i in range(3):
        src = opened(tmp_path, i, 3, pattern="*.log")
        lines, more = read(src)
        assert not more
        mine = sorted({line.split(":")[0] for line in lines})
        assert mine == sorted(n for n in names if owner(n, 3) == i)  # whole files, by name
        for n in mine:  # each file's lines in order
            assert [x for x in lines if x.startswith(n)] == [f"{n}:{j}" for j in range(5)] + [
                f"{n}:last"
            ]
        got += lines
        assert src.result()["files"] == len(mine)
    assert sorted(got) == sorted(f"{n}:{j}" for n in names for j in [*range(5), "last"])
    with pytest.raises(FileNotFoundError, match="no file"):
        opened(tmp_path / "missing")


def test_following_picks_up_new_files_and_growth_and_stops_when_idle(tmp_path, monkeypatch):
    import typhoon.operators.file_dir as fd

    now = [100.0]
    monkeypatch.setattr(fd.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(fd.time, "sleep", lambda s: None)
    (tmp_path / "a").write_text("a1\n")
    src = opened(tmp_path, follow=True, idle_timeout_s=5)
    assert read(src, calls=3)[0] == ["a1"]
    with open(tmp_path / "a", "a") as f:
        f.write("a2\npartial")  # a writer in the middle of a line: not yet
    (tmp_path / "b").write_text("b1\n")
    now[0] += 1  # past RESCAN_S: the new file is seen
    lines, more = read(src, calls=3)
    assert sorted(lines) == ["a2", "b1"] and more
    with open(tmp_path / "a", "a") as f:
        f.write(" done\n")
    assert read(src, calls=3)[0] == ["partial done"]
    now[0] += 6  # idle_timeout_s without a new line
    assert read(src, calls=3) == ([], False)


def test_a_replacement_resumes_each_file_and_reads_files_that_came_later(tmp_path):
    for n in ("a", "b", "c"):
        (tmp_path / n).write_text("".join(f"{n}{j}\n" for j in range(4)))
    src = opened(tmp_path)
    first: list[str] = []
    src.next_batch(lambda v, stream="default": first.append(v[0]), 5)
    saved = msgpack.unpackb(msgpack.packb(src.offset()), strict_map_key=False)
    rest, _ = read(src)
    assert sorted(first + rest) == sorted(f"{n}{j}" for n in "abc" for j in range(4))
    (tmp_path / "d").write_text("d0\n")  # after the checkpoint
    again = opened(tmp_path)
    again.seek(saved)
    replay, more = read(again)
    assert sorted(replay) == sorted([*rest, "d0"]) and not more
    assert again.result()["emitted"] == 4 * 3 + 1 and again.result()["lines"] == 13
    with pytest.raises(ValueError, match="file positions"):
        again.seek({"positions": {"a": -1}})


def test_reads_what_file_sink_committed_and_never_its_parts_in_progress(tmp_path):
    out = tmp_path / "out"
    sink = FileSink(path=str(out), format="csv")
    sink.open(Context("j", "sink", 1, 0, 1, input_fields=["w"], guarantee="none"))
    sink.BATCH = 2
    sink.process_batch([["x"], ["y"]], None)  # written to an in-progress part
    src = opened(out)
    assert read(src) == ([], False)
    sink.close()  # committed
    assert read(opened(out)) == (["x", "y"], False)
