"""``file_sink``: tuples as rows of part files in a directory, committed by rename.

A reader lists the directory and reads the files whose names do not start with a
dot: those are committed and never change again.  Rows go first to an in-progress
file (``.part-...``, invisible), which is fsynced and renamed to ``part-...`` to
commit it; a rename is atomic, so a reader sees all of a part file or nothing.

* Under ``exactly_once`` it is a transactional sink (typhoon.operators.connectors):
  the rows of the epochs a global checkpoint completed are written to one new part
  file named after the newest of them, so the directory itself records the committed
  epoch and a replayed epoch is never written twice.  The names carry a run id that
  the checkpoint keeps: a new submission (epochs from 1 again) gets a new one.
* Otherwise rows are appended to the open part file, which is committed once it
  reaches ``roll_bytes`` or ``roll_s``, when the worker closes, and under
  ``at_least_once`` at every checkpoint (the rows written before it must be visible
  and durable before the checkpoint that no longer holds them is saved).  Each
  instance, a restored one too, numbers its parts from 1 under a run id of its own:
  the checkpoint's run would name the parts the dead instance committed, and a
  replay must add new parts (its rows possibly again), never replace one.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from typhoon.operators.base import Context, Emit
from typhoon.operators.connectors import RunIdSink, new_run_id

FORMATS = ("jsonl", "csv", "parquet")


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return None
    return pyarrow


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PartWriter:
    """One in-progress part file; ``commit()`` makes it visible (fsync, rename)."""

    def __init__(self, final: Path, fmt: str, columns: list[str], header: bool) -> None:
        self.final = final
        self.temp = final.with_name("." + final.name)
        self.fmt = fmt
        self.rows = 0
        self.columns = columns
        self._pq: Any = None
        if fmt == "parquet":
            self._file: Any = None
        else:
            self._file = open(self.temp, "w", encoding="utf-8", newline="")
            if fmt == "csv" and header:
                csv.writer(self._file).writerow(columns)

    def write(self, lines: Any) -> None:
        """``lines``: encoded text (jsonl, csv) or a pyarrow table (parquet)."""
        if self.fmt == "parquet":
            if self._pq is None:
                pq = _pyarrow().parquet
                self._pq = pq.ParquetWriter(str(self.temp), lines.schema)
            self._pq.write_table(lines)
            self.rows += lines.num_rows
            return
        self._file.write(lines)
        self._file.flush()

    def size(self) -> int:
        try:
            return self.temp.stat().st_size
        except FileNotFoundError:
            return 0

    def commit(self) -> bool:
        """Make the part visible; False (and no file) when nothing was written to it."""
        if self.fmt == "parquet":
            if self._pq is None:
                return False
            self._pq.close()
            fd = os.open(self.temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            self._file.flush()
            os.fsync(self._file.fileno())
            empty = self._file.tell() == 0
            self._file.close()
            if empty:
                self.temp.unlink(missing_ok=True)
                return False
        if self.final.exists():  # a committed part never changes: fail, do not replace it
            self.discard()
            raise FileExistsError(f"file_sink: the committed part '{self.final}' exists already")
        os.rename(self.temp, self.final)
        _fsync_dir(self.final.parent)
        return True

    def discard(self) -> None:
        if self._pq is not None:
            self._pq.close()
        elif self._file is not None:
            self._file.close()
        self.temp.unlink(missing_ok=True)


class FileSink(RunIdSink):
    """Rows of the input tuples in part files of the directory ``path``.

    Args: ``format``: ``jsonl`` (each row the tuple as a JSON array), ``csv`` (with
    ``header: true`` a first line of the input field names) or ``parquet`` (columns
    named after the input fields, types fixed by the first row; needs pyarrow);
    ``roll_bytes`` and ``roll_s`` (without ``exactly_once``: commit the open part file
    once it is that big or that old); ``dead_letter``: a file that gets each bad row
    as a JSON line ``{"reason", "row"}``.  A tuple whose length is not the input's
    field count (``wrong_fields``), that JSON cannot carry (``not_json``) or whose
    types differ from the parquet schema (``wrong_type``) is counted and left out.
    """

    BATCH: ClassVar[int] = 500

    def __init__(
        self,
        path: str,
        format: str = "jsonl",  # noqa: A002  (the topology file's word)
        header: bool = False,
        roll_bytes: int = 64 * 1024 * 1024,
        roll_s: float = 60.0,
        dead_letter: str | None = None,
    ) -> None:
        if not isinstance(path, str) or not path:
            raise ValueError("path must be a directory")
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}")
        if format == "parquet" and _pyarrow() is None:
            raise ValueError("format parquet needs pyarrow, which is not installed")
        if not isinstance(header, bool):
            raise ValueError("header must be true or false")
        if isinstance(roll_bytes, bool) or not isinstance(roll_bytes, int) or roll_bytes < 1:
            raise ValueError("roll_bytes must be a positive number of bytes")
        if isinstance(roll_s, bool) or not isinstance(roll_s, (int, float)) or roll_s <= 0:
            raise ValueError("roll_s must be a positive number of seconds")
        if dead_letter is not None and (not isinstance(dead_letter, str) or not dead_letter):
            raise ValueError("dead_letter must be a file path")
        super().__init__(
            path=path, format=format, header=header, roll_bytes=roll_bytes, roll_s=roll_s,
            dead_letter=dead_letter,
        )  # fmt: skip
        self.dir, self.fmt, self.header = Path(path), format, header
        self.roll_bytes, self.roll_s = roll_bytes, float(roll_s)
        self.dead_letter = dead_letter
        self.columns: list[str] = []
        self.prefix = ""
        self.run = ""
        self.seq = 0
        self.part: PartWriter | None = None
        self.schema: Any = None  # parquet: fixed by the first good row
        self.files = 0  # part files committed by this instance
        self.since: float | None = None  # the oldest row not committed yet came then

    def open(self, context: Context) -> None:
        super().open(context)
        self.columns = list(context.input_fields)
        # '+' is in no topology or node name: one worker's files never match another's
        self.prefix = f"part-{context.topology}+{context.node}+{context.index}-"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(f"file_sink: cannot use the directory '{self.dir}' ({e})") from None
        self.run = new_run_id()  # under exactly_once a restore puts back the checkpoint's
        if context.guarantee != "none":  # a dead predecessor's in-progress files: replayed
            for stale in self.dir.glob("." + self.prefix + "*"):
                stale.unlink(missing_ok=True)

    # ----- rows in, bad rows out -------------------------------------------------------

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        super().process_batch(self._good(rows), emit)
        if self.two_phase:
            return
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now - self.since >= self.roll_s:  # rows wait at most about roll_s
            self._write_open()
            self._roll()

    def _good(self, rows: list[list]) -> list[list]:
        n = len(self.columns) if self.columns else None
        good: list[list] = []
        json_ok = self.fmt != "jsonl" or _json_ok(rows)  # row by row only if not all are
        for r in rows:
            if n is not None and len(r) != n:
                self._bad("wrong_fields", r)
            elif self.fmt == "jsonl" and not json_ok and not _json_ok(r):
                self._bad("not_json", r)
            else:
                good.append(r)
        if self.fmt == "parquet" and good:
            good = self._typed(good)
        return good

    def _typed(self, rows: list[list]) -> list[list]:
        pa = _pyarrow()
        names = self._names(len(rows[0]))
        if self.schema is None:
            try:
                self.schema = pa.Table.from_pylist([dict(zip(names, rows[0], strict=True))]).schema
            except (pa.ArrowException, TypeError, ValueError):
                self._bad("wrong_type", rows[0])
                return self._typed(rows[1:]) if len(rows) > 1 else []
        try:
            self._table(rows)
            return rows
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass
        good = []
        for r in rows:
            try:
                self._table([r])
                good.append(r)
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                self._bad("wrong_type", r)
        return good

    def _names(self, n: int) -> list[str]:
        return self.columns if self.columns else [f"f{i}" for i in range(n)]

    def _table(self, rows: list[list]) -> Any:
        names = self.schema.names
        return _pyarrow().Table.from_pylist(
            [dict(zip(names, r, strict=True)) for r in rows], self.schema
        )

    def _bad(self, reason: str, row: list) -> None:
        self.drops.add(reason)
        if self.dead_letter:
            letter = json.dumps({"reason": reason, "row": row}, default=repr)
            with open(self.dead_letter, "a", encoding="utf-8") as f:
                f.write(letter + "\n")

    def _encode(self, rows: list[list]) -> Any:
        if self.fmt == "jsonl":
            return "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows)
        if self.fmt == "csv":
            buf = io.StringIO()
            csv.writer(buf).writerows(rows)
            return buf.getvalue()
        return self._table(rows)

    # ----- part files ------------------------------------------------------------------

    def _name(self, seq: int) -> Path:
        return self.dir / f"{self.prefix}{self.run}-{seq:010d}.{self.fmt}"

    def _new_part(self, seq: int) -> PartWriter:
        return PartWriter(self._name(seq), self.fmt, self._names(len(self.columns)), self.header)

    def _roll(self) -> None:
        self.since = None
        if self.part is not None:
            part, self.part = self.part, None
            if part.commit():
                self.files += 1

    # without exactly_once: append, roll by size and age
    def write(self, rows: list[list]) -> int:
        if self.part is None:
            self.seq += 1
            self.part = self._new_part(self.seq)
        self.part.write(self._encode(rows))
        if self.part.size() >= self.roll_bytes:
            self._roll()
        return len(rows)

    def snapshot(self) -> dict[str, Any]:
        if not self.two_phase:
            self._write_open()  # at_least_once: what the checkpoint will not hold is visible
            self._roll()
        return super().snapshot()  # with the run id (RunIdSink)

    # exactly_once: one part file per commit, named after its newest epoch
    def commit(self, epochs: dict[int, list[list]]) -> int:
        last = max(epochs)
        done = self.committed_epoch()
        if done is not None and done >= last:
            return 0
        rows = [r for e in sorted(epochs) if done is None or e > done for r in epochs[e]]
        if not rows:
            return 0  # nothing to write twice: an epoch without rows needs no record
        part = self._new_part(last)
        try:
            part.write(self._encode(rows))
            part.commit()
        except BaseException:
            part.discard()
            raise
        self.files += 1
        return len(rows)

    def committed_epoch(self) -> int | None:
        start = f"{self.prefix}{self.run}-"
        names = [p.name[len(start) : -len(self.fmt) - 1] for p in self.dir.glob(f"{start}*")]
        return max((int(n) for n in names if n.isdigit()), default=None)

    def close(self) -> None:
        super().close()
        self._roll()

    def abandon(self) -> None:
        """A rollback: rows in the open part came after the newest checkpoint, so the
        replay brings them again; the part is dropped, not committed."""
        if self.part is not None:
            self.part.discard()
            self.part = None
        super().abandon()

    def result(self) -> dict[str, Any]:
        return {**super().result(), "files": self.files}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        merged = super().merge_results(results)
        return {**merged, "files": sum(r.get("files", 0) for r in results)}


def _json_ok(row: list) -> bool:
    try:
        json.dumps(row, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
