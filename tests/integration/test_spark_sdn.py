"""A spark-engine node on the SDN data plane: the ad-analytics pipeline on emulated hosts.

The node's workers keep their TAP ports, routing and credits; the agent of
the host with the node's first worker runs the Spark driver and holds its
workers back from "attached" until the driver serves, so sources start after.

One emulated 2-host cluster serves the module; each test submits its own
application (so each starts its own Spark driver, the slow part).  In
``make test``: the filter upstream of Spark is swapped from ``view`` to
``view, click`` through the reconfiguration API while the pipeline runs
(paper Fig. 14: windowed counts rise, none is lost), which is also the plain
run's check (workers on both hosts, every window before the swap equal to the
view-only reference).  In ``make test-long``: the plain run, and the driver
SIGKILLed mid-run and restarted by its agent from its checkpoint (counts stay
exact).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import finish, wait

from mininet_env.fabric import FabricPlan
from mininet_env.run import EmulatedCluster, SdnRunOptions
from pyspark_bridge.outbox import manifest_path, out_dir
from typhoon.operators.ads import (
    START_MS,
    per_window,
    reference_swap_counts,
    reference_window_counts,
)
from typhoon.report import build_report
from typhoon.topology import load_topology
from typhoon.topology.model import Topology

ROOT = Path(__file__).resolve().parents[2]
SEED = 7  # as in the topology file
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    options = SdnRunOptions(
        plan=FabricPlan(hosts=2, prefix=f"ty{secrets.token_hex(2)}s"),
        live=False,
        timeout=400,
        start_timeout=300,  # a cold Spark session takes tens of seconds here
        controller_config="reconfig_step_timeout = 60\n",  # a loaded machine starts workers slowly
        workdir=tmp_path_factory.mktemp("spark-sdn"),
    )
    c = EmulatedCluster(options)
    try:
        c.start()
        yield c
    finally:
        c.close()


def ad_topology(name: str, **events: int) -> Topology:
    topo = load_topology(ROOT / "topologies" / "ad_analytics.yaml")
    topo.name = name
    topo.nodes["events"].args.update(events)
    params = topo.nodes["campaign_counts"].args["params"]
    params["campaigns"] = str(ROOT / params["campaigns"])
    return topo


def final_counts(rows: list[list]) -> dict[tuple[str, int], int]:
    """Last (largest) count per (campaign, window); an update sent twice is an error."""
    assert len({(c, w, n) for c, w, _, n, _ in rows}) == len(rows), "an update was sent twice"
    final: dict[tuple[str, int], int] = {}
    for campaign, start, _end, count, _ts in rows:
        final[(campaign, start)] = max(final.get((campaign, start), 0), count)
    return final


def engines_dir(c: EmulatedCluster, app: str) -> Path:
    return c.workdir / app / "engines" / "spark"


def wait_first_batch(c: EmulatedCluster, app: str) -> Path:
    """The node's outbox, once Spark published its first batch."""
    outbox = out_dir(engines_dir(c, app) / "campaign_counts")
    wait(lambda: manifest_path(outbox, 0).exists(), 300, f"the first Spark batch of {app}")
    return outbox


def driver_pids(plan: Path) -> list[int]:
    """Live ``python -m pyspark_bridge.driver PLAN`` processes for this plan file."""
    want = ["-m", "pyspark_bridge.driver", str(plan)]
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if argv[1:] == want:
            found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def finish_and_report(c: EmulatedCluster, app: str) -> dict:
    return build_report(*finish(c, app))


# the swap test below checks the same (both hosts, exact view counts before the swap): its
# run is the plain run with a swap in the middle, so the plain run is `make test-long`
@pytest.mark.long
def test_ad_analytics_on_emulated_hosts_counts_equal_reference(cluster):
    t = ad_topology("ad_analytics", count=20000)
    report = cluster.run(t)
    assert report["ok"], report.get("exit_codes")
    assert {w["host"] for w in report["workers"]} == {"h1", "h2"}
    assert final_counts(report["results"]["sink"]["tuples"]) == reference_window_counts(20000, SEED)
    assert report["results"]["campaign_counts"]["replays_dropped"] == 0


@pytest.mark.long  # a further variant of the swap test's run (make test-long)
def test_driver_killed_mid_run_is_restarted_and_counts_stay_exact(cluster):
    """SIGKILL the Spark driver after its first published batch: the agent restarts it from
    its checkpoint and offset logs; every window's final count equals the reference."""
    app, count = "adkill", 30000
    cluster.submit(ad_topology(app, count=count, rate=1000))  # 30 s of events
    cluster.wait_active(app)
    outbox = wait_first_batch(cluster, app)
    (plan,) = engines_dir(cluster, app).glob("spark-driver-*.json")
    host = json.loads(plan.read_text())["host"]
    (pid,) = driver_pids(plan)
    jvm = int(plan.with_suffix(".jvm.pid").read_text())
    assert alive(jvm)
    os.kill(pid, signal.SIGKILL)  # mid-run: the node has input Spark has not processed yet
    killed = time.monotonic()
    assert not (outbox / "done").exists()
    published = len(list(outbox.glob("*.json")))
    (new,) = wait(lambda: [p for p in driver_pids(plan) if p != pid], 60, "a new driver")
    restart_s = time.monotonic() - killed
    wait(lambda: not alive(jvm), 60, "the killed driver's JVM to exit")  # no shared checkpoint
    report = finish_and_report(cluster, app)
    agent_log = (cluster.workdir / f"agent-{host}.log").read_text()
    reason = f"{app}: engine service spark-driver-{host} exited -9; restart 1 of 3"
    assert reason in agent_log
    spark = report["results"]["campaign_counts"]
    print(
        f"\ndriver {pid} killed after batch {published - 1}; new driver {new} "
        f"{restart_s:.1f} s later; {spark['batches']} batches, "
        f"{spark['replays_dropped']} replayed batch(es) not published again"
    )
    assert final_counts(report["results"]["sink"]["tuples"]) == reference_window_counts(count, SEED)
    assert spark["appended"] == sum(reference_window_counts(count, SEED).values())
    assert spark["batches"] > published  # the new driver went on from the checkpoint


def test_filter_swap_view_to_view_and_click_counts_rise_nothing_lost(cluster, tmp_path):
    """Paper Fig. 14 on this pipeline: ``typhoon swap`` of the filter while Spark counts.

    ``events`` and ``parse`` have one worker each, so ``parse`` hands the events
    to the filter in event order and switches to the new filter worker at one
    point: the old filter's input count is the index of the first event the new
    filter saw.  Every window must then equal the reference that counts views
    before that event and views and clicks from it on.
    """
    # 24 s of events; a 10 s window holds 3,000 of them, so the swap (requested after a
    # quarter) lands with whole windows before and after it
    app, count, per_second = "adswap", 24000, 300
    window_events = 10 * per_second
    t = ad_topology(app, count=count, rate=1000, per_second=per_second)
    assert t.nodes["events"].parallelism == t.nodes["parse"].parallelism == 1
    cluster.submit(t)
    cluster.wait_active(app)
    physical = cluster.coordinator.get_physical(app)
    old = {w.worker_id for w in physical.of_node("views")}
    (source,) = [w.worker_id for w in physical.of_node("events")]

    def emitted() -> int:
        return sum(cluster.coordinator.get_metrics(app).get(source, {}).get("out", {}).values())

    # a quarter of the events out (Spark's first batch may take longer than all of them here)
    wait(lambda: emitted() >= count // 4, 120, "a quarter of the events", 0.2)
    typhoon = str(Path(sys.executable).with_name("typhoon"))
    args = json.dumps({"field": "event_type", "values": ["view", "click"]})
    config = str(cluster.workdir / "client.ini")
    p = subprocess.run(
        [typhoon, "swap", app, "views", "filter", "--args", args, "--config", config],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    record = cluster.rest("GET", f"/apps/{app}/reconfig")[1]
    assert record["state"] == "done", record
    report = finish_and_report(cluster, app)
    assert report["ok"], report["problems"]
    assert {w["host"] for w in report["workers"]} == {"h1", "h2"}

    views = [w for w in report["workers"] if w["node"] == "views"]
    assert {w["worker"] for w in views} > old  # the swapped-in worker ran too
    cut = sum(sum(w["in"].values()) for w in views if w["worker"] in old)
    assert sum(sum(w["in"].values()) for w in views) == count  # no event lost at the filter
    got = final_counts(report["results"]["sink"]["tuples"])
    kw = {"seed": SEED, "per_second": per_second}
    only_views = reference_swap_counts(count, count, ("view",), (), **kw)
    views_clicks = reference_swap_counts(count, 0, (), ("view", "click"), **kw)
    expected = reference_swap_counts(count, cut, ("view",), ("view", "click"), **kw)
    totals, lo, hi = per_window(got), per_window(only_views), per_window(views_clicks)
    swap_ms = START_MS + cut * 1000 // per_second
    print(f"\nswap: {record['seconds']:.2f} s from request to done; first event through the new "
          f"filter: {cut} (event time +{(swap_ms - START_MS) / 1000:.1f} s)")  # fmt: skip
    for start, n in totals.items():
        print(f"  window +{(start - START_MS) / 1000:4.0f} s: {n:5d} (views {lo[start]:5d}, "
              f"views+clicks {hi[start]:5d})")  # fmt: skip
    before = [w for w in lo if w + 10_000 <= swap_ms]
    after = [w for w in lo if w >= swap_ms]
    assert before and after, f"the swap (event {cut}) did not land mid-run"
    assert window_events <= cut <= count - window_events
    for w in before:
        assert totals[w] == lo[w], w
    for w in after:
        assert totals[w] == hi[w], w
        assert hi[w] > lo[w]  # counts rise
    for w in set(lo) - set(before) - set(after):  # the window the swap fell in
        assert lo[w] <= totals[w] <= hi[w], w
    assert got == expected  # per campaign and window: nothing lost, nothing counted twice
    spark = report["results"]["campaign_counts"]
    assert spark["appended"] == sum(expected.values())
    assert spark["replays_dropped"] == 0
