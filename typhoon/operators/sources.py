"""Built-in spouts: numbered tuples for loss checks and generated sentences for wordcount.

Both are deterministic, so tests and benchmarks can compute the expected
result from the same arguments without running anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import islice
from typing import Any, ClassVar

from typhoon.operators.base import Context, Emit, Spout

_MASK64 = (1 << 64) - 1
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "so", "vi", "de", "po", "xu", "be", "fa", "gi")


def _mix(x: int) -> int:
    """splitmix64 finaliser: a cheap, stable per-position random number."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def vocabulary(size: int) -> list[str]:
    """``size`` distinct pronounceable words, the same list every time."""
    words = []
    n = len(_SYLLABLES)
    for k in range(size):
        parts = []
        v = k
        while True:
            parts.append(_SYLLABLES[v % n])
            v //= n
            if v == 0:
                break
        words.append("".join(parts))
    return words


def sentence(i: int, seed: int, words: int, vocab: list[str]) -> str:
    """Sentence number ``i``: word frequencies are skewed (a product of two uniform picks)."""
    v = len(vocab)
    out = []
    base = (seed * 0x100000001B3 + i * 0x1F) & _MASK64
    for j in range(words):
        r = _mix(base + j)
        idx = ((r & 0xFFFFFFFF) % v) * ((r >> 32) % v) // v
        out.append(vocab[idx])
    return " ".join(out)


def generate_sentences(
    count: int, seed: int = 1, words: int = 8, vocabulary_size: int = 1000
) -> Iterator[str]:
    """Every sentence ``sentence_source`` with these arguments emits, over all its workers."""
    vocab = vocabulary(vocabulary_size)
    for i in range(count):
        yield sentence(i, seed, words, vocab)


def _strip_newline(line: str) -> str:
    """A line without its ``\\n`` or ``\\r\\n`` ending."""
    if line.endswith("\n"):
        line = line[:-2] if line.endswith("\r\n") else line[:-1]
    return line


def _offset_int(offset: Any, key: str, spout: Spout) -> int:
    """``offset[key]`` as a non-negative int; a clear error for an offset of another source."""
    value = offset.get(key) if isinstance(offset, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"{type(spout).__name__} cannot seek to {offset!r}: "
            f"it needs a mapping with a non-negative integer '{key}'"
        )
    return value


class CountingSpout(Spout):
    """A spout whose result is the number of tuples it emitted (``emitted``) and whose
    offset, unless it overrides :meth:`offset`/:meth:`seek`, is that number.  ``index``
    and ``parallelism`` (this worker's share of the input) are the context's once open."""

    emitted: int = 0
    index: int = 0
    parallelism: int = 1

    def open(self, context: Context) -> None:
        super().open(context)
        self.index, self.parallelism = context.index, context.parallelism

    def offset(self) -> dict[str, int]:
        return {"emitted": self.emitted}

    def seek(self, offset: Any) -> None:
        self.emitted = _offset_int(offset, "emitted", self)

    def result(self) -> dict[str, Any]:
        return {"emitted": self.emitted}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {"emitted": sum(r["emitted"] for r in results)}


class SequenceSource(Spout):
    """Numbered tuples ``[src, seq, ts, payload]`` for loss, order and latency checks.

    Args: ``count`` tuples per worker (omit for an endless source), ``size``
    payload bytes, ``rate`` tuples/s per worker (0 = as fast as possible).
    """

    fields: ClassVar[tuple[str, ...]] = ("src", "seq", "ts", "payload")

    def __init__(self, count: int | None = None, size: int = 100, rate: float = 0.0) -> None:
        if count is not None and (not isinstance(count, int) or count < 0):
            raise ValueError("count must be a non-negative integer")
        if not isinstance(size, int) or size < 0:
            raise ValueError("size must be a non-negative integer")
        if not isinstance(rate, (int, float)) or rate < 0:
            raise ValueError("rate must be a non-negative number")
        super().__init__(count=count, size=size, rate=rate)
        self.count = count
        self.payload = b"x" * size
        self.rate = float(rate)
        self.next_seq = 0
        self.src = 0

    def open(self, context: Context) -> None:
        super().open(context)
        self.src = context.worker_id

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        n = max_count if self.count is None else min(max_count, self.count - self.next_seq)
        seq, src, payload, now = self.next_seq, self.src, self.payload, time.time()
        for s in range(seq, seq + n):
            emit([src, s, now, payload])
        self.next_seq = seq + n
        return self.count is None or self.next_seq < self.count

    def next_rows(self, emit_rows: Emit, max_count: int) -> bool:
        """:meth:`next_batch` with one ``emit_rows`` call for the whole chunk."""
        n = max_count if self.count is None else min(max_count, self.count - self.next_seq)
        seq, src, payload, now = self.next_seq, self.src, self.payload, time.time()
        emit_rows([[src, s, now, payload] for s in range(seq, seq + n)])
        self.next_seq = seq + n
        return self.count is None or self.next_seq < self.count

    def offset(self) -> dict[str, int]:
        return {"seq": self.next_seq}

    def seek(self, offset: Any) -> None:
        self.next_seq = _offset_int(offset, "seq", self)

    def result(self) -> dict[str, Any]:
        return {"emitted": self.next_seq, "src": self.src}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {
            "emitted": sum(r["emitted"] for r in results),
            "per_source": {str(r["src"]): r["emitted"] for r in results},
        }


class SequenceColumns(SequenceSource):
    """:class:`SequenceSource`'s tuples generated as columns with numpy and sent with
    ``emit_columns`` (no Python object per tuple): for a stream that declares
    ``columns: {src: int64, seq: int64, ts: float64, payload: bytes}`` the source
    sends column blocks as it makes them (docs/topology.md).  Same arguments, tuples,
    offsets and results as ``sequence_source``."""

    CHUNK_BYTES = 4 << 20  # payload bytes of one chunk at most (a turn's columns)

    def __init__(self, count: int | None = None, size: int = 100, rate: float = 0.0) -> None:
        super().__init__(count=count, size=size, rate=rate)
        self._made = 0  # rows the cached payload column holds
        self._payload: Any = None

    def next_columns(self, emit_columns: Emit, max_count: int) -> bool:
        """Up to ``max_count`` tuples as one call of ``emit_columns``."""
        import numpy as np

        from typhoon.wire.columns import VarColumn

        size = len(self.payload)
        n = min(max_count, max(1, self.CHUNK_BYTES // max(1, size)))
        n = n if self.count is None else min(n, self.count - self.next_seq)
        if n > 0:
            if n > self._made:  # every payload is the same: one column serves every chunk
                offsets = np.arange(0, (n + 1) * size, max(1, size), dtype=np.uint32)[: n + 1]
                self._payload = VarColumn(offsets, self.payload * n, False)
                self._made = n
            seq = self.next_seq
            emit_columns(
                {
                    "src": np.full(n, self.src, dtype=np.int64),
                    "seq": np.arange(seq, seq + n, dtype=np.int64),
                    "ts": np.full(n, time.time(), dtype=np.float64),
                    "payload": self._payload.slice(0, n),
                }
            )
            self.next_seq = seq + n
        return self.count is None or self.next_seq < self.count


class SentenceSource(CountingSpout):
    """Sentences ``[sentence]``, generated from a seed or read from a file.

    Args: ``count`` sentences in total over all workers (worker i takes
    sentences i, i+P, ...), ``seed``, ``words`` per sentence,
    ``vocabulary`` size; or ``path`` to a text file (one sentence per line).
    """

    fields: ClassVar[tuple[str, ...]] = ("sentence",)

    def __init__(
        self,
        count: int = 10000,
        seed: int = 1,
        words: int = 8,
        vocabulary: int = 1000,
        path: str | None = None,
        rate: float = 0.0,
    ) -> None:
        for name, val, low in (
            ("count", count, 0),
            ("words", words, 1),
            ("vocabulary", vocabulary, 1),
        ):
            if not isinstance(val, int) or val < low:
                raise ValueError(f"{name} must be an integer >= {low}")
        if not isinstance(seed, int):
            raise ValueError("seed must be an integer")
        if not isinstance(rate, (int, float)) or rate < 0:
            raise ValueError("rate must be a non-negative number")
        super().__init__(
            count=count, seed=seed, words=words, vocabulary=vocabulary, path=path, rate=rate
        )
        self.count, self.seed, self.words, self.path = count, seed, words, path
        self.vocab_size = vocabulary
        self.rate = float(rate)
        self.emitted = 0
        self._line = 0  # with ``path``: number and byte position of the next unread line
        self._pos = 0
        self._it: Iterator[str] | None = None

    def open(self, context: Context) -> None:
        super().open(context)
        self._it = self._sentences(context.index, context.parallelism)

    def _sentences(self, index: int, parallelism: int) -> Iterator[str]:
        if self.path:
            # bytes, so the offset is a byte position a replay can seek to
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                for raw in f:
                    i = self._line
                    self._pos += len(raw)
                    self._line += 1
                    if i % parallelism == index:
                        yield _strip_newline(raw.decode("utf-8"))
            return
        vocab = vocabulary(self.vocab_size)
        for i in range(index + self.emitted * parallelism, self.count, parallelism):
            yield sentence(i, self.seed, self.words, vocab)

    def offset(self) -> dict[str, int]:
        """Tuples emitted; with ``path`` also the next line's number and byte position."""
        if self.path:
            return {"emitted": self.emitted, "line": self._line, "pos": self._pos}
        return {"emitted": self.emitted}

    def seek(self, offset: Any) -> None:
        assert self.context is not None, "open() not called"
        self.emitted = _offset_int(offset, "emitted", self)
        if self.path:
            self._line = _offset_int(offset, "line", self)
            self._pos = _offset_int(offset, "pos", self)
        self._it = self._sentences(self.context.index, self.context.parallelism)

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        assert self._it is not None, "open() not called"
        for _ in range(max_count):
            s = next(self._it, None)
            if s is None:
                return False
            emit([s])
            self.emitted += 1
        return True

    def next_rows(self, emit_rows: Emit, max_count: int) -> bool:
        """:meth:`next_batch` with one ``emit_rows`` call for the whole chunk."""
        assert self._it is not None, "open() not called"
        rows = [[s] for s in islice(self._it, max_count)]
        if rows:
            emit_rows(rows)
            self.emitted += len(rows)
        return len(rows) == max_count
