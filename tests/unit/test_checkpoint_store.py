"""Checkpoint store: atomic framed writes, damage detection, fallback to the previous epoch."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from typhoon.checkpoint import (
    DEFAULT_STORE,
    CheckpointError,
    CheckpointStore,
    CorruptCheckpoint,
    open_store,
)

PARTS = {"count-0", "count-1", "source-0"}


def fill(store: CheckpointStore, epoch: int, parts=PARTS) -> None:
    for p in sorted(parts):
        store.write(epoch, p, f"{p}@{epoch}".encode() * 10)


def part_file(root: Path, epoch: int, part: str, app: str = "app") -> Path:
    return root / app / f"{epoch:012d}" / f"{part}.ckpt"


def test_round_trip_and_listing(tmp_path):
    store = open_store(f"file://{tmp_path}", "app")
    fill(store, 3)
    fill(store, 1)
    store.write(2, "count-0", b"")
    assert store.read(3, "count-1") == b"count-1@3" * 10
    assert store.read(2, "count-0") == b""
    assert store.epochs() == [1, 2, 3]
    assert store.parts(3) == PARTS and store.parts(2) == {"count-0"}
    assert part_file(tmp_path, 3, "count-0").exists()
    assert store.latest_complete(PARTS) == 3
    assert store.latest_complete({"count-0"}) == 3
    assert not [p for p in (tmp_path / "app").rglob("*") if p.name.startswith(".")]


def test_overwrite_replaces_atomically(tmp_path):
    store = open_store(str(tmp_path), "app")
    store.write(1, "a-0", b"old")
    store.write(1, "a-0", b"new")
    assert store.read(1, "a-0") == b"new"


def test_corrupt_byte_is_detected_and_previous_epoch_used(tmp_path, caplog):
    store = open_store(str(tmp_path), "app")
    fill(store, 1)
    fill(store, 2)
    f = part_file(tmp_path, 2, "count-1")
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="count-1.ckpt fails its checksum"):
        store.read(2, "count-1")
    with caplog.at_level(logging.WARNING):
        assert store.latest_complete(PARTS) == 1
    assert "epoch 2" in caplog.text and "count-1" in caplog.text


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:-1], "truncated"),
        (lambda b: b[:10], "truncated"),
        (lambda b: b"", "truncated"),
        (lambda b: b + b"x", "padded"),
        (lambda b: b"XXXX" + b[4:], "bad magic"),
        (lambda b: b[:4] + b"\x00\x09" + b[6:], "format version 9"),
    ],
)
def test_damaged_headers(tmp_path, damage, message):
    store = open_store(str(tmp_path), "app")
    fill(store, 1)
    fill(store, 2)
    f = part_file(tmp_path, 2, "source-0")
    f.write_bytes(damage(f.read_bytes()))
    with pytest.raises(CorruptCheckpoint, match=message):
        store.read(2, "source-0")
    assert store.latest_complete(PARTS) == 1


def test_missing_part_and_incomplete_epoch(tmp_path, caplog):
    store = open_store(str(tmp_path), "app")
    fill(store, 1)
    fill(store, 2, PARTS - {"count-1"})  # the crash came before this worker's part
    with pytest.raises(CheckpointError, match="cannot read checkpoint .*count-1.ckpt") as e:
        store.read(2, "count-1")
    assert not isinstance(e.value, CorruptCheckpoint)
    with caplog.at_level(logging.WARNING):
        assert store.latest_complete(PARTS) == 1
    assert "epoch 2" in caplog.text and "missing count-1" in caplog.text
    assert open_store(str(tmp_path), "other").latest_complete(PARTS) is None


def test_manifests_and_prune(tmp_path):
    store = open_store(str(tmp_path), "app")
    for e in range(1, 6):
        fill(store, e)
    for e in (1, 2, 3):
        store.mark_complete(e, {"offsets": {"source-0": e * 10}, "parts": sorted(PARTS)})
    assert store.completed() == [1, 2, 3]
    assert store.manifest(2)["offsets"] == {"source-0": 20}
    m = tmp_path / "app" / f"{3:012d}" / "manifest.json"
    m.write_text(m.read_text().replace("30", "31"))
    assert store.completed() == [1, 2]
    with pytest.raises(CorruptCheckpoint, match="manifest.json is damaged"):
        store.manifest(3)
    store.prune(5)  # epoch 2 is the newest complete one: it stays
    assert store.epochs() == [2, 3, 4, 5]
    store.mark_complete(5, {})
    store.prune(5)
    assert store.epochs() == [5] and store.completed() == [5]
    with pytest.raises(ValueError, match="not JSON data"):
        store.mark_complete(6, {"x": object()})


@pytest.mark.parametrize("bad", ["", "..", "a/b", "../x", "a\\b", ".hidden", "a..b", "x y"])
def test_names_are_checked(tmp_path, bad):
    store = open_store(str(tmp_path), "app")
    with pytest.raises(ValueError, match="part name"):
        store.write(1, bad, b"x")
    with pytest.raises(ValueError, match="app name"):
        open_store(str(tmp_path), bad)


def test_epoch_is_checked(tmp_path):
    store = open_store(str(tmp_path), "app")
    with pytest.raises(ValueError, match="epoch must be"):
        store.write(-1, "a-0", b"")
    with pytest.raises(ValueError, match="epoch must be"):
        store.read(10**12, "a-0")


def test_urls(tmp_path, monkeypatch):
    assert DEFAULT_STORE == "file:///var/tmp/typhoon/checkpoints"
    assert open_store(f"file://localhost{tmp_path}", "a").root == str(tmp_path / "a")
    with pytest.raises(CheckpointError, match="unknown scheme 'ftp'"):
        open_store("ftp://host/x", "a")
    with pytest.raises(CheckpointError, match="relative/path"):
        open_store("relative/path", "a")
    with pytest.raises(CheckpointError, match="absolute local path"):
        open_store("file://host/x", "a")


def test_default_store(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(
        CheckpointStore, "local", classmethod(lambda cls, root, app, url=None: seen.append(url))
    )
    open_store(None, "a")
    open_store("", "a")
    assert seen == [DEFAULT_STORE, DEFAULT_STORE]


def test_pyarrow_scheme_errors_are_checkpoint_errors():
    with pytest.raises(CheckpointError, match="hdfs://nowhere.invalid:1/x"):
        open_store("hdfs://nowhere.invalid:1/x", "a")  # no libhdfs here, or no namenode


def test_unusable_directories_fail_at_open(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match=f"{blocker}/sub .*not a directory"):
        open_store(str(blocker / "sub"), "a")
    with pytest.raises(CheckpointError, match="/proc/typhoon-ckpt"):
        open_store("/proc/typhoon-ckpt", "a")


def test_write_failure_keeps_earlier_epochs(tmp_path):
    store = open_store(str(tmp_path), "app")
    fill(store, 1)
    (tmp_path / "app" / f"{2:012d}").write_text("a file where the epoch directory goes")
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*000000000002"):
        store.write(2, "count-0", b"x")
    assert store.epochs() == [1] and store.latest_complete(PARTS) == 1
    # the directory vanishes between makedirs and the write
    store.write(3, "count-0", b"x")
    os.rename(tmp_path / "app" / f"{3:012d}", tmp_path / "gone")
    real = store._fs.makedirs
    store._fs.makedirs = lambda path: None
    try:
        with pytest.raises(CheckpointError, match="no such file"):
            store.write(3, "count-1", b"y")
    finally:
        store._fs.makedirs = real
    assert store.read(1, "count-0") == b"count-0@1" * 10


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:  # `make test` runs as root: a failure, not a skip
        pytest.fail(f"cannot mount a 64 KB tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk(tiny_tmpfs):
    store = open_store(str(tiny_tmpfs), "app")
    store.write(1, "count-0", b"a" * 1000)
    store.mark_complete(1, {})
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*no space left"):
        store.write(2, "count-0", b"b" * 200_000)
    assert store.read(1, "count-0") == b"a" * 1000
    assert store.latest_complete({"count-0"}) == 1
    leftovers = [p.name for p in tiny_tmpfs.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_read_only_file_system(tiny_tmpfs):
    store = open_store(str(tiny_tmpfs), "app")
    store.write(1, "count-0", b"a")
    r = subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], capture_output=True)
    if r.returncode != 0:
        pytest.fail(f"cannot remount the tmpfs read-only: {r.stderr!r}")
    with pytest.raises(CheckpointError, match="read-only file system"):
        store.write(2, "count-0", b"b")
    with pytest.raises(CheckpointError, match="read-only file system"):
        open_store(str(tiny_tmpfs), "other")
    assert store.read(1, "count-0") == b"a" and store.epochs() == [1]


def test_pyarrow_file_system(tmp_path, caplog):
    import pyarrow.fs as pafs  # in the dev venv (PySpark's): missing is a failure

    store = CheckpointStore.arrow(pafs.LocalFileSystem(), str(tmp_path / "arrow"), "app")
    fill(store, 1)
    fill(store, 2)
    assert store.read(2, "count-0") == b"count-0@2" * 10
    assert store.epochs() == [1, 2] and store.parts(1) == PARTS
    store.mark_complete(1, {"n": 1})
    assert store.completed() == [1] and store.manifest(1) == {"n": 1}
    f = tmp_path / "arrow" / "app" / f"{2:012d}" / "count-0.ckpt"
    f.write_bytes(f.read_bytes()[:-2])
    with pytest.raises(CorruptCheckpoint):
        store.read(2, "count-0")
    with caplog.at_level(logging.WARNING):
        assert store.latest_complete(PARTS) == 1
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        store.read(7, "count-0")
    (tmp_path / "arrow" / "app" / f"{3:012d}").write_text("blocker")
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        store.write(3, "count-0", b"x")
    store.prune(2)
    assert store.epochs() == [1, 2]  # epoch 1 is the newest complete one
    store.mark_complete(2, {})
    store.prune(2)
    assert store.epochs() == [2]
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(CheckpointError, match="cannot be used"):
        CheckpointStore.arrow(pafs.LocalFileSystem(), str(blocker / "x"), "app")


def test_files_are_framed(tmp_path):
    store = open_store(str(tmp_path), "app")
    store.write(1, "a-0", b"payload")
    raw = part_file(tmp_path, 1, "a-0").read_bytes()
    assert raw.startswith(b"TYCK") and raw.endswith(b"payload") and len(raw) == 46 + 7
    assert Path(store.root) == tmp_path / "app"
