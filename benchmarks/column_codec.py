"""Microseconds per tuple to pack and read one entry: msgpack row batch against column block.

Rows like ``topologies/forward.yaml``'s (``[src, seq, ts, 100-byte payload]``),
``--rows`` per entry; each figure is the best of 7 repeats, in one process, so the
four are comparable with each other on a loaded machine.

    python -m benchmarks.column_codec [--rows 70 500]
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

from typhoon.wire import encode_rows, unpack_rows
from typhoon.wire.columns import unpack_block
from typhoon.wire.layout import pack_block, parse_layout

LAYOUT = parse_layout({"src": "int64", "seq": "int64", "ts": "float64", "payload": "bytes"})


def per_tuple(f: Callable[[], Any], rows: int, number: int = 2000) -> float:
    return min(timeit.repeat(f, number=number, repeat=7)) / number / rows * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[70, 500])
    args = ap.parse_args(argv)
    for k in args.rows:
        print(one_size(k))
    return 0


def one_size(k: int) -> str:
    rows = [[5, i, time.time(), b"x" * 100] for i in range(k)]
    block, batch = pack_block(LAYOUT, rows), encode_rows(rows)
    assert block is not None
    return (
        f"{k} rows: encode_rows {per_tuple(lambda: encode_rows(rows), k):.3f}, "
        f"pack_block {per_tuple(lambda: pack_block(LAYOUT, rows), k):.3f}, "
        f"unpack_rows {per_tuple(lambda: unpack_rows(batch), k):.3f}, "
        f"unpack_block {per_tuple(lambda: unpack_block(block), k):.3f} µs/tuple; "
        f"{len(batch)} against {len(block)} bytes"
    )


if __name__ == "__main__":
    sys.exit(main())
