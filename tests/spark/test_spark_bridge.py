"""The ``typhoon`` source and sinks on a real local Spark session, driven like the driver does.

Offset logs are written by the worker-side code, the query runs through
``driver.NodeQuery``, and the outbox is read by the worker-side reader, so
every file format is exercised end to end; a replay is forced by deleting the
last entry of Spark's commit log, as a driver killed before it wrote it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgpack

from pyspark_bridge.driver import NodeQuery, last_committed, make_listener
from pyspark_bridge.log import OffsetLog, read_json, worker_dir
from pyspark_bridge.outbox import OutboxReader, out_dir, replays
from typhoon.operators.ads import generate_ad_events, reference_window_counts

REPO = Path(__file__).resolve().parents[2]
CAMPAIGNS = str(REPO / "topologies" / "data" / "campaigns.csv")
COUNT, SEED = 12_000, 5
TIMEOUT = 240.0


def upper_ids(df: Any) -> Any:
    """A stateless spark-node function (append mode through the stream writer)."""
    from pyspark.sql import functions as F

    return df.select(F.upper("ad_id").alias("ad"), (F.col("event_time") + 1).alias("t"))


def wait_for(cond: Any, what: str, nq: NodeQuery | None = None) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not cond():
        if nq is not None:
            nq.check()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def write_views(node_dir: Path, workers: list[int], part: slice) -> dict[int, OffsetLog]:
    logs = {w: OffsetLog(worker_dir(node_dir, w)) for w in workers}
    views = [e for e in generate_ad_events(COUNT, SEED) if e["event_type"] == "view"][part]
    for i, e in enumerate(views):
        logs[workers[i % len(workers)]].append(msgpack.packb([e["ad_id"], e["event_time"], 1.5]))
    for log in logs.values():
        log.close()
    return logs


def spec(node_dir: Path, function: str, fields: list[str], mode: str, schema: str) -> dict:
    return {
        "node": node_dir.name,
        "function": function,
        "params": {},
        "dir": str(node_dir),
        "schema": schema,
        "fields": fields,
        "output_mode": mode,
        "trigger_ms": 100,
        "workers": [1, 2],
        "sql_conf": {},
    }


def routed(node_dir: Path) -> list[list]:
    rows: list[list] = []
    for w in (1, 2):
        OutboxReader(out_dir(node_dir), w).poll(rows.append)
    return rows


def forget_commit(node_dir: Path, batch: int) -> None:
    """As if the driver died after publishing ``batch`` but before Spark logged its commit."""
    commits = node_dir / "checkpoint" / "commits"
    (commits / str(batch)).unlink()
    (commits / f".{batch}.crc").unlink(missing_ok=True)
    (out_dir(node_dir) / "done").unlink()


def finish(nq: NodeQuery, node_dir: Path) -> None:
    for w in (1, 2):
        OffsetLog(worker_dir(node_dir, w)).mark_eos()
    wait_for(lambda: nq.finished, "the node to be done", nq)


def test_windowed_counts_exact_once_with_replay(spark: Any, tmp_path: Path) -> None:
    node_dir = tmp_path / "campaign_counts"
    s = spec(
        node_dir,
        "pyspark_bridge.examples:campaign_window_counts",
        ["campaign_id", "window_start", "window_end", "count", "ts"],
        "update",
        "ad_id string, event_time bigint, ts double",
    )
    s["params"] = {"campaigns": CAMPAIGNS}
    seen: dict[str, int] = {}
    spark.streams.addListener(make_listener({node_dir.name: node_dir}, seen))
    write_views(node_dir, [1, 2], slice(0, 1500))
    nq = NodeQuery(s, progress=seen)
    nq.start(spark)
    wait_for(lambda: (out_dir(node_dir) / f"{0:020d}.json").exists(), "batch 0", nq)
    write_views(node_dir, [1, 2], slice(1500, None))  # appended while the query runs
    finish(nq, node_dir)
    done = read_json(out_dir(node_dir) / "done")["batch"]
    assert done >= 1
    rows = routed(node_dir)
    final: dict[tuple[str, int], int] = {}
    for campaign, start, end, count, ts in rows:
        assert end - start == 10_000 and ts == 1.5
        final[(campaign, start)] = max(final.get((campaign, start), 0), count)
    assert final == reference_window_counts(COUNT, SEED)
    assert len({(c, w, n) for c, w, _, n, _ in rows}) == len(rows)  # no update sent twice
    # Spark committed the first batch's offsets: the source recorded it for trimming
    assert read_json(worker_dir(node_dir, 1) / "commit")["pos"] > 0
    progress = [
        json.loads(line)
        for line in (node_dir / "metrics" / "progress.jsonl").read_text().splitlines()
    ]
    assert progress and progress[0]["node"] == node_dir.name
    assert {
        "input_rows_per_s",
        "processed_rows_per_s",
        "batch_ms",
        "state",
        "watermark",
        "sources",
    } <= set(progress[-1])
    assert sum(p["input_rows"] for p in progress) == sum(final.values())

    # a new query replays the batch whose commit Spark did not log; the outbox drops it
    forget_commit(node_dir, done)
    again = NodeQuery(s)
    again.start(spark)
    wait_for(lambda: replays(out_dir(node_dir)) == 1, "the replay", again)
    wait_for(lambda: again.finished, "the node to be done again", again)
    assert routed(node_dir) == []


def test_append_mode_scale_up_and_replay_through_the_stream_writer(
    spark: Any, tmp_path: Path
) -> None:
    """Append mode (the stream writer); a worker added while the query runs; a replay.

    The node starts with worker 1; worker 2 appears (its log directory) after
    batch 0, and its log becomes one more input partition.  Every row is routed
    exactly once, through worker 1 (the output's owner), worker 1's offsets
    continue unchanged, and the node is not done before worker 2's end of
    input.  Then a new query replays the last batch, whose commit Spark did not
    log: the stream writer's outbox drops it.
    """
    node_dir = tmp_path / "upper_scaled"
    s = spec(node_dir, "test_spark_bridge:upper_ids", ["ad", "t"], "append",
             "ad_id string, event_time bigint, ts double")  # fmt: skip
    s["workers"] = [1]
    write_views(node_dir, [1], slice(0, 300))
    nq = NodeQuery(s)
    nq.start(spark)
    # Spark logs the commit after the sink published the batch
    wait_for(lambda: last_committed(node_dir / "checkpoint") is not None, "batch 0", nq)
    first = last_committed(node_dir / "checkpoint")
    assert first is not None and set(first[1]) == {"1"}
    write_views(node_dir, [1, 2], slice(300, 900))  # worker 2 opens its log: a scale-up
    OffsetLog(worker_dir(node_dir, 1)).mark_eos()
    heads = {w: read_json(worker_dir(node_dir, w) / "head") for w in ("1", "2")}

    def both_read() -> bool:
        c = last_committed(node_dir / "checkpoint")
        return c is not None and c[1] == heads

    wait_for(both_read, "a batch that reads worker 2's log", nq)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:  # worker 2's input has not ended: not done
        nq.check()
        assert not nq.finished
        time.sleep(0.1)
    OffsetLog(worker_dir(node_dir, 2)).mark_eos()
    wait_for(lambda: nq.finished, "the node to be done", nq)
    views = [e for e in generate_ad_events(COUNT, SEED) if e["event_type"] == "view"][:900]
    want = sorted([e["ad_id"].upper(), e["event_time"] + 1] for e in views)
    owner, added = OutboxReader(out_dir(node_dir), 1), OutboxReader(out_dir(node_dir), 2)
    rows: list[list] = []
    assert owner.poll(rows.append) == 900 and added.poll(rows.append) == 0
    assert sorted(rows) == want
    assert owner.finished() and added.finished()
    manifests = sorted(out_dir(node_dir).glob("*.json"))
    assert all(read_json(m)["owners"] == [1] for m in manifests)

    forget_commit(node_dir, read_json(out_dir(node_dir) / "done")["batch"])
    again = NodeQuery(s)
    again.start(spark)
    wait_for(lambda: again.finished, "the node to be done again", again)
    assert replays(out_dir(node_dir)) == 1
    assert routed(node_dir) == []
