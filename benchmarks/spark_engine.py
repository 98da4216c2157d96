"""Spark node vs the python engine's built-ins on the ad-analytics pipeline, over tcp.

``python -m benchmarks.spark_engine [--count N] [--rate R] [--out FILE]`` runs
the pipeline four times: throughput (unlimited source) and latency (source
paced at ``--rate``), with the window count on the spark engine
(``topologies/ad_analytics.yaml``, update mode every 200 ms) and on the python
engine (``topologies/ad_analytics_native.yaml``: ``lookup`` and
``window_aggregate``, one final row per window once the watermark passes its
end).  Latency (spark only: a final window row carries no emit time) is
arrival at the sink minus the emit time of the newest event a window row
counts; rows whose newest event came in the first ``--warmup`` seconds are
left out (Spark's first batch carries its start-up).  Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from typhoon.operators.ads import percentiles, reference_window_counts
from typhoon.tcp_cluster import RunOptions, run_tcp
from typhoon.topology import load_topology
from typhoon.topology.model import Topology

REPO = Path(__file__).resolve().parents[1]
AD_YAML = REPO / "topologies" / "ad_analytics.yaml"
AD_NATIVE_YAML = REPO / "topologies" / "ad_analytics_native.yaml"


def variant(engine: str, count: int, rate: float) -> Topology:
    topo = load_topology(AD_YAML if engine == "spark" else AD_NATIVE_YAML)
    topo.nodes["events"].args.update(count=count, rate=rate)
    if engine == "spark":
        params = topo.nodes["campaign_counts"].args["params"]
        params["campaigns"] = str(REPO / params["campaigns"])
        topo.nodes["sink"].operator = "typhoon.operators.ads:LatencyCollect"
    else:
        lookup = topo.nodes["campaign"].args
        lookup["table"] = str(REPO / lookup["table"])
    return topo


def measure(engine: str, count: int, rate: float, warmup: float) -> dict[str, Any]:
    r = run_tcp(variant(engine, count, rate), RunOptions(live=False, timeout=900), out=sys.stderr)
    sink = r["results"]["sink"]
    final: dict[tuple[str, int], int] = {}
    for c, w, _, n, *_ts in sink["tuples"]:
        final[(c, w)] = max(final.get((c, w), 0), n)
    views = r["nodes"]["campaign_counts"]["tuples_in"]
    samples = sink.get("samples", [])
    first = min((ts for ts, _ in samples), default=0.0)
    steady = [lat for ts, lat in samples if ts >= first + warmup]
    out: dict[str, Any] = {
        "engine": engine,
        "events": count,
        "rate": rate,
        "ok": r["ok"],
        "exact": final == reference_window_counts(count, 7),
        "elapsed_s": r["elapsed_s"],
        "views": views,
        "pipeline_events_per_s": round(count / r["elapsed_s"]),
        "node_tuples_per_s": round(views / r["elapsed_s"]),
        "latency_s": percentiles(steady) if engine == "spark" else None,
        "rows": sink["count"],
    }
    progress = [e for e in r.get("spark_progress", []) if e["input_rows"]]
    if progress:  # what Spark itself measured; the first data batch carries the start-up
        steady_batches = progress[1:] or progress
        busy_ms = sum(e["batch_ms"] for e in steady_batches)
        out["spark"] = {
            "batches": len(progress),
            "first_batch_ms": progress[0]["batch_ms"],
            "steady_rows_per_s": round(
                sum(e["input_rows"] for e in steady_batches) * 1000 / max(busy_ms, 1)
            ),
            "max_processed_rows_per_s": max(e["processed_rows_per_s"] or 0 for e in progress),
            "steady_batch_ms_p50": sorted(e["batch_ms"] for e in steady_batches)[
                len(steady_batches) // 2
            ],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=300_000, help="events for the throughput runs")
    p.add_argument("--rate", type=float, default=1000.0, help="events/s for the latency runs")
    p.add_argument("--seconds", type=float, default=60.0, help="length of the latency runs")
    p.add_argument("--warmup", type=float, default=30.0)
    p.add_argument("--out", help="also write the JSON here")
    a = p.parse_args(argv)
    results = []
    for engine in ("spark", "python"):
        results.append({"run": "throughput", **measure(engine, a.count, 0.0, 0.0)})
        n = int(a.rate * a.seconds)
        results.append({"run": "latency", **measure(engine, n, a.rate, a.warmup)})
    text = json.dumps(results, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
