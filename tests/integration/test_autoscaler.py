"""Autoscaler on Mininet, real OVS and Ryu (paper §4 "Auto scaler", §6.2 Fig. 11).

A source at a fixed rate feeds a ``busy`` stage of 2 workers that cannot keep
up (each serves 1000 tuples/s; the source sends 2600/s), then a sequence
checker.  The autoscaler (``apps/autoscaler.py``) must add a third worker
within 10 s of the overload starting, through a stable update; the sink's rate
must rise; then the input drops (INPUT_RATE via REST) and it must scale back
down.  The sink's sequence checker proves that neither update lost or
duplicated a tuple.  The same scenario on wordcount (split's words go through
the busy stage to count) shows the count workers' rate rising with the third
worker; and the app starts alone and with the other apps in one ryu-manager.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mininet_env.fabric import FabricPlan
from mininet_env.processes import free_port
from mininet_env.run import EmulatedCluster, SdnRunOptions, rest_call
from typhoon.report import build_report, read_worker_reports
from typhoon.topology import load_topology_text

ROOT = Path(__file__).resolve().parents[2]
RATE = 2600.0  # tuples/s: above 2 busy workers (2000/s), below 3 (3000/s)
LOW_RATE = 300.0

TOPOLOGY = f"""
name: asfwd
spouts:
  - id: source
    operator: sequence_source
    args: {{size: 100, rate: {RATE}}}
bolts:
  - id: work
    operator: busy
    parallelism: 2
    args: {{cost_us: 1000}}
  - id: sink
    operator: sequence_check
streams:
  - from: source
    to: work
    grouping: shuffle
  - from: work
    to: sink
    grouping: shuffle
"""

SETTINGS = (
    "metrics_interval = 0.5\n"
    "[autoscaler]\n"
    "nodes = work\n"
    "busy_high = 0.9\n"
    "busy_low = 0.3\n"
    "up_window = 2.0\n"
    "down_window = 4.0\n"
    "cooldown = 4.0\n"
    "min_parallelism = 2\n"
    "max_parallelism = 3\n"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    options = SdnRunOptions(
        plan=FabricPlan(hosts=3, shape="mesh", prefix=f"ty{secrets.token_hex(2)}a"),
        apps=["apps/autoscaler.py"],
        live=False,
        timeout=120,
        controller_config=SETTINGS,
        workdir=tmp_path_factory.mktemp("autoscale"),
    )
    c = EmulatedCluster(options)
    try:
        c.start()
        yield c
    finally:
        c.close()


def wait(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out waiting for {what}")


def decisions(c: EmulatedCluster, name: str) -> list[dict]:
    status, report = c.rest("GET", f"/apps/{name}/autoscaler")
    return report.get("work", {}).get("decisions", []) if status == 200 else []


def receiving(c: EmulatedCluster, name: str, wid: int) -> bool:
    m = c.coordinator.get_metrics(name).get(wid, {})
    return sum(v for k, v in m.get("in", {}).items() if k != "0") > 0


def sink_rate(timeline: dict[str, int], tick: float, start: float, end: float) -> float:
    """Tuples per second that reached the sink in [start, end) (ticks without any count 0)."""
    n = sum(c for k, c in timeline.items() if start <= int(k) * tick < end)
    return n / (end - start)


def test_fig11_overload_scales_up_then_idle_scales_down_losing_nothing(cluster):
    t = load_topology_text(TOPOLOGY, "asfwd")
    cluster.submit(t)
    cluster.wait_active(t.name)
    overload = time.time()  # the source runs at RATE from its start
    before = {w.worker_id for w in cluster.coordinator.get_physical(t.name).of_node("work")}

    up = wait(lambda: [d for d in decisions(cluster, t.name) if d["action"] == "scale up"],
              30, "a scale-up decision")[0]  # fmt: skip
    assert (up["from"], up["to"]) == (2, 3), up

    def new_worker():
        now = {w.worker_id for w in cluster.coordinator.get_physical(t.name).of_node("work")}
        return sorted(now - before)

    added = wait(new_worker, 30, "the third work worker")
    wait(lambda: receiving(cluster, t.name, added[0]), 30, "the new worker to receive", 0.05)
    received = time.time()
    print(
        f"\nautoscaler: overload -> decision {up['time'] - overload:.2f} s, "
        f"-> new worker receiving {received - overload:.2f} s ({up['reason']})"
    )
    assert received - overload <= 10.0

    time.sleep(6.0)  # steady with 3 workers
    high_end = time.time()
    status, reply = cluster.rest(
        "POST", f"/apps/{t.name}/control",
        {"type": "INPUT_RATE", "body": {"rate": LOW_RATE}, "node": "source"},
    )  # fmt: skip
    assert status == 202, reply
    dropped = time.time()
    down = wait(lambda: [d for d in decisions(cluster, t.name) if d["action"] == "scale down"],
                40, "a scale-down decision")[0]  # fmt: skip
    assert (down["from"], down["to"]) == (3, 2), down
    wait(lambda: len(cluster.coordinator.get_physical(t.name).of_node("work")) == 2
         and cluster.rest("GET", f"/apps/{t.name}/reconfig")[1]["state"] == "done",
         40, "the scale-down to finish")  # fmt: skip
    print(f"autoscaler: input drop -> scale-down decision {down['time'] - dropped:.2f} s")
    records = [d for d in decisions(cluster, t.name) if d["action"].startswith("scale")]
    assert all("started" in d["outcome"] for d in records), records
    time.sleep(1.0)

    status, reply = cluster.rest(
        "POST", f"/apps/{t.name}/control",
        {"type": "DRAIN", "body": {"version": 1}, "node": "source"},
    )  # fmt: skip
    assert status == 202, reply
    topology = cluster.coordinator.get_topology(t.name)
    assert cluster.wait_finished(t.name)
    statuses = cluster.coordinator.worker_statuses(t.name)
    assert {s.exit_code for s in statuses.values()} == {0}, statuses
    cluster.kill(t.name)
    # the report follows sequence numbers through identity nodes only; busy passes
    # every tuple on unchanged, so it is reported as one
    topology.nodes["work"].operator, topology.nodes["work"].args = "identity", {}
    report = build_report(topology, read_worker_reports(cluster.report_dir(t.name)))

    sink = report["results"]["sink"]
    print(
        f"autoscaler: {sink['received']:,} tuples, missing {sink['missing']}, "
        f"duplicates {sink['duplicates']}"
    )
    assert sink["received"] > 0 and sink["missing"] == 0 and sink["duplicates"] == 0
    tick = sink["tick_s"]
    rate_before = sink_rate(sink["timeline"], tick, overload + 0.5, up["time"])
    rate_after = sink_rate(sink["timeline"], tick, received + 1.0, high_end)
    print(f"autoscaler: sink {rate_before:,.0f}/s with 2 workers, {rate_after:,.0f}/s with 3")
    assert rate_after > rate_before * 1.15


# ----- wordcount (paper Fig. 11): count throughput before and after ------------------------

SENTENCE_RATE = 325.0  # 8 words each: 2600 words/s into the busy stage
WORDCOUNT = f"""
name: aswc
spouts:
  - id: source
    operator: sentence_source
    args: {{seed: 7, words: 8, vocabulary: 500, rate: {SENTENCE_RATE}}}
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: work
    operator: busy
    parallelism: 2
    args: {{cost_us: 1000}}
  - id: count
    operator: count_by_key
    args: {{key: word}}
    parallelism: 4
    stateful: true
streams:
  - from: source
    to: split
    grouping: shuffle
  - from: split
    to: work
    grouping: shuffle
  - from: work
    to: count
    grouping: {{type: fields, fields: [word]}}
"""


def counted(c: EmulatedCluster, name: str) -> int:
    """Words the count workers took in so far (finished workers keep their last report)."""
    metrics = c.coordinator.get_metrics(name)
    ids = {w.worker_id for w in c.coordinator.get_physical(name).of_node("count")}
    return sum(sum(v for k, v in metrics.get(w, {}).get("in", {}).items() if k != "0") for w in ids)


def count_rate(c: EmulatedCluster, name: str, seconds: float) -> float:
    first, t0 = counted(c, name), time.monotonic()
    time.sleep(seconds)
    return (counted(c, name) - first) / (time.monotonic() - t0)


def test_fig11_wordcount_count_throughput_rises_after_the_scale_up(cluster):
    t = load_topology_text(WORDCOUNT, "aswc")
    cluster.submit(t)
    cluster.wait_active(t.name)
    overload = time.time()
    time.sleep(0.5)
    rate_before = count_rate(cluster, t.name, 2.0)  # the window is 2 s: still 2 workers
    up = wait(lambda: [d for d in decisions(cluster, t.name) if d["action"] == "scale up"],
              30, "a scale-up decision")[0]  # fmt: skip
    assert (up["from"], up["to"]) == (2, 3), up
    wait(lambda: len(cluster.coordinator.get_physical(t.name).of_node("work")) == 3
         and cluster.rest("GET", f"/apps/{t.name}/reconfig")[1]["state"] == "done",
         30, "the scale-up to finish")  # fmt: skip
    done = time.time()
    assert done - overload <= 10.0, done - overload
    time.sleep(1.0)
    rate_after = count_rate(cluster, t.name, 3.0)
    print(
        f"\nwordcount: overload -> decision {up['time'] - overload:.2f} s, -> update done "
        f"{done - overload:.2f} s; count {rate_before:,.0f} words/s with 2 work workers, "
        f"{rate_after:,.0f} with 3"
    )
    assert rate_after > rate_before * 1.15

    status, reply = cluster.rest(
        "POST", f"/apps/{t.name}/control",
        {"type": "INPUT_RATE", "body": {"rate": LOW_RATE / 8}, "node": "source"},
    )  # fmt: skip
    assert status == 202, reply
    down = wait(lambda: [d for d in decisions(cluster, t.name) if d["action"] == "scale down"],
                40, "a scale-down decision")[0]  # fmt: skip
    assert (down["from"], down["to"]) == (3, 2), down
    wait(lambda: len(cluster.coordinator.get_physical(t.name).of_node("work")) == 2
         and cluster.rest("GET", f"/apps/{t.name}/reconfig")[1]["state"] == "done",
         40, "the scale-down to finish")  # fmt: skip
    cluster.kill(t.name)


@pytest.mark.parametrize(
    "apps",
    [
        ["apps/autoscaler.py"],
        ["apps/autoscaler.py", "apps/load_balancer.py", "apps/live_debugger.py"],
    ],
    ids=["alone", "with-others"],
)
def test_the_app_starts_alone_and_with_the_others(tmp_path, apps):
    """``ryu-manager apps/autoscaler.py [others]``: the core comes in by itself."""
    conf = tmp_path / "ryu.conf"
    conf.write_text(
        f"[typhoon]\ncoordinator = {tmp_path / 'c.db'}\napi_token = t\n"
        "[autoscaler]\nrecommend_only = true\nmax_step = 2\n"
    )
    port, ofp = free_port(), free_port()
    log = open(tmp_path / "ryu.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("ryu-manager")), "--config-file", str(conf),
         "--wsapi-host", "127.0.0.1", "--wsapi-port", str(port),
         "--ofp-tcp-listen-port", str(ofp), *apps],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/typhoon"

        def answers():
            assert proc.poll() is None, (tmp_path / "ryu.log").read_text()
            try:
                return rest_call(url, "GET", "/autoscaler")
            except OSError:
                return None

        assert wait(answers, 30, "the autoscaler's REST API") == (200, {})
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
    text = (tmp_path / "ryu.log").read_text()
    assert "instantiating app controller.core" in text
    assert "autoscaler ready" in text and "recommend_only=True" in text and "max_step=2" in text
