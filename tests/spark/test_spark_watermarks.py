"""A spark node shares the watermark: a whole run over tcp with a real Spark driver process.

``topologies/spark_windows.yaml``: the fabric's spout makes the watermark, a
spark node sums per key in 100 ms windows by Spark's own watermark (append
mode, so a window leaves Spark once, when Spark's watermark passes its end),
and the fabric's ``window_aggregate`` rolls those up into 1-second windows.
Its windows close on the spark node's output watermark (Spark's), so they
must close while the spark node is still running, not only at end of stream,
and nothing must be late on the way.  The reference is computed from the
generated events: Spark emits the 100 ms windows whose end its final
watermark (the largest event time minus the 500 ms delay) reached.

Marked ``long``: a whole run with its own Spark driver took 27 to 100 s on
the shared 2-core machine, over what ``make test`` can afford.  With the
output watermark switched off (``output_watermark`` returning None) it fails:
the windows are still exact, closed at end of stream, but none closed before.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from pyspark_bridge.outbox import out_dir
from typhoon.operators.events import event
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
DELAY_MS = 500  # the spark node's withWatermark delay in topologies/spark_windows.yaml

pytestmark = pytest.mark.slow


def reference(args: dict[str, Any], delay_ms: int) -> dict[tuple[str, int, int], int]:
    """1-second sums per key of the events in the 100 ms windows Spark emits."""
    events = [event(i, args)[0] for i in range(args["count"])]
    final_wm = max(ts for _, ts, _ in events) - delay_ms
    want: dict[tuple[str, int, int], int] = {}
    for key, ts, value in events:
        if ts // 100 * 100 + 100 <= final_wm:  # Spark evicts a window once its end <= watermark
            w = (key, ts // 1000 * 1000, ts // 1000 * 1000 + 1000)
            want[w] = want.get(w, 0) + value
    return want


@pytest.mark.long  # 27-100 s here with its Spark driver (suite budget): make test-long
def test_fabric_windows_close_on_spark_watermark_before_end_of_stream(tmp_path: Path) -> None:
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "spark_windows.yaml"))
    args = t.nodes["events"].args
    seen: dict[str, Any] = {"fired": 0, "out": [], "window_wm": []}

    def watch(cluster: TcpCluster, _elapsed: float) -> None:
        """What the window and spark workers said while the spark node was not done."""
        if (out_dir(cluster.topology.nodes["sums"].args["dir"]) / "done").exists():
            return  # metrics read from here on may be of after its end of stream
        (window,) = cluster.workers_of("window")
        (sums,) = cluster.workers_of("sums")
        m = cluster.metrics.get(window, {})
        seen["fired"] = max(seen["fired"], m.get("windows_fired", 0))
        if "watermark" in m:
            seen["window_wm"].append(m["watermark"])
        if "watermark_out" in cluster.metrics.get(sums, {}):
            seen["out"].append(cluster.metrics[sums]["watermark_out"])

    options = RunOptions(live=False, timeout=300, live_every=0.25, on_turn=[watch])
    cluster = TcpCluster(t, options, workdir=tmp_path / "run")
    try:
        cluster.start()
        cluster.activate()
        clean = cluster.wait()
        report = cluster.report(clean)
    finally:
        cluster.close()
    print("observed:", seen["fired"], seen["out"][:2], seen["out"][-2:], len(seen["out"]))
    assert report["ok"], report["problems"]
    got = {(k, s, e): v for k, s, e, v in report["results"]["results"]["tuples"]}
    want = reference(args, DELAY_MS)
    assert got == want
    assert len(want) >= 4 * 5
    assert report["results"]["too_late"]["tuples"] == []
    # windows closed while the spark node ran: on its output watermark, not at +inf
    assert seen["fired"] >= 4, seen
    assert seen["out"] and seen["out"] == sorted(seen["out"]), seen["out"]
    assert seen["window_wm"] and max(seen["window_wm"]) >= 1000
    spark = report["results"]["sums"]
    # the output carried Spark's watermark: a multiple of a millisecond of event time, and
    # at the end as high as Spark's final one (the largest time minus the delay)
    events = [event(i, args)[0] for i in range(args["count"])]
    assert spark["watermark_out"] == [max(ts for _, ts, _ in events) - DELAY_MS]
    assert spark["watermark_ahead"] == 0  # one source, delay 500 >= out_of_order_ms 200 + lag
    assert spark["late_rows"] == 0
    workers = {w["node"]: w for w in report["workers"]}
    assert workers["window"]["watermark_closed"] == 1
