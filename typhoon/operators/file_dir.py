"""``file_source`` over a directory: every file in it is a split, new files are picked up.

A file belongs to the worker its name hashes to (CRC-32 of the name modulo the
worker count), so every worker and every replacement agrees on it without
talking to anyone, also for files that appear later: a round-robin deal of the
sorted names would move files between workers whenever a new name sorted in
between.  The offset holds a byte position per file; a recovery seeks every file
back there, and a file that came after the checkpoint starts from its beginning.
Files are expected to be appended to or left alone, not rewritten; names starting
with a dot are skipped (writers' in-progress files, ``file_sink``'s among them).
"""

from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import Any, ClassVar

from typhoon.operators.base import Context, Emit, Spout
from typhoon.operators.connectors import Entry, SplitSource


def owner(name: str, parallelism: int) -> int:
    """The worker index that reads file ``name``."""
    return zlib.crc32(name.encode("utf-8", "surrogateescape")) % parallelism


class DirectoryReader(SplitSource):
    """The lines of the files of ``path`` matching ``pattern``, one split per file."""

    RESCAN_S: ClassVar[float] = 0.5  # when following: look for new files this often

    def __init__(
        self,
        path: str,
        follow: bool,
        idle_timeout_s: float | None,
        encoding: str,
        pattern: str = "*",
    ) -> None:
        super().__init__()
        self.dir, self.follow, self.encoding = Path(path), follow, encoding
        self.idle_timeout_s, self.pattern = idle_timeout_s, pattern
        self.index, self.parallelism = 0, 1
        self.lines = 0  # lines consumed, over this worker's files
        self._scanned = 0.0
        self._last_data = 0.0

    def list_splits(self) -> list[str]:
        return sorted(
            p.name
            for p in self.dir.glob(self.pattern)
            if not p.name.startswith(".") and p.is_file()
        )

    def open(self, context: Context) -> None:
        Spout.open(self, context)
        self.index, self.parallelism = context.index, context.parallelism
        if not self.dir.is_dir():
            raise FileNotFoundError(f"file_source: there is no directory '{self.dir}'")
        self.splits = [s for s in self.list_splits() if owner(s, self.parallelism) == self.index]
        self.positions = {s: 0 for s in self.splits}
        self._scanned = self._last_data = time.monotonic()

    def _rescan(self) -> None:
        self._scanned = time.monotonic()
        for name in self.list_splits():
            if name not in self.positions and owner(name, self.parallelism) == self.index:
                self.splits.append(name)
                self.positions[name] = 0

    def offset(self) -> dict[str, Any]:
        return {**super().offset(), "lines": self.lines}

    def seek(self, offset: Any) -> None:
        positions = offset.get("positions") if isinstance(offset, dict) else None
        if not isinstance(positions, dict) or not all(
            isinstance(p, int) and p >= 0 for p in positions.values()
        ):
            raise ValueError(f"file_source cannot seek to {offset!r}: it needs file positions")
        # files found since the checkpoint start over; the checkpoint's files resume
        merged = {s: 0 for s in self.splits} | {str(s): p for s, p in positions.items()}
        self.splits = sorted(merged)
        super().seek({**offset, "positions": merged})
        self.lines = int(offset.get("lines", 0))

    def initial_position(self, split: str) -> int:
        return 0

    def ended(self, split: str, position: Any) -> bool:
        if self.follow:
            return False
        try:
            return position >= (self.dir / split).stat().st_size
        except FileNotFoundError:
            return True  # gone: nothing more to read from it

    def fetch(self, split: str, position: Any, max_count: int) -> list[Entry]:
        try:
            f = open(self.dir / split, "rb")
        except FileNotFoundError:
            return []
        out: list[Entry] = []
        with f:
            f.seek(position)
            for _ in range(max_count):
                raw = f.readline()
                if not raw.endswith(b"\n"):
                    if raw and not self.follow:  # a last line without a newline: complete
                        position += len(raw)
                        out.append((position, [raw.decode(self.encoding, "replace")], ""))
                    break  # following: a writer may be in the middle of the line
                position += len(raw)
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
                out.append((position, [raw.decode(self.encoding, "replace")], ""))
        self.lines += len(out)
        return out

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        now = time.monotonic()
        if self.follow and now - self._scanned >= self.RESCAN_S:
            self._rescan()
        before = self.emitted
        more = bool(self.splits) and super().next_batch(emit, max_count)
        if self.emitted > before:
            self._last_data = now
            return True
        if not self.follow:
            return more
        if self.idle_timeout_s is not None and now - self._last_data >= self.idle_timeout_s:
            return False
        if not self.splits:
            time.sleep(self.POLL_S)
        return True

    def result(self) -> dict[str, Any]:
        total = sum(int(p) for p in self.positions.values())
        return {"emitted": self.emitted, "lines": self.lines, "offset": total,
                "files": len(self.splits)}  # fmt: skip
