"""DataFrame functions for spark nodes of the example topologies.

A spark node's function takes the node's input as a streaming DataFrame (one
column per input field) plus the node's ``params``, and returns the DataFrame
whose rows the node emits; Spark's state stores, watermarks and checkpoints
apply as in any Structured Streaming query.
"""

from __future__ import annotations

import csv
from typing import Any


def campaign_window_counts(
    events: Any, campaigns: str, window: str = "10 seconds", watermark: str = "10 seconds"
) -> Any:
    """Ad views per campaign and event-time window (Yahoo streaming benchmark, paper Fig. 13).

    Input ``ad_id, event_time (epoch ms), ts``; joins the campaign table
    (``ad_id,campaign_id`` CSV, read once and broadcast) and counts per
    ``window`` with a ``watermark``.  Output ``campaign_id, window_start,
    window_end`` (epoch ms), ``count`` and ``ts``: the newest emit time counted,
    for end-to-end latency.  Use it in update mode: each batch emits the
    windows it changed, and the last row per window is the final count.
    """
    from pyspark.sql import functions as F

    spark = events.sparkSession
    with open(campaigns, newline="", encoding="utf-8") as f:
        rows = [(r["ad_id"], r["campaign_id"]) for r in csv.DictReader(f)]
    table = spark.createDataFrame(rows, "ad_id string, campaign_id string")
    timed = events.withColumn("event_time", F.timestamp_millis("event_time")).withWatermark(
        "event_time", watermark
    )
    counts = (
        timed.join(F.broadcast(table), "ad_id")
        .groupBy(F.window("event_time", window).alias("w"), "campaign_id")
        .agg(F.count(F.lit(1)).alias("count"), F.max("ts").alias("ts"))
    )
    return counts.select(
        "campaign_id",
        F.unix_millis(F.col("w.start")).alias("window_start"),
        F.unix_millis(F.col("w.end")).alias("window_end"),
        "count",
        "ts",
    )


campaign_window_counts.output_fields = (  # type: ignore[attr-defined]
    "campaign_id",
    "window_start",
    "window_end",
    "count",
    "ts",
)


def costly_enrichment(rows: Any, cost_ms: float = 2.0) -> Any:
    """Rows unchanged, after a lookup that waits ``cost_ms`` per row (a remote enrichment call).

    The wait stands for I/O-bound per-row work (a key-value or REST lookup per
    event): it runs in the task of the row's input partition (``mapInArrow``
    is narrow, no shuffle), so a micro-batch takes about ``rows x cost_ms``
    divided by the partitions that run at once.  The source makes one
    partition per worker log, so a node with one worker processes at most
    ``1000 / cost_ms`` rows/s and every added worker adds one more concurrent
    partition (up to the session's task slots, ``local[N]``) -- the case where
    scaling a spark node up raises its processed rate.  Output fields: the
    input's.
    """
    import time

    wait_s = max(0.0, float(cost_ms)) / 1000.0

    def lookup(batches: Any) -> Any:
        for batch in batches:
            time.sleep(batch.num_rows * wait_s)
            yield batch

    return rows.mapInArrow(lookup, rows.schema)


def running_counts(rows: Any, key: str = "word") -> Any:
    """How many rows each ``key`` has had so far (a stateful aggregation, update mode).

    Output ``key, count``: each micro-batch emits the keys it changed with
    their new totals, so the last row per key is its count.
    """
    return rows.groupBy(key).count().select(rows[key].alias("key"), "count")


running_counts.output_fields = ("key", "count")  # type: ignore[attr-defined]


def windowed_sums(
    rows: Any,
    key: str = "key",
    time: str = "ts",
    value: str = "value",
    window: str = "100 milliseconds",
    watermark: str = "500 milliseconds",
) -> Any:
    """Sum of ``value`` per ``key`` and tumbling event-time ``window`` (append mode).

    ``time`` is epoch milliseconds, as on the fabric; ``watermark`` is the
    ``withWatermark`` delay, which keeps Spark's watermark consistent with the
    fabric's when it covers the upstream spout's ``out_of_order_ms`` plus how
    far the fabric's watermark trails the rows (docs/windows.md, "Spark nodes").
    Output ``key, start, end, value`` (epoch ms): each window once, when
    Spark's watermark passes its end, so the node's output watermark lets a
    downstream ``window_aggregate`` roll the windows up.
    """
    from pyspark.sql import functions as F

    timed = rows.withColumn("_t", F.timestamp_millis(time)).withWatermark("_t", watermark)
    sums = timed.groupBy(F.window("_t", window).alias("w"), key).agg(F.sum(value).alias("v"))
    return sums.select(
        F.col(key).alias("key"),
        F.unix_millis(F.col("w.start")).alias("start"),
        F.unix_millis(F.col("w.end")).alias("end"),
        F.col("v").alias("value"),
    )


windowed_sums.output_fields = ("key", "start", "end", "value")  # type: ignore[attr-defined]
