"""Fault detector end to end (paper §6.2 Fig. 10): Mininet, real OVS, Ryu with the app.

Wordcount as in Fig. 10: 1 source, 2 split, 4 count workers on 3 emulated
hosts; the source is rate-limited and long, so the count workers' aggregate
input rate is steady.  One split worker's process is SIGKILLed (pid from the
agent's worker status).  Pass: the fault detector wrote the source's ROUTING
without the dead worker within 100 ms of the port event and the source
acknowledged it; the count workers' input in the next 5 s is at least 80% of
the 5 s before; the replacement is attached and receives tuples.  The tuples
lost are counted (source's output minus what the splits received, the dead
one's last METRIC_RESP included) and must be no more than the dead worker
could hold: what reached it since its last METRIC_RESP plus the reroute window.
"""

from __future__ import annotations

import copy
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mininet_env.fabric import FabricPlan
from mininet_env.processes import free_port
from mininet_env.run import EmulatedCluster, SdnRunOptions, rest_call
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
RATE = 2000  # sentences per second
WORDS = 8
METRICS_S = 0.25
WINDOW_S = 5.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    options = SdnRunOptions(
        plan=FabricPlan(hosts=3, shape="mesh", prefix=f"ty{secrets.token_hex(2)}f"),
        apps=["apps/fault_detector.py"],
        live=False,
        timeout=120,
        controller_config=(
            f"metrics_interval = {METRICS_S}\n[fault_detector]\nheartbeat_timeout = 5.0\n"
        ),
        workdir=tmp_path_factory.mktemp("faults"),
    )
    c = EmulatedCluster(options)
    try:
        c.start()
        yield c
    finally:
        c.close()


def wait(predicate, timeout=20.0, what="condition", interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out waiting for {what}")


def total(m: dict, key: str) -> int:
    return sum(v for k, v in m.get(key, {}).items() if k != "0")


def count_in(c: EmulatedCluster, name: str, ids: list[int]) -> tuple[float, int]:
    """(wall time, tuples the count workers received), from METRIC_RESPs newer than now."""
    now = time.time()

    def fresh():
        ms = c.coordinator.get_metrics(name)
        got = [ms.get(w) for w in ids]
        return got if all(m and m["time"] > now for m in got) else None

    got = wait(fresh, 10, "fresh metrics of the count workers")
    return max(m["time"] for m in got), sum(total(m, "in") for m in got)


def test_split_worker_killed_is_routed_around_and_replaced(cluster):
    c = cluster
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.name = name = f"wcfault{secrets.token_hex(2)}"
    t.nodes["source"].args.update(count=10**8, rate=RATE, words=WORDS)
    c.submit(t)
    c.wait_active(name)
    physical = c.coordinator.get_physical(name)
    source = physical.active_of_node("source")[0].worker_id
    splits = [w.worker_id for w in physical.active_of_node("split")]
    counts = [w.worker_id for w in physical.active_of_node("count")]
    time.sleep(3.0)  # steady state

    t0, n0 = count_in(c, name, counts)
    time.sleep(WINDOW_S)
    t1, n1 = count_in(c, name, counts)
    before = (n1 - n0) / (t1 - t0)

    victim = splits[0]
    pid = c.coordinator.worker_statuses(name)[victim].pid
    os.kill(pid, signal.SIGKILL)
    killed = time.time()

    incident = wait(
        lambda: next(
            (
                i
                for i in c.rest("GET", "/faults")[1]
                if i["app"] == name and i["worker"] == victim and i["reroute_acked_ms"]
            ),
            None,
        ),
        10,
        "the fault detector to reroute around the dead split worker",
    )
    t2, n2 = count_in(c, name, counts)
    time.sleep(WINDOW_S)
    t3, n3 = count_in(c, name, counts)
    after = (n3 - n2) / (t3 - t2)

    def rejoined():
        i = next(i for i in c.rest("GET", "/faults")[1] if i["worker"] == victim)
        return i if i["state"] in ("rejoined", "failed") else None

    incident = wait(rejoined, 40, "the replacement to rejoin")
    assert incident["state"] == "rejoined", incident
    new = incident["replacement"]
    assert new not in {w.worker_id for w in physical.workers}
    status = c.coordinator.worker_statuses(name)[new]
    assert status.state in ("attached", "running"), status
    new_in = wait(
        lambda: total(c.coordinator.get_metrics(name).get(new, {}), "in"),
        10,
        "the replacement to receive tuples",
    )

    # what was lost: drain the source, let the counters settle, compare
    status, reply = c.rest(
        "POST", f"/apps/{name}/control", {"type": "DRAIN", "body": {"version": 1}, "node": "source"}
    )
    assert status == 202, reply

    def settled():
        ms = c.coordinator.get_metrics(name)
        sent = total(ms[source], "out")
        got = sum(total(ms.get(w, {}), "in") for w in [*splits, new])
        time.sleep(1.0)
        ms2 = c.coordinator.get_metrics(name)
        again = sum(total(ms2.get(w, {}), "in") for w in [*splits, new])
        same = total(ms2[source], "out") == sent and again == got
        return (sent, got) if same else None

    sent, received = wait(settled, 30, "the counters to settle", 0.1)
    lost = sent - received
    detection_s = incident["detected_wall"] - killed
    print(
        f"\nfault detector: kill -> port event {detection_s * 1000:.1f} ms, "
        f"reroute written {incident['reroute_ms']:.2f} ms and acked "
        f"{incident['reroute_acked_ms']:.1f} ms after the port event, replacement {new} "
        f"written {incident['replaced_ms']:.1f} ms, rejoined {incident['rejoined_ms']:.1f} ms; "
        f"count input {before:.0f}/s before, {after:.0f}/s after ({after / before:.0%}); "
        f"replacement received {new_in}; sentences sent {sent}, received by splits "
        f"{received}, lost {lost}"
    )
    c.kill(name)

    assert incident["senders"] == [source]
    assert incident["reroute_ms"] < 100
    assert incident["reroute_acked_ms"] < 1000
    assert after >= 0.8 * before
    # only what the dead worker held: its input since its last report plus the reroute window
    assert 0 <= lost <= RATE * (METRICS_S + 0.1 + incident["reroute_acked_ms"] / 1000) + 200


@pytest.mark.parametrize(
    "apps",
    [
        ["apps/fault_detector.py"],
        ["apps/fault_detector.py", "apps/load_balancer.py", "apps/live_debugger.py"],
    ],
    ids=["alone", "with-others"],
)
def test_the_app_starts_alone_and_with_the_others(tmp_path, apps):
    """``ryu-manager apps/fault_detector.py [others]``: the core comes in by itself."""
    conf = tmp_path / "ryu.conf"
    conf.write_text(
        f"[typhoon]\ncoordinator = {tmp_path / 'c.db'}\napi_token = t\n"
        "[fault_detector]\nheartbeat_timeout = 3.0\n"
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
                return rest_call(url, "GET", "/faults")
            except OSError:
                return None

        assert wait(answers, 30, "the fault detector's REST API") == (200, [])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
    text = (tmp_path / "ryu.log").read_text()
    assert "instantiating app controller.core" in text
    assert "fault detector ready: heartbeat_timeout=3 s" in text
