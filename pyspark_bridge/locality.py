"""Locality analysis on Spark (issue 17, seed paper 003): key pairs -> routing tables.

Input: sampled tuples as JSON lines (what ``typhoon debug tuples --format json``
prints for a mirror on the second grouping's stream, or any export), each with
the two key fields and optionally a timestamp.  Spark counts the pairs (over
the last ``window_s`` seconds when timestamps are given) and keeps the ``top``
most frequent; the driver then partitions the bipartite key graph with METIS
(``typhoon.locality.partition``) into ``direct`` routing tables.

    python -m pyspark_bridge.locality --pairs P.jsonl --a tag --b loc \\
        --workers W.json --out table.json [--window-s 60] [--top 10000] [--imbalance 1.03]

``W.json``: ``{"a": [[worker_id, host], ...], "b": [[worker_id, host], ...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from typhoon.locality.partition import LocalityPlan, Slot, plan_locality


def pair_counts(df: Any, a: str, b: str, ts: str | None = None, window_s: float | None = None):
    """(a, b, count) of a DataFrame of tuples, the last ``window_s`` seconds of ``ts`` only."""
    from pyspark.sql import functions as F

    for col in (a, b, *([ts] if ts else [])):
        if col not in df.columns:
            raise ValueError(f"no field '{col}' in the sampled tuples (fields: {df.columns})")
    if ts and window_s:
        newest = df.agg(F.max(ts)).first()[0]
        if newest is not None:
            df = df.where(F.col(ts) >= float(newest) - window_s)
    keys = df.select(F.col(a).cast("string").alias("a"), F.col(b).cast("string").alias("b"))
    return keys.where(F.col("a").isNotNull() & F.col("b").isNotNull()).groupBy("a", "b").count()


def analyse(
    spark: Any,
    pairs_path: str | Path,
    a: str,
    b: str,
    a_workers: list[Slot],
    b_workers: list[Slot],
    *,
    ts: str | None = None,
    window_s: float | None = None,
    top: int = 10_000,
    imbalance: float = 1.03,
) -> tuple[dict[tuple[str, str], int], LocalityPlan]:
    """Count the pairs on Spark, partition the top ones on the driver."""
    df = spark.read.json(str(pairs_path))
    counts = pair_counts(df, a, b, ts, window_s).orderBy("count", ascending=False).limit(top)
    pairs = {(r["a"], r["b"]): int(r["count"]) for r in counts.collect()}
    return pairs, plan_locality(pairs, a_workers, b_workers, imbalance=imbalance)


def _slots(doc: Any, which: str) -> list[Slot]:
    try:
        return [Slot(int(w), str(h)) for w, h in doc[which]]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"workers file: '{which}' must be a list of [worker_id, host]") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pyspark_bridge.locality", description=__doc__)
    p.add_argument("--pairs", required=True)
    p.add_argument("--a", required=True, help="key field of the first fields grouping")
    p.add_argument("--b", required=True, help="key field of the second fields grouping")
    p.add_argument("--workers", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ts", help="timestamp field (epoch seconds)")
    p.add_argument("--window-s", type=float)
    p.add_argument("--top", type=int, default=10_000)
    p.add_argument("--imbalance", type=float, default=1.03)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    try:
        doc = json.loads(Path(args.workers).read_text())
        a_workers, b_workers = _slots(doc, "a"), _slots(doc, "b")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from pyspark.sql import SparkSession

    ours = SparkSession.getActiveSession() is None  # stop only a session this call made
    spark = SparkSession.builder.master(args.master).appName("typhoon-locality").getOrCreate()
    try:
        pairs, plan = analyse(
            spark, args.pairs, args.a, args.b, a_workers, b_workers,
            ts=args.ts, window_s=args.window_s, top=args.top, imbalance=args.imbalance,
        )  # fmt: skip
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if ours:
            spark.stop()
    out = {
        "table_a": plan.table_a,
        "table_b": plan.table_b,
        "pairs": len(pairs),
        "local_fraction": plan.local_fraction,
        "imbalance_a": plan.imbalance(plan.load_a),
        "imbalance_b": plan.imbalance(plan.load_b),
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(
        f"{len(pairs)} pairs; {plan.local_fraction:.0%} of their weight on one host; "
        f"imbalance {out['imbalance_a']:.2f} / {out['imbalance_b']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
