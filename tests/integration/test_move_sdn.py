"""``typhoon move``: a running worker moves to another host with its state (paper §8).

Mininet, real OVS and Ryu, 3 emulated hosts.  The non-additive pipeline of
``topologies/running_max.yaml`` (``running_count`` emits each word's running
count on every tuple, ``max_by_key`` keeps the largest per word), one worker of
each keyed node per host.  A quarter into the run, ``typhoon move`` (the CLI,
through REST, as a user types it) moves one ``count`` worker to another host:
the stable update launches its successor there, the senders switch with
handoffs, the old worker ships every key it holds (and its operator snapshot)
through the checkpoint store, the new one loads it before it runs a tuple, and
the old one is released and drained.

Checked: the sink's maxima equal those of a tcp run of the same job without
any reconfiguration (and the counts of the source's generator: 0 lost); the
move ran mid-run; right after it the new worker, on the host asked for, owns
exactly the key groups the old one owned and answers for the keys it held
(METRIC_REQ ``keys``), and the old worker is out of the physical topology; at
the end each word's state is on exactly one worker, the one the senders route
it to, the old worker's exit report holds no key and no group and names its
successor (``moved_to``), and its successor's report is written on the new
host.  Bad input on the live cluster (the worker's own host, an unknown host,
a spout) exits 2 with one line and starts nothing.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from harness import emulated_cluster, finish, wait

from typhoon.live import data_tuples
from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report
from typhoon.runtime.policies import Router
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology
from typhoon.topology.keygroups import owned_groups
from typhoon.topology.routing import routes_for

ROOT = Path(__file__).resolve().parents[2]
SENTENCES, RATE = 24_000, 2_400  # 10 s of input at the source


def job(name: str, rate: int | None):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "running_max.yaml"))
    t.name = name
    t.config.update(placement="spread")
    t.nodes["source"].args.update(count=SENTENCES, seed=5, words=5, vocabulary=300)
    if rate:
        t.nodes["source"].args["rate"] = rate
    t.nodes["count"].parallelism = 3
    t.nodes["max"].parallelism = 3
    return t


def tcp_maxima(tmp_path: Path) -> dict[str, int]:
    """The same job on tcp, unpaced and never reconfigured."""
    t = job("moveplain", None)
    cluster = TcpCluster(t, RunOptions(live=False, timeout=120), workdir=tmp_path / "tcp")
    try:
        cluster.start()
        cluster.activate()
        report = cluster.report(cluster.wait())
    finally:
        cluster.close()
    assert report["ok"], report["problems"]
    return report["results"]["max"]["max"]


def typhoon(c, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TYPHOON_CONTROLLER": c.rest_url, "TYPHOON_TOKEN": c.token}
    return subprocess.run([sys.executable, "-m", "typhoon_cli", *argv], env=env,
                          capture_output=True, text=True, timeout=180)  # fmt: skip


def live_keys(c, name: str, node: str) -> dict[int, dict]:
    """Each worker of ``node``'s answer to a METRIC_REQ with ``keys`` (REST control API)."""
    status, sent = c.rest(
        "POST",
        f"/apps/{name}/control",
        {"type": "METRIC_REQ", "body": {"keys": True}, "node": node},
    )
    assert status == 202, sent
    rid, ids = sent["request_id"], sent["workers"]

    def answered():
        got = c.rest("GET", f"/apps/{name}/responses/{rid}")[1]
        return got if len(got) == len(ids) else None

    got = wait(answered, 10, f"the keys of {node}", 0.05)
    return {int(w): m["keyed"] for w, m in got.items()}


def test_a_moved_running_count_worker_keeps_every_count_exact(tmp_path):
    want = tcp_maxima(tmp_path)
    args = job("x", None).nodes["source"].args
    ref = Counter(
        w
        for s in generate_sentences(SENTENCES, args["seed"], args["words"], args["vocabulary"])
        for w in s.split()
    )
    assert want == dict(ref)

    config = "metrics_interval = 0.25\nreconfig_step_timeout = 20\n"
    with emulated_cluster(tmp_path, "mv", config=config) as c:
        t = job("movemax", RATE)
        c.submit(t)
        c.wait_active(t.name)
        name = t.name
        before = c.coordinator.get_physical(name)
        hosts = sorted({w.host for w in before.workers})
        assert len({w.host for w in before.of_node("count")}) == 3
        old = before.of_node("count")[1]
        to = next(h for h in hosts if h != old.host)
        groups = set(owned_groups(t, before, "count", old.worker_id))
        source = before.of_node("source")[0]
        elsewhere = next(h for h in hosts if h != source.host)

        # bad input: one line, exit 2, nothing started
        for argv, words in [
            ([str(old.worker_id), old.host], f"already runs on {old.host}"),
            ([str(old.worker_id), "nohost"], "no host named 'nohost'"),
            ([str(source.worker_id), elsewhere], f"belongs to the spout '{source.node}'"),
        ]:
            r = typhoon(c, "move", name, *argv)
            assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r
        assert c.rest("GET", f"/apps/{name}/reconfig")[0] == 404

        def counted() -> int:
            ms = c.coordinator.get_metrics(name)
            return sum(
                data_tuples(ms.get(w.worker_id, {}).get("in", {})) for w in before.of_node("count")
            )

        total = sum(ref.values())
        wait(lambda: counted() >= total // 4, 60, "a quarter of the words counted", 0.05)
        held_before = live_keys(c, name, "count")[old.worker_id]["held_groups"]
        r = typhoon(c, "move", name, str(old.worker_id), to)
        assert r.returncode == 0 and "done" in r.stdout, (r.stdout, r.stderr)
        print(f"\n{r.stdout}")
        record = c.rest("GET", f"/apps/{name}/reconfig")[1]
        assert record["state"] == "done" and record["removed"] == [old.worker_id], record
        steps = [s["what"].split(":")[0] for s in record["steps"] if s["action"] == "control"]
        assert steps.count("KEYGROUPS") == 2 and "SIGNAL" not in steps, steps
        (new,) = record["added"]
        assert c.coordinator.worker_statuses(name)[source.worker_id].state != "exited"  # mid-run

        after = c.coordinator.get_physical(name)
        moved = after.by_id(new)
        assert (moved.node, moved.index, moved.host) == ("count", old.index, to)
        assert old.worker_id not in {w.worker_id for w in after.workers}
        live = live_keys(c, name, "count")
        assert old.worker_id not in live  # gone: its state can only be at its successor
        assert {int(g) for g in live[new]["owned"]} == groups
        assert set(held_before) <= set(live[new]["held_groups"]), (held_before, live[new])
        wait(
            lambda: (
                (s := c.coordinator.worker_statuses(name).get(old.worker_id))
                and s.state == "exited"
            ),
            30,
            "the moved worker's exit",
        )

        # the new host's agent runs the successor; no agent runs the old worker any more
        def supervised() -> dict[str, list[int]]:
            agents = c.coordinator.agents()
            return {h: list(a.workers.get(name, [])) for h, a in agents.items()}

        wait(
            lambda: (
                new in supervised().get(to, [])
                and all(old.worker_id not in ws for ws in supervised().values())
            ),
            30,
            "the agents' view of the move",
        )
        final = c.coordinator.get_physical(name)
        topology, reports = finish(c, name)
        report = build_report(topology, reports)

    assert report["ok"], report["problems"]
    merged = report["results"]["max"]
    assert merged["keys_on_several_workers"] == 0
    assert merged["max"] == want

    shown = {w["worker"]: w.get("moved_to") for w in report["workers"]}
    assert shown[old.worker_id] == new and shown[new] is None
    by_id = {r["worker"]: r for r in reports}
    gone, successor = by_id[old.worker_id], by_id[new]
    assert gone["moved_to"] == new and gone["result"] is None
    assert gone["metrics"]["keyed"]["groups"] == 0 and gone["metrics"]["keyed"]["keys"] == 0
    assert gone["metrics"]["drops"].get("moved_away", 0) == 0 and gone["metrics"]["moved_to"] == new
    assert successor["host"] == to and successor["moved_to"] is None
    migration = successor["metrics"]["keyed"]["migration"]
    assert migration["in"] == len(groups) and migration["keys"] > 0, migration
    print(f"moved: {migration['keys']} keys, {migration['bytes']} bytes, {migration}")

    # every word's running count on exactly one worker: the one its senders route it to
    held: dict[str, list[int]] = {}
    for r in reports:
        if r["node"] == "count" and r["result"] is not None:
            for k in r["result"]["key_list"]:
                held.setdefault(k, []).append(r["worker"])
    assert set(held) == set(ref)
    routers = [
        Router(route)
        for w in final.of_node("split")
        for route in routes_for(topology, final, w.worker_id)
        if route.stream in {s.id for s in topology.inputs_of("count")}
    ]
    for router in routers:
        wrong = {k: ws for k, ws in held.items() if ws != [router.select([k])]}
        assert not wrong, wrong
    assert any(ws == [new] for ws in held.values())
