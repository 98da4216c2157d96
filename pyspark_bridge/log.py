"""The offset log: what a spark node's worker received, in order, for Spark to read by range.

The worker appends; the ``typhoon`` source reads ranges and records what Spark
committed; the worker then trims.  One directory per worker,
``<node dir>/in/w<worker_id>/``:

* ``<pos:020d>.seg`` -- segments: concatenated msgpack arrays, one per tuple,
  named by the byte position of their first record in the worker's whole log.
  A segment is closed once it holds ``segment_bytes``; a new one starts.
* ``head`` -- ``{"pos", "seq"}``: end of the durable records.  Replaced
  atomically after the data is written, so a reader never sees a torn record.
* ``commit`` -- ``{"pos", "seq"}``: what Spark committed (written by the source).
* ``eos`` -- ``{"pos", "seq"}``: the final head, once the worker's input ended.
* ``anchors``, ``closed`` -- under a guarantee only (``anchors.py``, ``driver.py``).

An offset is ``{"pos": byte position, "seq": tuple number}``; Spark's source
offset is ``{"<worker_id>": offset, ...}``.  Positions never go back: trimming
deletes whole closed segments below the committed position.  Tuples are
msgpack (never pickle): they came off the network.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEGMENT_BYTES = 8 << 20
ZERO = {"pos": 0, "seq": 0}


def write_json(path: Path, obj: Any) -> None:
    """Replace ``path`` atomically (readers see the old or the new file, never half)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return default


def worker_dir(node_dir: str | Path, worker_id: int | str) -> Path:
    return Path(node_dir) / "in" / f"w{worker_id}"


def worker_ids(node_dir: str | Path, configured: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``configured`` worker IDs, then those of any other log under ``in/`` (added workers).

    A worker creates its log directory when it opens, so a worker that a
    scale-up adds is seen from the first look after its launch.
    """
    seen = set(configured)
    try:
        names = sorted(os.listdir(Path(node_dir) / "in"))
    except FileNotFoundError:
        names = []
    ids = sorted(int(n[1:]) for n in names if n.startswith("w") and n[1:].isdigit())
    return [*configured, *(str(w) for w in ids if str(w) not in seen)]


def segments(log_dir: Path) -> list[int]:
    """Start positions of the segments present, ascending."""
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-4]) for n in names if n.endswith(".seg") and n[:-4].isdigit())


def _segment_path(log_dir: Path, start: int) -> Path:
    return log_dir / f"{start:020d}.seg"


def read_range(log_dir: Path, start: int, end: int) -> bytes:
    """Bytes of the records in ``[start, end)`` (positions from offsets, below ``head``)."""
    starts = segments(log_dir)
    if end <= start:
        return b""
    if not starts or starts[0] > start:
        raise FileNotFoundError(
            f"{log_dir}: position {start} was trimmed; the Spark checkpoint does not match this log"
        )
    parts = []
    for i, s in enumerate(starts):
        e = starts[i + 1] if i + 1 < len(starts) else end
        lo, hi = max(start, s), min(end, e)
        if lo >= hi:
            continue
        with open(_segment_path(log_dir, s), "rb") as f:
            f.seek(lo - s)
            data = f.read(hi - lo)
        if len(data) != hi - lo:
            raise OSError(f"{log_dir}: segment {s} is shorter than its head says")
        parts.append(data)
    return b"".join(parts)


@dataclass
class LogStats:
    appended: int = 0
    flushes: int = 0
    trimmed_segments: int = 0


class OffsetLog:
    """The writing side, owned by one worker; reopening continues after the last durable record."""

    def __init__(self, log_dir: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.stats = LogStats()
        head = read_json(self.dir / "head", ZERO)
        self.pos, self.seq = int(head["pos"]), int(head["seq"])
        self.buf: list[bytes] = []
        self.buf_bytes = 0
        self._recover()
        (self.dir / "eos").unlink(missing_ok=True)  # reopened: the worker takes input again

    def _recover(self) -> None:
        """Drop anything written after the last head (a torn tail), open the segment to append."""
        starts = segments(self.dir)
        for s in [s for s in starts if s > self.pos]:
            _segment_path(self.dir, s).unlink()
        starts = [s for s in starts if s <= self.pos]
        self.seg_start = starts[-1] if starts else self.pos
        path = _segment_path(self.dir, self.seg_start)
        self.file = open(path, "ab")  # noqa: SIM115 - kept open while the worker runs
        self.file.truncate(self.pos - self.seg_start)
        self.file.seek(0, os.SEEK_END)

    def append(self, record: bytes) -> None:
        """Buffer one msgpack-encoded tuple; it becomes visible to Spark at the next flush."""
        self.buf.append(record)
        self.buf_bytes += len(record)

    def flush(self) -> bool:
        """Write buffered records and publish the new head; True if there was anything."""
        if not self.buf:
            return False
        data = b"".join(self.buf)
        self.file.write(data)
        self.file.flush()
        self.pos += len(data)
        self.seq += len(self.buf)
        self.stats.appended += len(self.buf)
        self.stats.flushes += 1
        self.buf, self.buf_bytes = [], 0
        write_json(self.dir / "head", self.offset())
        if self.pos - self.seg_start >= self.segment_bytes:
            self.file.close()
            self.seg_start = self.pos
            self.file = open(_segment_path(self.dir, self.pos), "ab")  # noqa: SIM115
        return True

    def offset(self) -> dict[str, int]:
        return {"pos": self.pos, "seq": self.seq}

    def committed(self) -> dict[str, int]:
        return read_json(self.dir / "commit", ZERO)

    def trim(self, limit: int | None = None) -> int:
        """Delete closed segments that end at or below what Spark committed (and ``limit``)."""
        upto = int(self.committed()["pos"])
        if limit is not None:
            upto = min(upto, limit)
        starts = segments(self.dir)
        n = 0
        for s, nxt in zip(starts, starts[1:], strict=False):
            if nxt <= upto and s != self.seg_start:
                _segment_path(self.dir, s).unlink(missing_ok=True)
                n += 1
        self.stats.trimmed_segments += n
        return n

    def mark_eos(self) -> None:
        """Input ended: flush and record the final head for the driver."""
        self.flush()
        write_json(self.dir / "eos", self.offset())

    def close(self) -> None:
        self.flush()
        self.file.close()


def commit_offset(log_dir: Path, offset: dict[str, int]) -> None:
    """Record that Spark committed up to ``offset`` (never moves back)."""
    path = Path(log_dir) / "commit"
    if int(read_json(path, ZERO)["pos"]) < int(offset["pos"]):
        write_json(path, {"pos": int(offset["pos"]), "seq": int(offset["seq"])})
