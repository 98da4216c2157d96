"""Spark driver for one host: ``python -m pyspark_bridge.driver PLAN.json``.

One Spark session serves every spark node of the plan (``pyspark_bridge.plan``
writes it): a Structured Streaming query per node, from the ``typhoon`` source
(the node's offset logs) through the node's function to the ``typhoon`` sink
(the node's outbox).  Checkpoints live in ``<node dir>/checkpoint``, so a
driver killed at any point and started again resumes where Spark committed:
the source re-reads the same offset ranges, the sink drops a replayed batch
that was already published.

A ``StreamingQueryListener`` appends every progress event, compacted, to
``<node dir>/metrics/progress.jsonl``; the node's worker 0 forwards new events
in METRIC_RESP (``spark`` entry) toward the controller.

A node is done when every worker wrote its ``eos`` mark, the last committed
batch covers every log up to it, and no batch ran for a few triggers (so a
no-data batch that closes windows has had its turn): the driver writes
``out/done`` with that batch ID, stops the query, and exits when all its nodes
are done.  Workers finish after routing up to that batch.

Rollback (a guarantee, docs/guarantees.md): when a worker of a node asks for
a rollback (``rollback/w<log id>.json``), the driver stops the node's query;
once every worker asked in that generation, it takes the query, outbox and
logs back to the cut (``rewind.py``), writes ``rollback/ack`` and starts the
query again.  Under a guarantee the driver stays up after its nodes are done
(a late rollback may need them again) until every worker of every node
closed (``in/w<id>/closed``), or it is stopped.

Scale-up: "every worker" is the plan's workers plus every worker whose log
appeared under ``in/`` since; the source reads the new logs as more input
partitions from the next micro-batch on.  The output keeps its owners, the
plan's workers (``outbox.py``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark_bridge import log, rewind
from pyspark_bridge.node import load_function
from pyspark_bridge.outbox import manifest_path, out_dir, publish, stage_rows
from typhoon import logs

logger = logging.getLogger("pyspark_bridge.driver")

PROGRESS_ROTATE_BYTES = 8 << 20
QUIET_TRIGGERS = 3  # triggers without a new batch before a finished node is declared done
MIN_QUIET_S = 1.0
PROGRESS_WAIT_S = 15.0  # longest wait for the last batch's progress event before done


def compact_progress(p: dict[str, Any]) -> dict[str, Any]:
    """The parts of a StreamingQueryProgress the controller and autoscaler use."""
    return {
        "node": p.get("name"),
        "batch": p.get("batchId"),
        "timestamp": p.get("timestamp"),
        "input_rows": p.get("numInputRows"),
        "input_rows_per_s": p.get("inputRowsPerSecond"),
        "processed_rows_per_s": p.get("processedRowsPerSecond"),
        "batch_ms": p.get("batchDuration"),
        "trigger_ms": (p.get("durationMs") or {}).get("triggerExecution"),
        "durations_ms": p.get("durationMs") or {},
        "state": [
            {
                "operator": s.get("operatorName"),
                "rows": s.get("numRowsTotal"),
                "updated": s.get("numRowsUpdated"),
                "memory_bytes": s.get("memoryUsedBytes"),
                "dropped_by_watermark": s.get("numRowsDroppedByWatermark"),
            }
            for s in p.get("stateOperators") or []
        ],
        "watermark": (p.get("eventTime") or {}).get("watermark"),
        "sources": [
            {
                "start": s.get("startOffset"),
                "end": s.get("endOffset"),
                "latest": s.get("latestOffset"),
                "rows": s.get("numInputRows"),
            }
            for s in p.get("sources") or []
        ],
    }


def append_progress(node_dir: Path, event: dict[str, Any]) -> None:
    mdir = node_dir / "metrics"
    mdir.mkdir(parents=True, exist_ok=True)
    path = mdir / "progress.jsonl"
    if path.exists() and path.stat().st_size > PROGRESS_ROTATE_BYTES:
        os.replace(path, mdir / "progress.jsonl.1")
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")


def make_listener(node_dirs: dict[str, Path], seen: dict[str, int] | None = None) -> Any:
    """A listener writing each query's progress next to its node (pyspark imported late).

    ``seen`` gets the newest batch ID written per node: events reach Python
    asynchronously, and a node is declared done only after its last one.
    """
    seen = {} if seen is None else seen
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = json.loads(event.progress.json)
            d = node_dirs.get(p.get("name"))
            if d is not None:
                append_progress(d, compact_progress(p))
                seen[p["name"]] = max(seen.get(p["name"], -1), p["batchId"])

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            if event.exception:
                logger.error("query %s failed: %s", event.id, event.exception)

    return ProgressListener()


def last_committed(checkpoint: Path) -> tuple[int, dict[str, Any]] | None:
    """(batch ID, source end offsets) of the newest batch in Spark's commit log, if any."""
    try:
        ids = [int(n) for n in os.listdir(checkpoint / "commits") if n.isdigit()]
    except FileNotFoundError:
        return None
    if not ids:
        return None
    batch = max(ids)
    # offsets/<batch>: a version line, a metadata line, then one JSON line per source
    for line in (checkpoint / "offsets" / str(batch)).read_text().splitlines()[2:]:
        if line.startswith("{"):
            return batch, json.loads(line)
    return batch, {}


class Batches:
    """Update mode (``foreachBatch``): collect each micro-batch and publish it under its ID.

    The Python stream writer takes append and complete mode only.  Collecting
    in the driver suits the small outputs of aggregations; rows are spread over
    the node's workers by their first column, so each key's updates leave
    through one worker, in batch order.  A replayed batch is computed (state)
    but its rows are dropped.
    """

    def __init__(self, node_dir: str, owners: list[int]) -> None:
        self.outdir, self.owners = out_dir(node_dir), owners
        self.checkpoint = Path(node_dir) / "checkpoint"

    def __call__(self, df: Any, batch_id: int) -> None:
        if manifest_path(self.outdir, batch_id).exists():
            # a replay: run it all the same (its state-store updates are part of the batch)
            df.write.format("noop").mode("overwrite").save()
            publish(self.outdir, batch_id, [], self.owners)  # drops it, records the replay
            return
        table = df.toArrow()
        rows = list(zip(*(c.to_pylist() for c in table.columns), strict=True))
        n = len(self.owners)
        parts: list[list[tuple]] = [[] for _ in range(n)]
        for row in rows:
            parts[zlib.crc32(str(row[0]).encode()) % n].append(row)
        staged = [stage_rows(self.outdir, i, part) for i, part in enumerate(parts) if part]
        publish(
            self.outdir, batch_id, staged, self.owners, rewind.batch_end(self.checkpoint, batch_id)
        )


@dataclass
class NodeQuery:
    """One spark node's streaming query and its end-of-stream bookkeeping."""

    spec: dict[str, Any]
    query: Any = None
    finished: bool = False
    last_batch: int | None = None
    last_change: float = field(default_factory=time.monotonic)
    progress: dict[str, int] | None = None  # the listener's newest batch per node, if one runs
    acked: int = -1  # newest rollback generation done (rollback/ack)
    stopped_at: float | None = None  # when a rollback stopped the query
    rollbacks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def dir(self) -> Path:
        return Path(self.spec["dir"])

    def workers(self) -> list[str]:
        return log.worker_ids(self.dir, [str(w) for w in self.spec["workers"]])

    def closed(self) -> bool:
        """Every worker of the node stopped for good (no rollback can need the query)."""
        return all((log.worker_dir(self.dir, w) / "closed").exists() for w in self.workers())

    def check_rollback(self, spark: Any) -> bool:
        """Act on the workers' rollback requests; True while one is under way."""
        if self.acked < 0:
            self.acked = int((rewind.acked(self.dir) or {}).get("generation", -1))
        reqs = rewind.requests(self.dir)
        if not reqs or max(r["generation"] for r in reqs.values()) <= self.acked:
            return False
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
            if self.query is not None and self.query.isActive:
                self.query.stop()  # nothing more is read or published until the rewind
            self.query = None
        ready = rewind.ready_cut(self.dir, self.workers(), self.acked)
        if ready is None:
            return True  # not every worker asked yet
        gen, epoch, cut = ready
        t0 = time.monotonic()
        batch = rewind.rewind_node(self.dir, cut, epoch)
        rewound_ms = (time.monotonic() - t0) * 1000
        self.finished = False
        self.last_batch, self.last_change = None, time.monotonic()
        self.start(spark)
        done = time.monotonic()
        entry = {
            "generation": gen,
            "epoch": epoch,
            "batch": batch,
            "stopped_ms": round((t0 - self.stopped_at) * 1000, 1),
            "rewind_ms": round(rewound_ms, 1),
            "restart_ms": round((done - t0) * 1000 - rewound_ms, 1),
            "time": time.time(),
        }
        self.rollbacks.append(entry)
        log.write_json(self.dir / "rollback" / "ack", entry)
        self.acked, self.stopped_at = gen, None
        logger.info(
            "node %s: rolled back to batch %d (epoch %s, generation %d): %s",
            self.spec["node"],
            batch,
            epoch,
            gen,
            entry,
        )
        return False

    def start(self, spark: Any) -> None:
        s = self.spec
        if (out_dir(self.dir) / "done").exists():
            self.finished = True
            return
        conf = dict(s["sql_conf"])
        if s["output_mode"] == "update":
            # no-data batches only evict state in update mode; they emit nothing
            conf.setdefault("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        for k, v in conf.items():
            spark.conf.set(k, v)
        ids = ",".join(str(w) for w in s["workers"])
        src = (
            spark.readStream.format("typhoon")
            .option("dir", str(self.dir))
            .option("schema", s["schema"])
            .option("workers", ids)
            .option("cut_batches", "true" if s.get("cut_batches") else "false")
            .load()
        )
        out = load_function(s["function"])(src, **s["params"])
        if list(out.columns) != s["fields"]:
            if sorted(out.columns) != sorted(s["fields"]):
                raise ValueError(
                    f"node {s['node']}: the function returns columns {out.columns}, "
                    f"the topology declares fields {s['fields']}"
                )
            out = out.select(*s["fields"])
        writer = (
            out.writeStream.queryName(s["node"])
            .outputMode(s["output_mode"])
            .option("checkpointLocation", str(self.dir / "checkpoint"))
            .trigger(processingTime=f"{s['trigger_ms']} milliseconds")
        )
        owners = [int(w) for w in s["workers"]]  # the output leaves through these (outbox.py)
        if s["output_mode"] == "update":  # the Python stream writer takes append/complete only
            writer = writer.foreachBatch(Batches(str(self.dir), owners))
        else:
            writer = (
                writer.format("typhoon")
                .option("dir", str(self.dir))
                .option("owners", ",".join(map(str, owners)))
            )
        self.query = writer.start()
        logger.info("node %s: query started (%s mode)", s["node"], s["output_mode"])

    def check(self) -> None:
        """Raise if the query failed; declare the node done once Spark processed all input."""
        if self.finished or self.query is None:
            return
        if not self.query.isActive:
            raise RuntimeError(f"node {self.spec['node']}: query stopped: {self.query.exception()}")
        committed = last_committed(self.dir / "checkpoint")
        batch = committed[0] if committed else -1
        now = time.monotonic()
        if batch != self.last_batch:
            self.last_batch, self.last_change = batch, now
        workers = log.worker_ids(self.dir, [str(w) for w in self.spec["workers"]])
        eos = [log.read_json(log.worker_dir(self.dir, w) / "eos") for w in workers]
        if any(e is None for e in eos):
            return
        ends = committed[1] if committed else {}
        for w, e in zip(workers, eos, strict=True):
            if e["pos"] > ends.get(str(w), log.ZERO)["pos"]:
                return
        quiet = max(MIN_QUIET_S, QUIET_TRIGGERS * self.spec["trigger_ms"] / 1000.0)
        if now - self.last_change < quiet or self.query.status.get("isTriggerActive"):
            return
        if (
            self.progress is not None
            and self.progress.get(self.spec["node"], -1) < batch
            and now - self.last_change < PROGRESS_WAIT_S
        ):
            return  # the last progress event is still on its way to the listener
        log.write_json(out_dir(self.dir) / "done", {"batch": batch})
        logger.info("node %s: all input processed, last batch %d", self.spec["node"], batch)
        self.query.stop()
        self.finished = True


def wait_for_previous_jvm(pidfile: Path, timeout: float = 30.0) -> None:
    """A killed driver's JVM exits when its stdin closes; never share a checkpoint with it."""
    pid = log.read_json(pidfile)
    if not pid:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(int(pid), 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    logger.warning("previous JVM %s still running after %.0f s; killing it", pid, timeout)
    try:
        os.kill(int(pid), signal.SIGKILL)
    except ProcessLookupError:
        pass


def build_session(plan: dict[str, Any]) -> Any:
    """The host's session: Python workers run this interpreter; local mode stays on loopback
    (an emulated host's network namespace may have no other usable address)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if plan["conf"].get("spark.master", "local").startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.python.daemon.module": "pyspark_bridge.pydaemon",  # see pydaemon.py
        **plan["conf"],
    }
    builder = SparkSession.builder.appName(f"typhoon-{plan['app']}-{plan['host']}")
    for k, v in conf.items():
        builder = builder.master(v) if k == "spark.master" else builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    from pyspark_bridge.source import TyphoonDataSource

    spark.dataSource.register(TyphoonDataSource)
    return spark


class Driver:
    def __init__(self, plan_path: Path) -> None:
        self.plan_path = Path(plan_path)
        self.plan = json.loads(self.plan_path.read_text())
        self.seen: dict[str, int] = {}
        self.nodes = [NodeQuery(spec, progress=self.seen) for spec in self.plan["nodes"]]
        self.stopping = False

    def stop(self, *_: Any) -> None:
        self.stopping = True

    def all_done(self) -> bool:
        """Every node is done (under a guarantee: and its workers closed, see the docstring)."""
        return all(n.finished and (not n.spec.get("guarantee") or n.closed()) for n in self.nodes)

    def run(self) -> int:
        pidfile = self.plan_path.with_suffix(".jvm.pid")
        wait_for_previous_jvm(pidfile)
        spark = build_session(self.plan)
        proc = getattr(spark.sparkContext._gateway, "proc", None)
        if proc is not None:
            log.write_json(pidfile, proc.pid)
        spark.streams.addListener(
            make_listener({n.spec["node"]: n.dir for n in self.nodes}, self.seen)
        )
        try:
            for n in self.nodes:
                n.start(spark)
            log.write_json(self.plan_path.with_suffix(".ready"), {"time": time.time()})
            while not self.stopping and not self.all_done():
                for n in self.nodes:
                    if not n.check_rollback(spark):
                        n.check()
                time.sleep(0.05)
            return 0
        except Exception:
            logger.exception("spark driver failed")
            return 1
        finally:
            for n in self.nodes:
                if n.query is not None and n.query.isActive:
                    n.query.stop()
            spark.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pyspark_bridge.driver PLAN.json", file=sys.stderr)
        return 2
    logs.setup(logging.INFO)
    driver = Driver(Path(argv[0]))
    signal.signal(signal.SIGTERM, driver.stop)
    signal.signal(signal.SIGINT, driver.stop)
    return driver.run()


if __name__ == "__main__":
    sys.exit(main())
