"""``file_source``: one tuple per line of a text file, optionally following it as it grows.

The file is read as bytes so the offset is a byte position: a checkpoint
records it, and a restarted worker seeks there and replays exactly the lines
that followed (guaranteed processing needs a replayable source).  A ``path``
that is a directory reads every file in it instead (typhoon.operators.file_dir).
"""

from __future__ import annotations

import codecs
import os
import time
from typing import Any, BinaryIO, ClassVar

from typhoon.operators.base import Context, Emit, Spout
from typhoon.operators.file_dir import DirectoryReader
from typhoon.operators.sources import _offset_int


class FileSource(Spout):
    """Lines ``[line]`` of the file at ``path``, without their newline.

    Args: ``rate`` tuples/s (0 = unlimited); ``follow`` keeps reading as the
    file grows (like ``tail -f``) until ``idle_timeout_s`` pass without a new
    line (never, if not given); ``encoding`` (undecodable bytes become U+FFFD).
    Worker ``index`` of ``P`` takes the lines whose number % P == index.  A last
    line without a newline is emitted at end of file only when not following:
    a writer may still be in the middle of it.  Lines end at a ``\\n`` byte, so
    the encoding must be ASCII-compatible (UTF-8, Latin-1, ...), not UTF-16.

    A ``path`` that is a directory when the worker starts: every file in it whose
    name matches ``pattern`` (a glob, default ``*``; names starting with a dot are
    skipped) is read whole by one worker, and with ``follow`` new files are picked
    up; the offset holds a position per file (typhoon.operators.file_dir).
    """

    fields: ClassVar[tuple[str, ...]] = ("line",)
    POLL_S: ClassVar[float] = 0.005  # wait when following and no line is there, not to spin

    def __init__(
        self,
        path: str,
        rate: float = 0.0,
        follow: bool = False,
        idle_timeout_s: float | None = None,
        encoding: str = "utf-8",
        pattern: str = "*",
    ) -> None:
        if not isinstance(path, str) or not path:
            raise ValueError("path must be a non-empty file path")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
            raise ValueError("rate must be a non-negative number")
        if not isinstance(follow, bool):
            raise ValueError("follow must be true or false")
        if idle_timeout_s is not None and (
            isinstance(idle_timeout_s, bool)
            or not isinstance(idle_timeout_s, (int, float))
            or idle_timeout_s <= 0
        ):
            raise ValueError("idle_timeout_s must be a positive number of seconds")
        try:
            codecs.lookup(encoding)
        except (LookupError, TypeError) as e:
            raise ValueError(f"encoding {encoding!r} is not a known text encoding") from e
        if not isinstance(pattern, str) or not pattern or "/" in pattern:
            raise ValueError("pattern must be a file name pattern like *.log")
        super().__init__(
            path=path, rate=rate, follow=follow, idle_timeout_s=idle_timeout_s, encoding=encoding,
            pattern=pattern,
        )  # fmt: skip
        self.path, self.follow, self.encoding = path, follow, encoding
        self.idle_timeout_s = idle_timeout_s
        self.rate = float(rate)
        self.pos = 0  # byte position of the next unread line
        self.line = 0  # its line number (0-based, over all workers' lines)
        self.emitted = 0
        self.index, self.parallelism = 0, 1
        self._file: BinaryIO | None = None
        self._last_data = 0.0
        self._dir: DirectoryReader | None = None
        if os.path.isdir(path):
            self._dir = DirectoryReader(path, follow, idle_timeout_s, encoding, pattern)

    def open(self, context: Context) -> None:
        super().open(context)
        if self._dir is not None:
            self._dir.open(context)
            return
        self.index, self.parallelism = context.index, context.parallelism
        try:
            self._file = open(self.path, "rb")
        except FileNotFoundError as e:
            raise FileNotFoundError(f"file_source: there is no file '{self.path}'") from e
        except OSError as e:
            raise OSError(f"file_source: cannot open '{self.path}' ({e.strerror or e})") from e
        self._last_data = time.monotonic()

    def close(self) -> None:
        if self._dir is not None:
            self._dir.close()
        if self._file is not None:
            self._file.close()
            self._file = None

    def offset(self) -> dict[str, Any]:
        if self._dir is not None:
            return self._dir.offset()
        return {"pos": self.pos, "line": self.line, "emitted": self.emitted}

    def seek(self, offset: Any) -> None:
        if self._dir is not None:
            self._dir.seek(offset)
            return
        assert self._file is not None, "open() not called"
        self.pos = _offset_int(offset, "pos", self)
        self.line = _offset_int(offset, "line", self)
        if isinstance(offset, dict) and "emitted" in offset:
            self.emitted = _offset_int(offset, "emitted", self)
        self._file.seek(self.pos)

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        if self._dir is not None:
            return self._dir.next_batch(emit, max_count)
        f = self._file
        assert f is not None, "open() not called"
        index, parallelism, encoding = self.index, self.parallelism, self.encoding
        n = 0
        read_any = False
        while n < max_count:
            raw = f.readline()
            if not raw.endswith(b"\n"):
                if raw and not self.follow:  # last line, no newline: the file is complete
                    self._take(raw, emit, index, parallelism, encoding)
                    return False
                if raw:
                    f.seek(self.pos)  # a writer is mid-line: read it again once it is whole
                if not self.follow:
                    return False
                if read_any:
                    self._last_data = time.monotonic()
                    return True
                if (
                    self.idle_timeout_s is not None
                    and time.monotonic() - self._last_data >= self.idle_timeout_s
                ):
                    return False
                time.sleep(self.POLL_S)
                return True
            read_any = True
            n += self._take(raw, emit, index, parallelism, encoding)
        if read_any:
            self._last_data = time.monotonic()
        return True

    def _take(self, raw: bytes, emit: Emit, index: int, parallelism: int, encoding: str) -> int:
        """Consume one line; emit it if it is this worker's.  Returns tuples emitted (0 or 1)."""
        number = self.line
        self.pos += len(raw)
        self.line = number + 1
        if number % parallelism != index:
            return 0
        if raw.endswith(b"\n"):
            raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
        emit([raw.decode(encoding, errors="replace")])
        self.emitted += 1
        return 1

    def result(self) -> dict[str, Any]:
        if self._dir is not None:
            return self._dir.result()
        return {"emitted": self.emitted, "lines": self.line, "offset": self.pos}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        """Tuples emitted add up; every worker reads the whole file, so lines and offset do
        not; over a directory each file has one reader, so everything adds up."""
        if any("files" in r for r in results):
            return {k: sum(r[k] for r in results) for k in ("emitted", "lines", "offset", "files")}
        return {
            "emitted": sum(r["emitted"] for r in results),
            "lines": max((r["lines"] for r in results), default=0),
            "offset": max((r["offset"] for r in results), default=0),
        }
