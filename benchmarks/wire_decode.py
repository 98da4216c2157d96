"""Microseconds to decode one data entry on a worker's hot path, before and after the
strict decoder of issue 28 (no extension types, nesting capped at ``MAX_DEPTH``).

``before`` is what ``Framework._decode_entry`` did until then (plain
``msgpack.unpackb`` and a row-type check), kept here as the reference; ``after`` is
``typhoon.wire.unpack_rows`` with the same row check.  Both run interleaved in one
process on ~6 KB entries of several row shapes (the best of 7 rounds each), so the
ratio, not the absolute figure, is what to read on a loaded machine.

    python -m benchmarks.wire_decode [--number 5000]
"""

from __future__ import annotations

import argparse
import random
import timeit
from collections.abc import Callable

import msgpack

from typhoon.wire import encode_rows, unpack_rows

ENTRY_BYTES = 6000
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "typhoon", "stream"]


def before(entry: bytes) -> list | None:
    """The decoder as it was: any msgpack value, extension types included, any depth."""
    try:
        rows = msgpack.unpackb(entry, raw=False, strict_map_key=False)
    except Exception:
        return None
    if type(rows) is not list:
        return None
    if not all([type(r) is list for r in rows]):
        return [r for r in rows if type(r) is list]
    return rows


def after(entry: bytes) -> list:
    rows, good = unpack_rows(entry)
    if good != len(rows):
        return [r for r in rows if type(r) is list]
    return rows


def entries(seed: int = 1) -> dict[str, bytes]:
    """One entry of ~ENTRY_BYTES per row shape."""
    rnd = random.Random(seed)
    shapes: dict[str, Callable[[], list]] = {
        "[word]": lambda: [rnd.choice(WORDS)],
        "[word, int]": lambda: [rnd.choice(WORDS), rnd.randrange(1 << 20)],
        "[int, int, int]": lambda: [rnd.randrange(1 << 30) for _ in range(3)],
        "[float, float]": lambda: [rnd.random(), rnd.random()],
        "[src, seq, ts, 100 B] (forward.yaml)": lambda: [
            3,
            rnd.randrange(10**6),
            1.7e9,
            b"x" * 100,
        ],
        "[word, [int, int], {k: int}]": lambda: [
            rnd.choice(WORDS),
            [1, 2],
            {"k": rnd.randrange(99)},
        ],
    }
    out = {}
    for name, make in shapes.items():
        rows: list = []
        while len(encode_rows(rows)) < ENTRY_BYTES:
            rows.append(make())
        out[name] = encode_rows(rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=5000, help="decodes per timing round")
    n = ap.parse_args().number
    print(
        f"{'entry rows':40s} {'bytes':>6s} {'rows':>5s} {'before us':>10s} {'after us':>9s} ratio"
    )
    for name, entry in entries().items():
        assert before(entry) == after(entry)
        t_before, t_after = [], []
        for _ in range(7):
            t_before.append(timeit.timeit(lambda e=entry: before(e), number=n) / n * 1e6)
            t_after.append(timeit.timeit(lambda e=entry: after(e), number=n) / n * 1e6)
        b, a = min(t_before), min(t_after)
        rows = len(after(entry))
        print(f"{name:40s} {len(entry):6d} {rows:5d} {b:10.1f} {a:9.1f} {a / b:5.2f}")


if __name__ == "__main__":
    main()
