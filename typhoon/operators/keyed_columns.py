"""A keyed source that holds its output as columns: ``[key, name, seq, value]`` by numpy.

``keyed_columns`` is what a columnar source feeding keyed state looks like: each
chunk is made with numpy (splitmix64 over uint64 arrays, the same numbers
:func:`typhoon.operators.sources._mix` gives one at a time) and sent with
``emit_columns``, so a stream that declares
``columns: {key: int64, name: str, seq: int64, value: int64}`` carries column blocks
without a Python object per tuple.  Every tuple is a pure function of the seed and
its sequence number (:func:`keyed_column_row`), so a test computes the exact result
of any keyed operator behind it without running anything.  ``key`` is an int,
``name`` the key's word (``sources.vocabulary``), so a fields grouping can key on an
int, a str, or both.
"""

from __future__ import annotations

from typing import Any, ClassVar

from typhoon.operators.base import Context, Emit
from typhoon.operators.sources import CountingSpout, _mix, vocabulary

FIELDS = ("key", "name", "seq", "value")
_KEY_SALT = 1_000_003


def keyed_column_row(seed: int, seq: int, keys: int, vocab: list[str]) -> list[Any]:
    """Tuple number ``seq`` of a ``keyed_columns`` source with this ``seed`` and ``keys``
    (``vocab`` is ``vocabulary(keys)``), as the receivers decode it."""
    key = _mix(seed * _KEY_SALT + seq) % keys
    return [key, vocab[key], seq, _mix(seed ^ (seq << 20)) >> 32]


def generate_keyed_columns(
    count: int, parallelism: int = 1, seed: int = 1, keys: int = 64
) -> list[list[Any]]:
    """Every tuple of a ``keyed_columns`` node of ``parallelism`` workers, ``count``
    each, in sequence-number order (each worker's tuples are in that order too)."""
    vocab = vocabulary(keys)
    return [keyed_column_row(seed, s, keys, vocab) for s in range(count * parallelism)]


def _mix_array(x: Any) -> Any:
    """:func:`_mix` over a uint64 numpy array (wrapping arithmetic, as the mask does)."""
    import numpy as np

    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class KeyedColumns(CountingSpout):
    """``count`` tuples ``[key, name, seq, value]`` per worker, made and sent as columns.

    Worker ``i`` of ``P`` emits sequence numbers ``i, i+P, i+2P, ...``; ``key`` (one of
    ``keys``) and ``value`` (32 bits) are derived from ``seed`` and the sequence number,
    ``name`` is the key's word.  ``rate`` tuples/s per worker (0: as fast as it can).
    Replayable: its offset is the number of tuples it emitted.
    """

    fields: ClassVar[tuple[str, ...]] = FIELDS

    def __init__(self, count: int = 1000, keys: int = 64, seed: int = 1, rate: float = 0.0) -> None:
        for name, val, low in (("count", count, 0), ("keys", keys, 1)):
            if isinstance(val, bool) or not isinstance(val, int) or val < low:
                raise ValueError(f"{name} must be an integer >= {low}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 32:
            raise ValueError("seed must be an integer in [0, 2**32)")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
            raise ValueError("rate must be a non-negative number")
        super().__init__(count=count, keys=keys, seed=seed, rate=rate)
        self.count, self.keys, self.seed = count, keys, seed
        self.rate = float(rate)
        self._names: Any = None  # the vocabulary as one str column, indexed by key

    def open(self, context: Context) -> None:
        super().open(context)
        from typhoon.wire.column_pack import as_columns
        from typhoon.wire.layout import ColumnLayout

        names = as_columns(ColumnLayout(("name",), ("str",)), [vocabulary(self.keys)])
        assert names is not None  # words of ASCII syllables always fit a str column
        self._names = names.cols[0]

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        """Rows one by one (no columns on the stream, or watermarks watch the rows)."""
        n = min(max_count, self.count - self.emitted)
        vocab = vocabulary(self.keys)
        p, i = self.parallelism, self.index
        for j in range(self.emitted, self.emitted + n):
            emit(keyed_column_row(self.seed, j * p + i, self.keys, vocab))
        self.emitted += n
        return self.emitted < self.count

    def next_columns(self, emit_columns: Emit, max_count: int) -> bool:
        """Up to ``max_count`` tuples as one call of ``emit_columns``."""
        import numpy as np

        from typhoon.wire.column_pack import gather

        n = min(max_count, self.count - self.emitted)
        if n > 0:
            p, i, seed = self.parallelism, self.index, self.seed
            seq = np.arange(self.emitted, self.emitted + n, dtype=np.int64) * p + i
            useq = seq.astype(np.uint64)
            key = (_mix_array(np.uint64(seed * _KEY_SALT) + useq) % np.uint64(self.keys)).astype(
                np.int64
            )
            value = (_mix_array(np.uint64(seed) ^ (useq << np.uint64(20))) >> np.uint64(32)).astype(
                np.int64
            )
            emit_columns([key, gather(self._names, key), seq, value])
            self.emitted += n
        return self.emitted < self.count
