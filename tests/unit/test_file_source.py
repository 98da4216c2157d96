"""``file_source``: lines as tuples, sharing among workers, following a growing file, offsets."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from typhoon.operators import BUILTINS, Context
from typhoon.operators.files import FileSource
from typhoon.topology import load_topology_text


def ctx(index: int = 0, parallelism: int = 1) -> Context:
    return Context("t", "src", index, index, parallelism)


def read_all(src: FileSource, batch: int = 10, calls: int = 1000) -> tuple[list[str], bool]:
    out: list[str] = []
    more = True
    for _ in range(calls):
        more = src.next_batch(lambda v, stream="default": out.append(v[0]), batch)
        if not more:
            break
    return out, more


def opened(path: Path, index: int = 0, parallelism: int = 1, **args) -> FileSource:
    src = FileSource(path=str(path), **args)
    src.open(ctx(index, parallelism))
    return src


def test_registered_with_one_field():
    assert BUILTINS["file_source"] is FileSource
    assert FileSource.output_fields({"path": "x"}, []) == ["line"]


def test_lines_without_newlines_and_a_last_partial_line(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"one\ntwo\r\n\nfour")
    src = opened(f)
    lines, more = read_all(src, batch=2)
    assert lines == ["one", "two", "", "four"] and not more
    assert src.result() == {"emitted": 4, "lines": 4, "offset": 14}


def test_workers_share_lines_by_number(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("".join(f"{i}\n" for i in range(10)))
    got = [read_all(opened(f, i, 3))[0] for i in range(3)]
    assert got == [["0", "3", "6", "9"], ["1", "4", "7"], ["2", "5", "8"]]
    results = []
    for i in range(3):
        s = opened(f, i, 3)
        read_all(s)
        results.append(s.result())
    assert FileSource.merge_results(results) == {"emitted": 10, "lines": 10, "offset": 20}


def test_undecodable_bytes_are_replaced(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"ok\n\xff\xfebad\n")
    assert read_all(opened(f))[0] == ["ok", "\ufffd\ufffdbad"]
    g = tmp_path / "b.txt"
    g.write_bytes("caf\xe9\n".encode("latin-1"))
    assert read_all(opened(g, encoding="latin-1"))[0] == ["café"]


def test_missing_file_fails_at_open_naming_it(tmp_path):
    src = FileSource(path=str(tmp_path / "nope.txt"))
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        src.open(ctx())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"path": ""}, "path must be"),
        ({"path": "x", "rate": -1}, "rate must be"),
        ({"path": "x", "follow": "yes"}, "follow must be"),
        ({"path": "x", "idle_timeout_s": 0}, "idle_timeout_s must be"),
        ({"path": "x", "encoding": "klingon"}, "encoding 'klingon'"),
    ],
)
def test_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        FileSource(**args)


def test_follow_waits_for_whole_lines_and_new_data(tmp_path):
    f = tmp_path / "log.txt"
    f.write_bytes(b"a\nb")
    src = opened(f, follow=True)
    lines, more = read_all(src, calls=3)
    assert lines == ["a"] and more  # 'b' may still be being written
    with f.open("ab") as w:
        w.write(b"c\nd\n")
    lines, more = read_all(src, calls=3)
    assert lines == ["bc", "d"] and more
    assert src.offset() == {"pos": 7, "line": 3, "emitted": 3}


def test_follow_ends_after_idle_timeout(tmp_path):
    f = tmp_path / "log.txt"
    f.write_text("x\n")
    src = opened(f, follow=True, idle_timeout_s=0.05)
    lines, more = read_all(src, calls=100_000)
    assert lines == ["x"] and not more


def test_offset_survives_msgpack_and_resumes(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("".join(f"line {i}\n" for i in range(50)))
    first = opened(f, 1, 2)
    head, _ = read_all(first, batch=7, calls=2)
    off = msgpack.unpackb(msgpack.packb(first.offset(), use_bin_type=True), raw=False)
    second = opened(f, 1, 2)
    second.seek(off)
    tail, more = read_all(second, batch=7)
    assert head + tail == [f"line {i}" for i in range(1, 50, 2)] and not more
    assert second.result() == {"emitted": 25, "lines": 50, "offset": f.stat().st_size}


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    chunks=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\r", b"")), max_size=8),
    batch=st.integers(1, 5),
)
def test_following_a_file_written_in_chunks_sees_every_whole_line(tmp_path_factory, chunks, batch):
    f = tmp_path_factory.mktemp("follow") / "log.txt"
    f.write_bytes(b"")
    src = opened(f, follow=True)
    src.POLL_S = 0.0  # type: ignore[misc]  # no need to wait: the test is the only writer
    got: list[str] = []
    for chunk in chunks:
        with f.open("ab") as w:
            w.write(chunk)
        got += read_all(src, batch=batch, calls=50)[0]
    data = b"".join(chunks)
    whole = data[: data.rfind(b"\n") + 1] if b"\n" in data else b""
    expected = [x.decode("utf-8", errors="replace") for x in whole.split(b"\n")[:-1]]
    assert got == expected
    assert src.offset()["pos"] == len(whole)


def test_loads_in_a_topology(tmp_path):
    text = f"""
name: t
spouts: [{{id: lines, operator: file_source, args: {{path: {tmp_path}/x.txt, follow: true}}}}]
bolts: [{{id: split, operator: split_words}}]
streams: [{{from: lines, to: split, grouping: shuffle}}]
"""
    topo = load_topology_text(text)
    assert topo.nodes["lines"].output_fields == ("line",)
