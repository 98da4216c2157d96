"""A run of consecutive sequence numbers checked off a bitmap at once.

Also ``sequence_check``'s column path (:func:`check_columns`): the same checks on
the numpy columns of column blocks.

``sequence_check`` keeps one bit per sequence number and source; what a link
carries is, batch after batch, one source's consecutive numbers.  Such a batch
needs no step per row: a few passes in C find the run, one masked OR marks it.
"""

from __future__ import annotations

import time
from operator import itemgetter
from typing import Any

MIN_RUN = 8  # shorter batches go row by row: the passes would cost more


def _arange(start: int, stop: int, dtype: Any) -> Any:
    """``numpy.arange``, imported on first use (only column blocks get here)."""
    import numpy as np

    return np.arange(start, stop, dtype=dtype)


def mark_run(
    bitmaps: dict[Any, bytearray], highest: dict[Any, int], rows: list[list], isrc: int, iseq: int
) -> bool:
    """Mark rows ``[src, a], [src, a+1], ...`` in ``src``'s bitmap, and ``a+n-1`` as its
    highest; False, with nothing changed, for any other batch, and for one that
    would count a duplicate or an out-of-order tuple (the caller's row loop counts
    those, so the figures are exactly what one row at a time gives)."""
    n = len(rows)
    if n < MIN_RUN:
        return False
    try:
        seqs = list(map(itemgetter(iseq), rows))
        srcs = list(map(itemgetter(isrc), rows))
    except (IndexError, TypeError):
        return False  # the row loop raises what one row at a time would
    a, src = seqs[0], srcs[0]
    if type(a) is not int or a < 0 or srcs.count(src) != n:
        return False
    b = a + n - 1
    if seqs[-1] != b or list(map(type, seqs)).count(int) != n or seqs != list(range(a, b + 1)):
        return False
    return _mark(bitmaps, highest, src, a, n)


def mark_run_columns(
    bitmaps: dict[Any, bytearray], highest: dict[Any, int], srcs: Any, seqs: Any
) -> bool:
    """:func:`mark_run` for int64 columns (numpy arrays of column blocks): the run found
    with array operations, no Python object per row (and no numpy import here)."""
    n = len(seqs)
    if n < MIN_RUN:
        return False
    a, src = int(seqs[0]), int(srcs[0])
    if a < 0 or int(seqs[-1]) != a + n - 1 or a + n >= 1 << 63:
        return False
    # compared as bytes: one source's id n times, a, a+1, ... (cheaper than numpy's
    # element-wise compare and reduce on an entry's few hundred values)
    if srcs.tobytes() != srcs[:1].tobytes() * n:
        return False
    if seqs.tobytes() != _arange(a, a + n, dtype=seqs.dtype).tobytes():
        return False
    return _mark(bitmaps, highest, src, a, n)


def _mark(bitmaps: dict[Any, bytearray], highest: dict[Any, int], src: Any, a: int, n: int) -> bool:
    b = a + n - 1
    bm = bitmaps.get(src)
    if bm is not None and a <= highest.get(src, -1):  # behind what was seen
        return False
    if bm is None:
        bm = bitmaps[src] = bytearray(1024)
    lo, hi = a >> 3, b >> 3
    if hi >= len(bm):
        bm.extend(bytes(max(hi + 1 - len(bm), len(bm))))
    chunk = int.from_bytes(bm[lo : hi + 1], "little")
    mask = ((1 << n) - 1) << (a - 8 * lo)
    if chunk & mask:  # a duplicate in there (bits above the highest: after a restore)
        return False
    bm[lo : hi + 1] = (chunk | mask).to_bytes(hi + 1 - lo, "little")
    highest[src] = b
    return True


def check_columns(op: Any, cols: Any, emit: Any) -> None:
    """``SequenceCheck.process`` for the columns of column blocks
    (``typhoon.wire.columns.Columns``): the same counts, bits and samples, from int64
    ``src``/``seq`` and a numeric ``ts`` without a Python object per row; other
    layouts go through their rows (``process_batch``)."""
    isrc, iseq, its = op.idx
    types = cols.types
    if (
        types[isrc] != "int64"
        or types[iseq] != "int64"
        or (its >= 0 and types[its] not in ("int64", "float64"))
    ):
        op.process_batch(cols.rows(), emit)
        return
    n = cols.n
    before = op.received
    srcs, seqs = cols.cols[isrc], cols.cols[iseq]
    if not mark_run_columns(op.bitmaps, op.highest, srcs, seqs):
        op._rows(list(zip(srcs.tolist(), seqs.tolist(), strict=True)), 0, 1)
    op.received = before + n
    if op.received // op.TICK_EVERY != before // op.TICK_EVERY:
        op._mark_time()
    if its >= 0 and n:
        _sample_column(op, cols.cols[its])


def _sample_column(op: Any, ts: Any) -> None:
    """``SequenceCheck._sample`` on a numeric column: each run of samples up to the next
    halving taken with one slice of the array."""
    now = time.time()
    n, tick, stride = len(ts), op._tick, op.stride
    latencies = op.latencies
    i = max(0, stride - tick - 1)
    last = -1
    while i < n:
        take = ts[i::stride][: op.MAX_SAMPLES - len(latencies)]
        latencies.extend((now - take).tolist())
        last = i + (len(take) - 1) * stride
        if len(latencies) >= op.MAX_SAMPLES:
            latencies = op.latencies = latencies[::2]
            stride = op.stride = stride * 2
        i = last + stride
    op._tick = tick + n if last < 0 else n - 1 - last
