"""Operator chaining on an emulated sdn cluster: the chained wordcount, split live (its
source -> split edges on the network, processes kept) and re-formed live mid-run,
equals the same job with ``config: {chaining: false}`` and the reference, exactly,
with nothing lost (docs/topology.md, "Chaining")."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from harness import ROOT, emulated_cluster, finish, wait

from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report
from typhoon.topology import PhysicalTopology, Topology, load_topology, load_topology_text
from typhoon.topology.chaining import chain_groups

pytestmark = [pytest.mark.integration, pytest.mark.long]


def job(name: str, chaining: bool, rate: int = 0):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount_chained.yaml"))
    t.name = name
    t.config["chaining"] = chaining
    t.nodes["source"].args.update(count=30_000, rate=rate)
    return t


def emitted(cluster, name: str) -> int:
    workers = {w.worker_id for w in cluster.coordinator.get_physical(name).of_node("source")}
    metrics = cluster.coordinator.get_metrics(name)
    return sum(sum(metrics.get(w, {}).get("out", {}).values()) for w in workers)


def wait_emitted(cluster, name: str, more: int) -> None:
    """Until ``more`` sentences more were emitted (at most all of them)."""
    total = cluster.coordinator.get_topology(name).nodes["source"].args["count"]
    target = min(emitted(cluster, name) + more, total)
    wait(lambda: emitted(cluster, name) >= target, 60, f"{target} sentences emitted", 0.1)


def reference_counts(args: dict) -> dict[str, int]:
    """Each word's count in the sentences the source generates."""
    want: Counter[str] = Counter()
    for s in generate_sentences(args["count"], args["seed"], args["words"], args["vocabulary"]):
        want.update(s.split())
    return dict(want)


def reconfigure(cluster, name: str, kind: str, body: dict) -> dict:
    status, record = cluster.rest("POST", f"/apps/{name}/{kind}", body)
    assert status == 202, record

    def finished():
        record = cluster.rest("GET", f"/apps/{name}/reconfig")[1]
        return record if record["state"] != "running" else None

    record = wait(finished, 60, f"{kind} of {name}", 0.05)
    assert record["state"] == "done", json.dumps(record, indent=1)
    return record


CONFIG = "metrics_interval = 0.25\nreconfig_step_timeout = 20\n"


@contextmanager
def running(tmp_path: Path, tag: str, t: Topology) -> Iterator[Any]:
    """Two emulated hosts running ``t`` (submitted, active)."""
    with emulated_cluster(tmp_path, tag, hosts=2, config=CONFIG) as cluster:
        cluster.submit(t)
        cluster.wait_active(t.name)
        yield cluster


def current(cluster: Any, name: str) -> tuple[Topology, PhysicalTopology]:
    """The job's topology and physical topology as the coordinator holds them now."""
    return cluster.coordinator.get_topology(name), cluster.coordinator.get_physical(name)


def assert_unchained_first(done: dict) -> None:
    """The update unchained the edges it needs first, in the same update
    (``typhoon.reconfig.chains.unchain_first``: their rules, then CHAIN to their senders)."""
    steps = [s["action"] for s in done["steps"]][:5]
    assert steps == ["keep_rules", "write", "wait_rules", "control", "keep_rules"], done


def test_chained_wordcount_split_and_reformed_live_equals_unchained_and_the_reference(
    tmp_path,
):
    with emulated_cluster(tmp_path, "ch", hosts=2, config=CONFIG) as cluster:
        reports = {}
        for name, chaining in (("chsdn", True), ("plainsdn", False)):
            cluster.submit(job(name, chaining, rate=1500))
            cluster.wait_active(name)
            if chaining:
                wait_emitted(cluster, name, 2000)
                status, reply = cluster.rest("POST", f"/apps/{name}/chain", {"node": "split"})
                assert status == 409 and "function calls already" in reply["error"], reply
                done = reconfigure(cluster, name, "unchain", {"node": "split"})
                assert [s["action"] for s in done["steps"]][-2:] == ["control", "commit"]
                physical = cluster.coordinator.get_physical(name)
                split_ids = [w.worker_id for w in physical.of_node("split")]
                assert physical.unchained == split_ids
                wait_emitted(cluster, name, 3000)  # rows cross the switch meanwhile
                reconfigure(cluster, name, "chain", {"node": "split"})
                assert cluster.coordinator.get_physical(name).unchained == []
                wait_emitted(cluster, name, 2000)  # and go by call again
            topology, workers = finish(cluster, name)
            reports[name] = build_report(topology, workers)
            if chaining:
                sources = {w["worker"]: w for w in workers if w["node"] == "source"}
    want = reference_counts(job("x", True).nodes["source"].args)
    chained, plain = reports["chsdn"], reports["plainsdn"]
    for r in (chained, plain):
        assert r["ok"], r["problems"]
        assert {k: int(v) for k, v in r["results"]["count"]["counts"].items()} == want
    assert chained["nodes"] == plain["nodes"]
    assert chained["results"] == plain["results"]
    # while unchained, each source sent its split frames through the switch, none lost
    for wid, w in sources.items():
        transport = w["links"]["transport"]
        frames_to = transport["frames_to"]
        assert any(int(frames_to.get(str(s), 0)) > 0 for s in split_ids), (wid, transport)
        assert transport["lost"] == 0, (wid, transport)
    # the processes stayed: the chained job's source and split workers shared their
    # processes throughout (one log each, no worker started anew)
    logs = {p.name for p in (cluster.workdir / "chsdn").glob("worker-*.log")}
    assert logs == {f"worker-{w}.log" for w in (1, 2, 5, 6, 7, 8)}, logs


def assert_exact(t, topology, workers) -> dict[int, dict]:
    """The report is ok, every word counted as the reference, 0 lost; the workers by ID."""
    report = build_report(topology, workers)
    assert report["ok"], report["problems"]
    want = reference_counts(t.nodes["source"].args)
    assert {k: int(v) for k, v in report["results"]["count"]["counts"].items()} == want
    for w in workers:
        assert w["links"]["transport"]["lost"] == 0, w
    return {w["worker"]: w for w in workers}


def assert_processes_ran_whole(cluster, name: str, groups: dict[int, list[int]]) -> None:
    """Every chain instance ran in one process from the start: one log, under its head's ID."""
    logs = {p.name for p in (cluster.workdir / name).glob("worker-*.log")}
    assert {f"worker-{h}.log" for h in groups} <= logs
    assert not {f"worker-{w}.log" for ws in groups.values() for w in ws[1:]} & logs


BOLT_CHAIN = """
name: chscale
spouts:
  - {id: source, operator: sentence_source, args: {count: 30000, seed: 7, words: 8,
     vocabulary: 500, rate: 1500}, parallelism: 2}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: upper, operator: identity, parallelism: 2}
  - {id: count, operator: count_by_key, args: {key: word}, parallelism: 3, stateful: true}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: upper, grouping: forward}
  - {from: upper, to: count, grouping: {type: fields, fields: [word]}}
"""


def test_scaling_a_chained_node_scales_its_chain_live_and_loses_nothing(tmp_path):
    """split -> upper is chained (two bolts): scaling upper scales the chain, a new
    instance is a new process, one removed drains whole; counts exact, report ok."""
    t = load_topology_text(BOLT_CHAIN, "chscale.yaml")
    with running(tmp_path, "cs", t) as cluster:
        name = t.name
        before = chain_groups(t, cluster.coordinator.get_physical(name))
        wait_emitted(cluster, name, 2000)
        up = reconfigure(cluster, name, "scale", {"node": "upper", "parallelism": 3})
        now_t, now_p = current(cluster, name)
        assert [now_t.nodes[n].parallelism for n in ("split", "upper")] == [3, 3], up
        after = chain_groups(now_t, now_p)
        assert {h: ws for h, ws in after.items() if h in before} == before
        wait_emitted(cluster, name, 3000)
        reconfigure(cluster, name, "scale", {"node": "split", "parallelism": 1})
        now_p = cluster.coordinator.get_physical(name)
        assert len(now_p.of_node("upper")) == len(now_p.of_node("split")) == 1
        topology, workers = finish(cluster, name)
    assert_exact(t, topology, workers)


CHAIN3 = """
name: chroute
config: {placement: spread}  # worker i of every node on host i mod 2: instances whole
spouts:
  - {id: source, operator: sentence_source, args: {count: 30000, seed: 7, words: 8,
     vocabulary: 500, rate: 1500}, parallelism: 2}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: upper, operator: identity, parallelism: 2}
  - {id: lower, operator: identity, parallelism: 2}
  - {id: count, operator: count_by_key, args: {key: word}, parallelism: 3, stateful: true}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: upper, grouping: forward}
  - {from: upper, to: lower, grouping: forward}
  - {from: lower, to: count, grouping: {type: fields, fields: [word]}}
"""


def test_route_and_insert_on_chained_edges_unchain_them_live_and_lose_nothing(tmp_path):
    """split -> upper -> lower is one process per instance: a route of split -> upper to
    shuffle unchains that edge first and keeps the processes, then an insert on upper ->
    lower (still a function call inside them) unchains that one and puts a new node
    there; counts exact, report ok, 0 lost, no chained worker started anew."""
    t = load_topology_text(CHAIN3, "chroute.yaml")
    with running(tmp_path, "cr", t) as cluster:
        name = t.name
        groups = chain_groups(t, cluster.coordinator.get_physical(name))
        assert len(groups) == 2, groups
        wait_emitted(cluster, name, 2000)
        done = reconfigure(cluster, name, "route", {"stream": "split->upper", "policy": "shuffle"})
        assert_unchained_first(done)
        now_t, now_p = current(cluster, name)
        assert chain_groups(now_t, now_p) == groups
        uppers = {ws[1] for ws in groups.values()}  # (split, upper, lower)
        assert uppers <= set(now_p.unchained), now_p.unchained
        wait_emitted(cluster, name, 3000)  # split -> upper rows cross the switch
        body = {"node": "mid", "operator": "identity", "from": "upper", "to": "lower",
                "parallelism": 2}  # fmt: skip
        reconfigure(cluster, name, "insert", body)
        now_t, now_p = current(cluster, name)
        assert chain_groups(now_t, now_p) == groups  # the processes stayed whole
        lowers = {ws[2] for ws in groups.values()}
        assert lowers <= set(now_p.unchained), now_p.unchained
        wait_emitted(cluster, name, 2000)
        topology, workers = finish(cluster, name)
    assert_exact(t, topology, workers)
    assert sum(sum(w["metrics"]["in"].values()) for w in workers if w["node"] == "mid") > 0
    assert_processes_ran_whole(cluster, name, groups)


def test_a_worker_moves_out_of_its_chain_process_live_and_loses_nothing(tmp_path):
    """upper 0 runs between split 0 and lower 0 in one process: moving it to the other
    host unchains both its edges first, then moves it with its state; the process goes on
    with split 0 and lower 0, the moved worker runs alone; counts exact, 0 lost."""
    t = load_topology_text(CHAIN3.replace("chroute", "chmove"), "chmove.yaml")
    with running(tmp_path, "cm", t) as cluster:
        name = t.name
        physical = cluster.coordinator.get_physical(name)
        groups = chain_groups(t, physical)
        assert len(groups) == 2, groups
        head, (split, upper, lower) = next(iter(groups.items()))
        here = physical.by_id(upper).host
        there = next(w.host for w in physical.workers if w.host != here)
        wait_emitted(cluster, name, 2000)
        done = reconfigure(cluster, name, "move", {"worker": upper, "host": there})
        assert_unchained_first(done)
        now_t, now_p = current(cluster, name)
        (moved,) = done["added"]
        assert now_p.by_id(moved).host == there and upper not in {
            w.worker_id for w in now_p.workers
        }
        after = chain_groups(now_t, now_p)
        assert after[head] == [split, lower], after
        assert moved not in {w for ws in after.values() for w in ws}
        wait_emitted(cluster, name, 3000)
        topology, workers = finish(cluster, name)
    by_id = assert_exact(t, topology, workers)
    assert sum(by_id[moved]["metrics"]["in"].values()) > 0  # the moved worker ran on
    assert sum(by_id[upper]["metrics"]["in"].values()) > 0  # and the old one before it
    # split 0 and lower 0 stayed in the process they started in (no log of their own)
    logs = {p.name for p in (cluster.workdir / name).glob("worker-*.log")}
    assert f"worker-{head}.log" in logs and f"worker-{moved}.log" in logs
    assert not {f"worker-{w}.log" for w in (upper, lower)} & logs


def test_remove_and_swap_of_chained_nodes_run_live_and_lose_nothing(tmp_path):
    """split -> upper -> lower is one process per instance: removing upper unchains its
    edges, drains it and splices split -> lower inside the process (on the network);
    swapping lower then runs in place (the same workers, in their processes); counts
    exact, report ok, 0 lost, the processes' heads ran throughout."""
    t = load_topology_text(CHAIN3.replace("chroute", "chswap"), "chswap.yaml")
    with running(tmp_path, "cw", t) as cluster:
        name = t.name
        groups = chain_groups(t, cluster.coordinator.get_physical(name))
        assert len(groups) == 2, groups
        wait_emitted(cluster, name, 2000)
        done = reconfigure(cluster, name, "remove", {"node": "upper"})
        assert_unchained_first(done)
        now_t, now_p = current(cluster, name)
        assert chain_groups(now_t, now_p) == {h: [ws[0], ws[2]] for h, ws in groups.items()}
        wait_emitted(cluster, name, 3000)
        body = {"node": "lower", "operator": "busy", "args": {"cost_us": 1}}
        done = reconfigure(cluster, name, "swap", body)
        now_t, now_p = current(cluster, name)
        assert chain_groups(now_t, now_p) == {h: [ws[0], ws[2]] for h, ws in groups.items()}
        assert now_t.nodes["lower"].operator == "busy" and done["added"] == []
        wait_emitted(cluster, name, 2000)
        topology, workers = finish(cluster, name)
    by_id = assert_exact(t, topology, workers)
    for ws in groups.values():  # the new operator took input after the old one's
        (old,) = by_id[ws[2]]["swapped"]
        assert 0 < old["tuples_in"] < sum(by_id[ws[2]]["metrics"]["in"].values()), old
    assert_processes_ran_whole(cluster, name, groups)


IN_PLACE = """
name: chinplace
config: {placement: spread}  # worker i of every node on host i mod 2: instances whole
spouts:
  - {id: source, operator: sentence_source, args: {count: 30000, seed: 7, words: 8,
     vocabulary: 500, rate: 1500}, parallelism: 2}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: upper, operator: identity, parallelism: 2}
  - {id: count, operator: count_by_key, args: {key: word}, parallelism: 2, stateful: true}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: upper, grouping: forward}
  - {from: upper, to: count, grouping: forward}
"""


def test_a_swap_of_chained_nodes_runs_in_place_in_their_processes(tmp_path):
    """split -> upper -> count is one process per instance: swapping upper (the middle)
    and then count (the tail, a stateful count whose old instance's counts the report
    merges like a drained worker's) runs in place: no new worker, the same process IDs
    before and after, no edge of a process on the network; counts exact, 0 lost."""
    t = load_topology_text(IN_PLACE, "chinplace.yaml")
    with running(tmp_path, "ci", t) as cluster:
        name = t.name
        physical = cluster.coordinator.get_physical(name)
        groups = chain_groups(t, physical)
        assert len(groups) == 2 and all(len(ws) == 3 for ws in groups.values()), groups
        members = [w for ws in groups.values() for w in ws]

        def pids() -> dict[int, int | None]:
            statuses = cluster.coordinator.worker_statuses(name)
            return {w: statuses[w].pid for w in members}

        before = pids()
        assert all(before[w] == before[ws[0]] for ws in groups.values() for w in ws), before
        wait_emitted(cluster, name, 2000)
        for node, operator, args in (
            ("upper", "busy", {"cost_us": 1}),
            ("count", "count_by_key", {}),
        ):
            body = {"node": node, "operator": operator, "args": args}
            done = reconfigure(cluster, name, "swap", body)
            steps = [(s["action"], s["workers"]) for s in done["steps"]]
            ids = sorted(w.worker_id for w in physical.of_node(node))
            assert steps == [("write", []), ("wait_rules", []), ("control", ids),
                             ("commit", [])], done  # fmt: skip
            assert done["added"] == done["removed"] == []
            now_t, now_p = current(cluster, name)
            assert now_t.nodes[node].operator == operator and now_t.nodes[node].args == args
            assert now_p.workers == physical.workers and now_p.unchained == []
            assert chain_groups(now_t, now_p) == groups
            assert pids() == before  # the same processes
            wait_emitted(cluster, name, 2500)
        topology, workers = finish(cluster, name)
    by_id = assert_exact(t, topology, workers)
    assert_processes_ran_whole(cluster, name, groups)
    for ws in groups.values():
        split, upper, count = (by_id[w] for w in ws)
        assert {by_id[w]["pid"] for w in ws} == {before[ws[0]]}  # one process throughout
        for w, was in ((upper, "identity"), (count, "count_by_key")):
            (old,) = w["swapped"]  # the old instance ended in the process, then the new ran
            assert old["operator"] == was, old
            assert 0 < old["tuples_in"] < sum(w["metrics"]["in"].values()), old
        assert sum(old["result"]["counts"].values()) == old["tuples_in"]  # count's old part
        # the chain's edges stayed function calls: not one frame between its members
        for a, b in ((split, upper), (upper, count)):
            frames = a["links"]["transport"]["frames_to"]
            assert int(frames.get(str(b["worker"]), 0)) == 0, (a["worker"], frames)
