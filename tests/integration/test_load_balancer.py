"""Weighted load balancer end to end: Mininet bridges, real OVS, Ryu with apps/load_balancer.py.

Scenario (issue 5, paper §4 "Load balancer"): a source sends as fast as its
credits allow to the 3 workers of node ``work`` (built-in ``busy`` bolt,
300 us per tuple); the worker with index 2 takes three times as long
(``slow_index: 2, slow_factor: 3``), so the node's service rate is 3 + 3 + 1
and the slow worker's fair share a seventh.  Two hosts on a line: the source
and worker 0 on h1, workers 1 and 2 on h2, so the select group on h1 has a
local bucket and two that leave through the fabric.

The topology runs with ``sdn`` grouping (the app's select group, weights from
the workers' metrics).  Pass: no tuple is lost, and within 30 s of activation
every worker's share of the tuples is its share of the node's capacity (3/7,
3/7, 1/7) +- 5 points, and it stays there in every 5 s window sampled over the
20 s after that.  How ``shuffle`` compares (its shares drift with the credit
queues) and how much faster sdn is are a benchmark's questions (``typhoon
bench``), not this test's.

A second test restarts the controller under a running balanced topology with
a group changed behind its back and a stale one added: the restarted
controller reconciles them, leaves a foreign group alone, and still no tuple
is lost.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from harness import emulated_cluster, wait

from controller.rules.groups import lb_group_id, parse_group_id
from mininet_env.processes import start_controller
from mininet_env.run import EmulatedCluster, port_open
from typhoon import wire
from typhoon.report import read_worker_reports
from typhoon.topology import load_topology_text

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = (3, 3, 1)  # relative service rates of work[0], work[1], work[2] (slow_factor 3)
BAND = 0.05  # +- 5 points around each worker's share
CONVERGE_S = 30.0
STAY_S = 20.0  # sampled after CONVERGE_S: "stays there" is checked, not assumed
WINDOW_S = 5.0

TOPOLOGY = """
name: {name}
spouts:
  - id: source
    operator: sequence_source
    args: {{size: 50}}
bolts:
  - id: work
    operator: busy
    parallelism: 3
    args: {{cost_us: 300, slow_index: 2, slow_factor: 3, emit: false}}
streams:
  - from: source
    to: work
    grouping: {grouping}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(
        tmp_path_factory.mktemp("lb"),
        "l",
        hosts=2,
        shape="line",
        apps=["apps/load_balancer.py"],
        config=(
            "metrics_interval = 0.5\n"
            "[load_balancer]\ninterval = 2.0\nsettle = 1.0\nmin_frames = 300\n"
        ),
    ) as c:
        yield c


def topology(name: str, grouping: str):
    t = load_topology_text(TOPOLOGY.format(name=name, grouping=grouping), name)
    return copy.deepcopy(t)


def bridge_of(c: EmulatedCluster, host: str) -> str:
    return c.options.plan.bridge(int(host[1:]))


def ofctl(*args: str) -> str:
    return subprocess.run(
        ["ovs-ofctl", "-O", "OpenFlow13", *args], capture_output=True, text=True, check=True
    ).stdout


def group_ids(bridge: str) -> set[int]:
    return {int(g, 0) for g in re.findall(r"group_id=(\d+)", ofctl("dump-groups", bridge))}


class Sampler:
    """Cumulative tuples in per worker (from METRIC_RESPs), sampled once a second."""

    def __init__(self, c: EmulatedCluster, name: str, workers: list[int]) -> None:
        self.c, self.name, self.workers = c, name, workers
        self.samples: list[tuple[float, dict[int, tuple[float, int]]]] = []

    def take(self) -> None:
        m = self.c.coordinator.get_metrics(self.name)
        snap = {
            w: (m[w]["time"], sum(v for k, v in m[w]["in"].items() if k != "0"))
            for w in self.workers
            if w in m
        }
        if len(snap) == len(self.workers):
            self.samples.append((time.monotonic(), snap))

    def run(self, until: float) -> None:
        while time.monotonic() < until:
            self.take()
            time.sleep(1.0)  # sleep-ok: paced sampling, one sample a second

    def rates(self, end: int, seconds: float = WINDOW_S) -> dict[int, float] | None:
        """Tuples/s per worker over the window ending at sample ``end``."""
        t_end, last = self.samples[end]
        first = next(
            (s for t, s in reversed(self.samples[: end + 1]) if t_end - t >= seconds), None
        )
        if first is None:
            return None
        return {w: (last[w][1] - first[w][1]) / (last[w][0] - first[w][0]) for w in self.workers}


def drain_and_check_lossless(c: EmulatedCluster, name: str) -> dict:
    """Stop the source, let everything finish; every emitted tuple reached a worker."""
    state = c.coordinator.get_app_state(name) or {}
    c.coordinator.put_app_state(name, {**state, "drain": True})
    assert c.wait_finished(name)
    c.kill(name)
    reports = read_worker_reports(c.report_dir(name))
    source = next(r for r in reports if r["node"] == "source")
    work = [r for r in reports if r["node"] == "work"]
    emitted = source["result"]["emitted"]
    received = sum(r["metrics"]["in"].get("1", 0) for r in work)
    drops = [r["metrics"]["drops"] for r in reports]
    assert received == emitted, (received, emitted)
    assert all(not d for d in drops), drops
    return {"emitted": emitted, "source": source["metrics"]}


def shares(rates: dict[int, float], work: list[int]) -> list[float]:
    total = sum(rates.values())
    return [rates[w] / total for w in work]


def test_each_worker_gets_its_capacity_share_and_keeps_it(cluster):
    windows: dict[str, list[tuple[float, list[float]]]] = {}
    results = {}
    # sdn only: shuffle's shares drift with the queues under credit-based flow control
    # (measured: 43/43/14 at 6 s, 36/36/27 at 15 s); a comparison, not a behaviour to test
    for grouping in ("sdn",):
        name = f"lb-{grouping}"
        t = topology(name, grouping)
        cluster.submit(t)
        cluster.wait_active(name)
        activated = time.monotonic()
        physical = cluster.coordinator.get_physical(name)
        work = [w.worker_id for w in physical.of_node("work")]
        assert {w.host for w in physical.of_node("work")} == {"h1", "h2"}
        sampler = Sampler(cluster, name, work)
        sampler.run(activated + CONVERGE_S + STAY_S)
        windows[grouping] = [
            (sampler.samples[i][0] - activated, shares(r, work))
            for i in range(len(sampler.samples))
            if (r := sampler.rates(i))
        ]
        assert len(windows[grouping]) >= 5, windows[grouping]
        if grouping == "sdn":
            status, lb = cluster.rest("GET", f"/apps/{name}/lb")
            assert status == 200, lb
            results["lb"] = lb["work"]
            # the switch holds the node's select group on the sender's host, buckets to all 3
            gid = lb_group_id(physical.app_id, 1)
            assert gid in group_ids(bridge_of(cluster, "h1"))
            assert gid not in group_ids(bridge_of(cluster, "h2"))  # no sender there
        results[grouping] = drain_and_check_lossless(cluster, name)
        for host in ("h1", "h2"):
            wait(
                lambda h=host, a=physical.app_id: all(
                    (p := parse_group_id(g)) is None or p[0] != a
                    for g in group_ids(bridge_of(cluster, h))
                ),
                10,
                f"the groups of {name} to leave {host}",
            )

    lb = results["lb"]
    capacity = [c / sum(CAPACITY) for c in CAPACITY]

    def fmt(ws: list[tuple[float, list[float]]]) -> str:
        return "  ".join(f"{at:.0f}s " + "/".join(f"{x * 100:.0f}" for x in sh) for at, sh in ws)

    print(
        "\nshares of work[0]/work[1]/work[2] (%) per 5 s window"
        + f"\n  sdn: {fmt(windows['sdn'])}"
        + f"\nconfigured {json.dumps(lb['configured'])} achieved {json.dumps(lb['achieved'])} "
        f"({lb['difference_points']} points, {lb['frames_counted']} frames)"
        + f"\nemitted: sdn {results['sdn']['emitted']}"
        f", source lb stats {results['sdn']['source'].get('lb')}"
    )

    def in_band(sh: list[float], want: list[float]) -> bool:
        return all(abs(x - y) <= BAND for x, y in zip(sh, want, strict=True))

    # every window that ends after the claimed convergence time is in the band, and
    # those windows cover the STAY_S seconds after it (sampling did not stop at 30 s)
    after = [(at, sh) for at, sh in windows["sdn"] if at >= CONVERGE_S]
    assert after and after[-1][0] - after[0][0] >= STAY_S - 2 * WINDOW_S, windows["sdn"]
    assert all(in_band(sh, capacity) for _, sh in after), [
        (at, sh) for at, sh in after if not in_band(sh, capacity)
    ]
    assert lb["difference_points"] is not None and lb["difference_points"] <= 10.0, lb


def restart_controller(c: EmulatedCluster) -> None:
    c.controller.stop()
    c.controller = start_controller(
        c.workdir,
        c.coordinator_url,
        c.options.apps,
        c.ofp_port,
        c.wsapi_port,
        f"api_token = {c.token}\n{c.options.controller_config}",
    )
    wait(lambda: port_open(c.ofp_port), 30, "the restarted controller to listen")


def test_restarted_controller_reconciles_groups_without_loss(cluster):
    name = "lb-restart"
    t = topology(name, "sdn")
    cluster.submit(t)
    cluster.wait_active(name)
    physical = cluster.coordinator.get_physical(name)
    gid = lb_group_id(physical.app_id, 1)
    bridge = bridge_of(cluster, "h1")
    wait(lambda: gid in group_ids(bridge), 10, "the select group")
    wait(
        lambda: (
            cluster.rest("GET", f"/apps/{name}/lb")[1].get("work", {}).get("senders")
            == {f"{physical.of_node('source')[0].worker_id}/1": "done"}
        ),
        20,
        "the source to switch to the load-balancer address",
    )
    work = physical.of_node("work")
    macs = [wire.mac_str(wire.worker_mac(physical.app_id, w.worker_id)) for w in work]
    stale = lb_group_id(0xFFFE, 3)  # a Typhoon group of no application
    foreign = 7

    cluster.controller.stop()
    # behind the controller's back: the slow worker out of the group, a stale and a foreign group
    port_of = {w.worker_id: w.port for w in work}
    ofctl(
        "mod-group", bridge,
        f"group_id={gid},type=select,"
        f"bucket=weight:1,set_field:{macs[0]}->eth_dst,output:{port_of[work[0].worker_id]}",
    )  # fmt: skip
    ofctl("add-group", bridge, f"group_id={stale},type=select,bucket=output:1")
    ofctl("add-group", bridge, f"group_id={foreign},type=select,bucket=output:1")
    restart_controller(cluster)

    def reconciled():
        text = ofctl("dump-groups", bridge)
        line = next((s for s in text.splitlines() if f"group_id={gid}," in s), "")
        ids = group_ids(bridge)
        return all(m in line for m in macs) and stale not in ids and foreign in ids

    wait(reconciled, 30, "the groups to be reconciled")
    # the reconciled group delivers again to every worker, the one taken out of it too
    sampler = Sampler(cluster, name, [w.worker_id for w in work])
    wait(lambda: sampler.take() or sampler.samples, 10, "metrics of the workers")
    first = sampler.samples[-1][1]

    def every_worker_gets_more() -> bool:
        sampler.take()
        last = sampler.samples[-1][1]
        return all(last[w][1] > first[w][1] + 100 for w in first)

    wait(every_worker_gets_more, 30, "tuples to reach every worker after the reconcile")
    result = drain_and_check_lossless(cluster, name)
    ofctl("del-groups", bridge, f"group_id={foreign}")
    print(f"\nrestart under load: {result['emitted']} tuples, none lost")


CHAINED = """
name: {name}
spouts:
  - id: source
    operator: sequence_source
    parallelism: 2
    args: {{size: 50, count: 15000, rate: 1500}}
bolts:
  - id: work
    operator: busy
    parallelism: 2
    args: {{cost_us: 100}}
  - id: sink
    operator: collect
    parallelism: 2
streams:
  - from: source
    to: work
    grouping: sdn
  - from: work
    to: sink
    grouping: forward
"""


@pytest.mark.long
def test_a_balanced_node_that_heads_a_chain_keeps_both(cluster):
    """work[1] -> sink[1] is chained (one process on h2, function calls) while the switch's
    select group spreads source -> work: the balancer never needs the chained edge on
    the network (it acts on the sdn stream), every tuple reaches a sink once."""
    from typhoon.topology.chaining import chain_groups

    name = "lbchain"
    t = load_topology_text(CHAINED.format(name=name), name)
    cluster.submit(t)
    cluster.wait_active(name)
    physical = cluster.coordinator.get_physical(name)
    assert chain_groups(t, physical), "work and sink must be chained somewhere"
    assert cluster.wait_finished(name)
    cluster.kill(name)
    reports = read_worker_reports(cluster.report_dir(name))
    emitted = sum(r["result"]["emitted"] for r in reports if r["node"] == "source")
    work = [r for r in reports if r["node"] == "work"]
    sink = [r for r in reports if r["node"] == "sink"]
    assert emitted == 30000
    # the source sent through the switch's select group (balanced), not to fixed workers
    for source in (r for r in reports if r["node"] == "source"):
        assert sum(source["links"]["balanced_out"].values()) > 0, source["links"]
    assert sum(r["metrics"]["in"].get("1", 0) for r in work) == emitted
    assert sum(r["metrics"]["in"].get("2", 0) for r in sink) == emitted
    assert all(r["metrics"]["in"].get("1", 0) > 0 for r in work), [r["metrics"] for r in work]
    assert all(not r["metrics"]["drops"] for r in reports), [r["metrics"]["drops"] for r in reports]
