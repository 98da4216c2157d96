"""A locality move carries keyed state with each key: Mininet, real OVS and Ryu, 3 hosts.

The non-additive pipeline of ``topologies/running_max.yaml`` (``running_count``
emits each word's running count on every tuple, ``max_by_key`` keeps the
largest per word) with ``config: {locality: ...}`` on the counting node and
one worker of each node per host.  Mid-run, the locality router
(``apps/locality_router.py``, asked through REST as ``typhoon locality``
does) switches ``split -> count`` and ``count -> max`` from hash to
``direct`` tables.  A table names keys; keyed state is owned per key group
with the table's keys pinned on top (docs/keyed_state.md), so each stable
update moves every named key whose worker changes, with its state, through
KEYGROUPS prepare / ROUTING with handoffs / KEYGROUPS finish; no SIGNAL flush.

Checked: the sink's maxima equal those of a tcp run of the same job without
any reconfiguration (and the counts of the source's generator), and after
the moves each word's state is on exactly one worker of each keyed node: the
one the senders' routing tables send it to: live right after the move (each
worker's answer to a METRIC_REQ with ``keys``), again after a scale-up of the
counting node that follows it (its key groups move, the keys the table names
stay where it sends them), and at the end (the keys in each worker's exit
report).
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

from harness import emulated_cluster, finish, wait

from typhoon.live import data_tuples
from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report
from typhoon.runtime.policies import Router
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology
from typhoon.topology.routing import routes_for

ROOT = Path(__file__).resolve().parents[2]
SENTENCES, RATE = 24_000, 2_400  # 10 s of input at the source


def job(name: str, rate: int | None):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "running_max.yaml"))
    t.name = name
    t.config.update(placement="spread", locality={"pairs": 1000, "sample": 5})
    t.nodes["source"].args.update(count=SENTENCES, seed=3, words=5, vocabulary=300)
    if rate:
        t.nodes["source"].args["rate"] = rate
    t.nodes["count"].parallelism = 3
    t.nodes["max"].parallelism = 3
    return t


def tcp_maxima(tmp_path: Path) -> dict[str, int]:
    """The same job on tcp, unpaced and never reconfigured."""
    t = job("locplain", None)
    cluster = TcpCluster(t, RunOptions(live=False, timeout=120), workdir=tmp_path / "tcp")
    try:
        cluster.start()
        cluster.activate()
        report = cluster.report(cluster.wait())
    finally:
        cluster.close()
    assert report["ok"], report["problems"]
    return report["results"]["max"]["max"]


def holders(reports: list[dict], node: str, keys_of) -> dict[str, list[int]]:
    """Key -> the workers of ``node`` whose keyed state holds it at their end."""
    out: dict[str, list[int]] = {}
    for r in reports:
        if r["node"] == node:
            for k in keys_of(r["result"]):
                out.setdefault(k, []).append(r["worker"])
    return out


def placement(c, name: str, node: str) -> dict[int, dict]:
    """Each worker of ``node``'s answer to a METRIC_REQ with ``keys`` (sent through the
    REST control API): the groups it owns, keys held per group, direct-table keys held."""
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

    got = wait(answered, 10, f"the placement of {node}", 0.05)
    return {int(w): m["keyed"] for w, m in got.items()}


def check_live_placement(c, name: str, node: str) -> int:
    """Every key group owned by one worker, and held only there; every key a direct table
    names held by at most one worker, the one every sender routes it to.  Returns how
    many table-named keys are held."""
    topo, phys = c.coordinator.get_topology(name), c.coordinator.get_physical(name)
    where = placement(c, name, node)
    owner: dict[int, int] = {}
    for w, k in where.items():
        for g in map(int, k["owned"]):
            assert g not in owner, f"{node}: group {g} owned by {owner[g]} and {w}"
            owner[g] = w
        assert set(k["held_groups"]) <= set(k["owned"]), (node, w, k)
    assert sorted(owner) == list(range(len(owner)))
    senders = [
        Router(r)
        for w in phys.active_of_node(topo.inputs_of(node)[0].src)
        for r in routes_for(topo, phys, w.worker_id)
        if r.stream in {s.id for s in topo.inputs_of(node)}
    ]
    pinned: dict[str, int] = {}
    for w, k in where.items():
        for key, here in k["held_pinned"].items():
            assert here == 1, f"{node}: worker {w} holds {key}, which its table sends elsewhere"
            assert key not in pinned, f"{node}: {key} on workers {pinned[key]} and {w}"
            pinned[key] = w
            assert {r.select([key]) for r in senders} == {w}, (node, key)
    return len(pinned)


def test_locality_move_carries_running_counts_exactly(tmp_path):
    want = tcp_maxima(tmp_path)
    args = job("x", None).nodes["source"].args
    ref = Counter(
        w
        for s in generate_sentences(SENTENCES, args["seed"], args["words"], args["vocabulary"])
        for w in s.split()
    )
    assert want == dict(ref)

    config = "metrics_interval = 0.25\nreconfig_step_timeout = 20\n[locality]\nmin_pairs = 500\n"
    with emulated_cluster(tmp_path, "q", apps=["apps/locality_router.py"], config=config) as c:
        t = job("locmax", RATE)
        c.submit(t)
        c.wait_active(t.name)
        physical = c.coordinator.get_physical(t.name)
        assert len({w.host for w in physical.of_node("count")}) == 3

        def counted() -> int:
            ms = c.coordinator.get_metrics(t.name)
            return sum(
                data_tuples(ms.get(w.worker_id, {}).get("in", {}))
                for w in physical.of_node("count")
            )

        total = sum(ref.values())
        wait(lambda: counted() >= total // 4, 60, "a quarter of the words counted", 0.05)
        status, run = c.rest("POST", f"/apps/{t.name}/locality", {})
        assert status == 202, run

        def done():
            shown = c.rest("GET", f"/apps/{t.name}/locality")[1]
            return shown if shown.get("phase") not in ("collecting", "routing") else None

        run = wait(done, 60, "the locality run", 0.05)
        assert run["phase"] in ("measuring", "done"), run
        assert len(run["reconfigurations"]) == 2, run
        last = c.rest("GET", f"/apps/{t.name}/reconfig")[1]
        assert last["state"] == "done", last
        moves = [s for s in last["steps"] if s["what"].startswith("KEYGROUPS")]
        assert [s["state"] for s in moves] == ["done", "done"], last["steps"]
        assert not any(s["what"].startswith("SIGNAL") for s in last["steps"])
        source = physical.of_node("source")[0].worker_id
        assert c.coordinator.worker_statuses(t.name)[source].state != "exited"  # mid-run
        # live, still mid-run: where each node's keyed state is (METRIC_REQ keys)
        pinned = {n: check_live_placement(c, t.name, n) for n in ("count", "max")}
        assert pinned["count"] > 0 and pinned["max"] > 0, pinned
        print(f"\nlocality run: {run['plan']}; {run['seconds']} s; pinned keys held: {pinned}")

        # then a scale-up moves key groups: the keys the table names stay where it sends them
        wait(lambda: counted() >= total // 2, 60, "half of the words counted", 0.05)
        status, rec = c.rest("POST", f"/apps/{t.name}/scale", {"node": "count", "parallelism": 4})
        assert status == 202, rec

        def scaled():
            record = c.rest("GET", f"/apps/{t.name}/reconfig")[1]
            return record if record["state"] != "running" else None

        rec = wait(scaled, 60, "the scale of count", 0.05)
        assert rec["state"] == "done", rec
        assert c.coordinator.worker_statuses(t.name)[source].state != "exited"  # mid-run
        assert check_live_placement(c, t.name, "count") == pinned["count"]
        final = c.coordinator.get_physical(t.name)
        topology, reports = finish(c, t.name)
        report = build_report(topology, reports)

    assert report["ok"], report["problems"]
    assert [s.grouping.type for s in topology.streams] == ["shuffle", "direct", "direct"]
    merged = report["results"]["max"]
    assert merged["keys_on_several_workers"] == 0
    assert merged["max"] == want

    # keys moved, and each key's state is on one worker: the one its senders route it to
    moved = {
        node: sum(
            m.get("keys_in", 0)
            for r in reports
            if r["node"] == node
            for m in r["metrics"].get("keyed", {}).get("migrations", {}).values()
        )
        for node in ("count", "max")
    }
    print(f"keys moved in per node: {moved}")
    assert moved["count"] > 0 and moved["max"] > 0, moved
    for node, sender, keys_of in (
        ("count", "split", lambda res: res["key_list"]),
        ("max", "count", lambda res: list(res["max"])),
    ):
        held = holders(reports, node, keys_of)
        assert set(held) == set(ref), node
        routers = [
            Router(route)
            for w in final.of_node(sender)
            for route in routes_for(topology, final, w.worker_id)
            if route.stream in {s.id for s in topology.inputs_of(node)}
        ]
        for router in routers:
            wrong = {k: ws for k, ws in held.items() if ws != [router.select([k])]}
            assert not wrong, (node, wrong)
