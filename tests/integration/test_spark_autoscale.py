"""A spark node falls behind; the autoscaler, reading EventSparkMetrics, adds a worker.

Real OVS, Ryu and Mininet, a real local Spark driver.  The node runs
``pyspark_bridge.examples:costly_enrichment``: every row waits ``COST_MS``
in a lookup (I/O-bound per-row work, as a remote enrichment call), inside the
task of its input partition.  The ``typhoon`` source makes one input partition
per worker log, so with one worker a micro-batch runs as one task and the
node processes at most ~1000 / COST_MS rows/s whatever the cores; a second
worker is a second partition, and ``local[4]`` runs both tasks at once (the
waits overlap even on this 2-core, loaded machine), so the processed rate
doubles.  That is what makes a scale-up of a spark node pay off here.  The
wait (20 ms) is large next to the CPU a row costs (decoding, Arrow, the
outbox: CPU that two partitions share on two loaded cores rather than
overlap), and a batch's fixed cost here is seconds, so rates stay low.

The source starts slow while a cold Spark session warms up (its first
batches take seconds; the autoscaler does not judge them: ``spark_warmup``),
then INPUT_RATE raises it to ``RATE``, just above one worker's capacity and
about half of two workers'.  Batches then grow and process fewer rows per
second than arrive; the autoscaler (Spark rules only: ``nodes = enrich``)
must scale ``enrich`` from 1 to 2 workers for that reason, through a stable
update; the new worker's log becomes a second input partition from the next
micro-batch on, and the batches after that one stop growing (rows per batch, a
count).  The processed and input rates, before and after, are printed: how much
the second partition speeds the node up is a rate against a rate, which a busy
machine bends, so it is measured, not asserted.  The sink's sequence checker
proves that nothing was lost or doubled across the scale-up.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest
from harness import wait

from mininet_env.fabric import FabricPlan
from mininet_env.run import EmulatedCluster, SdnRunOptions
from typhoon.report import build_report, read_worker_reports
from typhoon.topology import load_topology_text

pytestmark = pytest.mark.slow

LOW_RATE = 8.0  # rows/s while Spark warms up: one worker keeps up easily
RATE = 52.0  # rows/s: ~1.05 x what one worker processes (1000 / COST_MS), ~0.5 x two
# the wait dominates the CPU a row costs (decoding, Arrow, the outbox: ~1 ms on 2 loaded
# cores, which two partitions share rather than overlap), so a second partition really doubles
COST_MS = 20.0
TRIGGER_MS = 3000
WARMUP = 4  # batches the autoscaler does not judge: the low-rate phase, cold batches included
AFTER = 2  # progress events after the first batch that reads both workers' logs

TOPOLOGY = f"""
name: sparkscale
config:
  spark.master: local[4]
spouts:
  - id: source
    operator: sequence_source
    args: {{size: 16, rate: {LOW_RATE}}}
bolts:
  - id: enrich
    engine: spark
    operator: pyspark_bridge.examples:costly_enrichment
    args:
      schema: {{src: bigint, seq: bigint, ts: double, payload: binary}}
      fields: [src, seq, ts, payload]
      output_mode: append
      trigger_ms: {TRIGGER_MS}
      params: {{cost_ms: {COST_MS}}}
  - id: sink
    operator: sequence_check
streams:
  - from: source
    to: enrich
    grouping: shuffle
  - from: enrich
    to: sink
    grouping: shuffle
"""

SETTINGS = (
    "metrics_interval = 0.5\n"
    "reconfig_step_timeout = 60\n"
    "[autoscaler]\n"
    "nodes = enrich\n"
    "up_window = 2.0\n"
    "spark_window = 2\n"  # the node must be behind over two batches
    f"spark_warmup = {WARMUP}\n"  # a cold session's first batches take seconds more here
    "down_window = 10.0\n"
    "cooldown = 60.0\n"
    "min_parallelism = 1\n"
    "max_parallelism = 2\n"
    "spark_lag = 0.9\n"
)


def progress(node_dir: Path) -> list[dict]:
    """The driver's progress events of the node (what EventSparkMetrics carries)."""
    try:
        text = (node_dir / "metrics" / "progress.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def readers(event: dict) -> set[str]:
    """Worker IDs whose log the batch read (its source end offsets)."""
    ends = event["sources"][0]["end"] if event.get("sources") else None
    if isinstance(ends, str):
        ends = json.loads(ends)
    return set(ends or {})


def rates(events: list[dict]) -> tuple[float, float]:
    """(input, processed) rows/s over ``events``: rows over the time they covered."""
    rows = sum(e["input_rows"] for e in events)
    inp = sum(e["input_rows"] / e["input_rows_per_s"] for e in events if e["input_rows_per_s"])
    done = sum(e["batch_ms"] / 1000.0 for e in events)
    return rows / inp, rows / done


def test_spark_node_falls_behind_autoscaler_adds_a_worker_and_it_catches_up(tmp_path):
    t0 = time.monotonic()
    options = SdnRunOptions(
        plan=FabricPlan(hosts=2, prefix=f"ty{secrets.token_hex(2)}k"),
        apps=["apps/autoscaler.py"],
        live=False,
        timeout=150,
        start_timeout=240,  # a cold Spark session takes tens of seconds here
        controller_config=SETTINGS,
        workdir=tmp_path,
    )
    t = load_topology_text(TOPOLOGY, "sparkscale")
    c = EmulatedCluster(options)
    try:
        c.start()
        c.submit(t)
        c.wait_active(t.name)
        node_dir = tmp_path / t.name / "engines" / "spark" / "enrich"
        before = {w.worker_id for w in c.coordinator.get_physical(t.name).of_node("enrich")}

        # the rate rises from batch WARMUP - 1 on, so the autoscaler judges only batches
        # that saw it; batches 0 and 1 of a cold session take seconds (JVM, Python workers)
        wait(lambda: any(e["batch"] >= WARMUP - 2 for e in progress(node_dir)), 120,
             "Spark to warm up at the low rate", 0.2)  # fmt: skip
        assert not decisions(c, t.name, "scale up"), "scaled up before the overload"
        status, reply = c.rest(
            "POST", f"/apps/{t.name}/control",
            {"type": "INPUT_RATE", "body": {"rate": RATE}, "node": "source"},
        )  # fmt: skip
        assert status == 202, reply
        overload, warm_events = time.monotonic(), len(progress(node_dir))

        up = wait(lambda: decisions(c, t.name, "scale up"), 60, "a scale-up decision", 0.2)[0]
        assert (up["from"], up["to"]) == (1, 2), up
        # the reason is a Spark progress event's: the node's only signal (EventSparkMetrics)
        assert "rows/s" in up["reason"] and (
            "processed <" in up["reason"] or "batch >" in up["reason"]
        ), up
        assert "started" in up["outcome"], up
        decided = time.monotonic()
        wait(
            lambda: c.rest("GET", f"/apps/{t.name}/reconfig")[1].get("state") == "done",
            90, "the scale-up to finish", 0.2,
        )  # fmt: skip
        scaled = time.monotonic()
        added = sorted(
            {w.worker_id for w in c.coordinator.get_physical(t.name).of_node("enrich")} - before
        )
        assert len(added) == 1, added
        new = str(added[0])

        def caught_up():
            ev = progress(node_dir)
            first = next((i for i, e in enumerate(ev) if new in readers(e)), None)
            return ev if first is not None and len(ev) >= first + 1 + AFTER else None

        events = wait(caught_up, 120, f"{AFTER} progress events after the scale-up", 0.2)
        first = next(i for i, e in enumerate(events) if new in readers(e))
        behind = [e for e in events[max(warm_events, first - 2) : first] if e["input_rows"]]
        after = events[first + 1 : first + 1 + AFTER]
        in_before, done_before = rates(behind)
        in_after, done_after = rates(after)
        print(
            f"\nspark autoscale: overload -> decision {decided - overload:.1f} s, -> update done "
            f"{scaled - overload:.1f} s ({up['reason']})\n"
            f"  1 worker : input {in_before:.0f} rows/s, processed {done_before:.0f} rows/s, "
            f"batches {[e['batch_ms'] for e in behind]} ms\n"
            f"  2 workers: input {in_after:.0f} rows/s, processed {done_after:.0f} rows/s, "
            f"batches {[e['batch_ms'] for e in after]} ms, "
            f"rows {[e['input_rows'] for e in after]}"
        )
        assert after[-1]["input_rows"] < max(e["input_rows"] for e in events[first - 1 :]), (
            "the backlog kept growing"
        )
        # shrinking a spark node is refused with the reason, nothing starts
        status, reply = c.rest(
            "POST", f"/apps/{t.name}/scale", {"node": "enrich", "parallelism": 1}
        )
        assert status == 409 and "only scaling it up is supported" in reply["error"], reply
        assert len(c.coordinator.get_physical(t.name).of_node("enrich")) == 2

        c.drain(t.name)
        topology = c.coordinator.get_topology(t.name)
        assert c.wait_finished(t.name), c.coordinator.worker_statuses(t.name)
        c.kill(t.name)
    finally:
        c.close()
    reports = read_worker_reports(tmp_path / t.name / "reports")
    spark = build_report(topology, reports)["results"]["enrich"]
    topology.nodes["enrich"].operator = "identity"  # rows pass through: follow their numbers
    topology.nodes["enrich"].engine, topology.nodes["enrich"].args = "python", {}
    report = build_report(topology, reports)
    sink = report["results"]["sink"]
    emitted = report["results"]["source"]["emitted"]
    print(
        f"  {emitted:,} rows emitted, sink received {sink['received']:,}, missing "
        f"{sink['missing']}, duplicates {sink['duplicates']}; test {time.monotonic() - t0:.0f} s"
    )
    assert sink["received"] == emitted > 0
    assert sink["missing"] == 0 and sink["duplicates"] == 0
    assert spark["replays_dropped"] == 0 and spark["rows_out"] == emitted


def decisions(c: EmulatedCluster, name: str, action: str) -> list[dict]:
    status, report = c.rest("GET", f"/apps/{name}/autoscaler")
    found = report.get("enrich", {}).get("decisions", []) if status == 200 else []
    return [d for d in found if d["action"] == action]
