"""``typhoon control`` on a live emulated cluster (Mininet, real OVS, Ryu, agents, workers):
each Table 2 verb sent from the CLI and obeyed by the workers, as their metrics show,
and the raw ``POST …/control`` refusing what bypasses the protocols (issue 34).

Rates are measured from the workers' METRIC_RESPs (tuples out over the time between
two of them) and compared with the rate asked for, never with another measurement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from harness import emulated_cluster, wait

from mininet_env.run import EmulatedCluster
from typhoon.topology import load_topology_text

TOPO = """
name: ctlcli
config: {batch_size: 100, max_delay_ms: 2}
spouts:
  - id: source
    operator: sequence_source
    args: {size: 100, rate: 2000}
bolts:
  - id: mid
    operator: identity
    parallelism: 2
  - id: sink
    operator: sequence_check
streams:
  - {from: source, to: mid, grouping: shuffle}
  - {from: mid, to: sink, grouping: global}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(tmp_path_factory.mktemp("ctl"), "c", hosts=2, timeout=300) as c:
        yield c


@pytest.fixture
def app(cluster):
    t = load_topology_text(TOPO, "ctlcli.yaml")
    cluster.submit(t)
    cluster.wait_active(t.name)
    yield t.name
    if cluster.coordinator.get_physical(t.name) is not None:
        cluster.kill(t.name)


def typhoon(c: EmulatedCluster, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TYPHOON_CONTROLLER": c.rest_url, "TYPHOON_TOKEN": c.token}
    return subprocess.run([sys.executable, "-m", "typhoon_cli", *argv], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def fresh(c: EmulatedCluster, name: str, wid: int) -> dict:
    """A METRIC_RESP of ``wid`` sent after now (the controller asks every 0.25 s)."""
    after = time.time()

    def newer():
        m = c.coordinator.get_metrics(name).get(wid)
        return m if m and m["time"] > after else None

    return wait(newer, 10, f"fresh metrics of worker {wid}")


def window(c: EmulatedCluster, name: str, wid: int, seconds: float = 2.0) -> dict[str, float]:
    """Tuples out per second, and tuples out per frame out, over ``seconds``."""
    m0 = fresh(c, name, wid)
    time.sleep(seconds)  # the measuring window, not a synchronisation
    m1 = fresh(c, name, wid)
    tuples = sum(m1["out"].values()) - sum(m0["out"].values())
    frames = m1["frames_out"] - m0["frames_out"]
    return {
        "rate": tuples / (m1["time"] - m0["time"]),
        "per_frame": tuples / frames if frames else 0.0,
        "tuples": tuples,
    }


def until(measure, ok, what: str, timeout: float = 20.0):
    """Measure until ``ok(value)``; fail with every value seen after ``timeout``."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        seen.append(measure())
        if ok(seen[-1]):
            return seen[-1]
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not in effect after {timeout:g} s, measured {seen}")


def test_every_control_verb_is_obeyed_by_the_workers(cluster, app):
    physical = cluster.coordinator.get_physical(app)
    src = physical.of_node("source")[0].worker_id
    mids = sorted(w.worker_id for w in physical.of_node("mid"))

    # --metrics: one row per worker, from the workers' own METRIC_RESPs
    p = typhoon(cluster, "control", app, "mid", "--metrics")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {int(line.split()[0]): line.split() for line in p.stdout.splitlines()[2:]}
    assert sorted(rows) == mids
    assert all(r[6] == "100" and r[7] == "2" and r[8] == "1" for r in rows.values()), p.stdout
    p = typhoon(cluster, "control", app, "source", "--metrics", "--json")
    doc = json.loads(p.stdout)["result"]["metrics"][str(src)]
    assert doc["node"] == "source" and doc["rate"] == 2000.0 and doc["active"] == 1
    assert sum(doc["out"].values()) > 0 and "rtt_ms" in doc

    # --input-rate: confirmed by the worker, and the measured rate stays under it
    until(lambda: window(cluster, app, src), lambda w: w["rate"] > 600, "the source at 2000/s")
    p = typhoon(cluster, "control", app, "source", "--input-rate", "300")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == f"  [ok] worker {src}: rate 300"
    until(
        lambda: window(cluster, app, src),
        lambda w: 0 < w["rate"] <= 300 * 1.15,
        "INPUT_RATE 300 on the source",
    )

    # --deactivate stops the emission, --activate resumes it
    p = typhoon(cluster, "control", app, "source", "--deactivate")
    assert p.returncode == 0 and p.stdout.endswith(": active 0\n"), p.stdout + p.stderr
    until(lambda: window(cluster, app, src, 1.0), lambda w: w["tuples"] == 0, "DEACTIVATE")
    p = typhoon(cluster, "control", app, "source", "--activate")
    assert p.returncode == 0 and p.stdout.endswith(": active 1\n"), p.stdout + p.stderr
    until(lambda: window(cluster, app, src, 1.0), lambda w: w["tuples"] > 0, "ACTIVATE")

    # --batch-size changes the frame batching: one tuple a batch, then eight a batch that
    # may wait a second (at 300/s shared by two receivers it fills long before).  Frames
    # out also counts the link's other frames (credit requests, probes): tuples per frame
    # stay under 1.5 with batches of one and over 2.5 with batches of eight
    p = typhoon(cluster, "control", app, "source", "--batch-size", "1", "--max-delay-ms", "0")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == f"  [ok] worker {src}: batch_size 1, max_delay_ms 0"
    one = until(lambda: window(cluster, app, src), lambda w: 0 < w["per_frame"] < 1.5, "size 1")
    p = typhoon(cluster, "control", app, "source", "--batch-size", "8", "--max-delay-ms", "1000")
    assert p.returncode == 0, p.stdout + p.stderr
    eight = until(lambda: window(cluster, app, src), lambda w: w["per_frame"] > 2.5, "size 8")
    print(f"tuples per frame out: batch size 1 {one}, batch size 8 {eight}")
    # without --max-delay-ms the workers' own (as they last reported it) is kept
    p = typhoon(cluster, "control", app, "mid", "--batch-size", "5")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-2:] == [
        f"  [ok] worker {w}: batch_size 5, max_delay_ms 2" for w in mids
    ]


def test_refusals_change_nothing(cluster, app):
    physical = cluster.coordinator.get_physical(app)
    src = physical.of_node("source")[0].worker_id
    mids = [w.worker_id for w in physical.of_node("mid")]
    # spout kinds for a bolt: refused by the controller, one line, exit 2
    p = typhoon(cluster, "control", app, "mid", "--input-rate", "5")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("error: INPUT_RATE paces a spout's emission, and 'mid' is a bolt")
    p = typhoon(cluster, "control", app, "sink", "--deactivate")
    assert p.returncode == 2 and "'sink' is a bolt" in p.stderr
    # the protocol steps through the raw endpoint: refused, pointing at the verbs
    bodies = {
        "ROUTING": {"stream": 1, "policy": "global", "next_hops": [mids[0]], "version": 9},
        "UPSTREAM": {"version": 9, "remove": [src]},
        "DRAIN": {"version": 9},
        "ROLLBACK": {"generation": 2, "epoch": -1},
    }
    for ctype, body in bodies.items():
        node = "source" if ctype in ("ROUTING", "DRAIN") else "mid"
        status, reply = cluster.rest(
            "POST", f"/apps/{app}/control", {"type": ctype, "body": body, "node": node}
        )
        assert status == 400, (ctype, reply)
        assert reply["error"].startswith(f"{ctype} is a step of a protocol"), reply
        assert reply["error"].endswith('give "force": true to send it anyway'), reply
    status, reply = cluster.rest(
        "POST", f"/apps/{app}/control", {"type": "ROUTING", "body": bodies["ROUTING"]}
    )
    assert status == 400 and "`typhoon route`" in reply["error"]
    status, reply = cluster.rest(
        "POST",
        f"/apps/{app}/control",
        {"type": "INPUT_RATE", "body": {"rate": 1.0}, "workers": [src, mids[0]]},
    )
    assert status == 400 and "'mid' is a bolt" in reply["error"], reply
    # nothing reached a worker: both mid workers still get tuples, none counted a drop
    for w in mids:
        until(lambda w=w: window(cluster, app, w, 1.0), lambda m: m["tuples"] > 0, f"mid {w}")
    metrics = cluster.coordinator.get_metrics(app)
    assert all("spout_control_to_bolt" not in metrics[w]["drops"] for w in mids)
    assert metrics[src]["rate"] == 2000.0 and metrics[src]["active"] == 1
    assert cluster.coordinator.get_physical(app).version == physical.version
