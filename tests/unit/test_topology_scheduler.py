"""Scheduler: the placement properties promised in ``scheduler.py``'s docstring."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from typhoon.topology import (
    Grouping,
    Node,
    PhysicalTopology,
    Stream,
    Topology,
    app_id_for,
    load_topology,
    reschedule,
    schedule,
    topological_order,
)

GOOD = Path(__file__).parent / "fixtures" / "topologies" / "good"


def chain(*parallelism: int) -> Topology:
    """n0 -> n1 -> ... with the given parallelism per node."""
    nodes = {
        f"n{i}": Node(f"n{i}", "spout" if i == 0 else "bolt", "identity", parallelism=p)
        for i, p in enumerate(parallelism)
    }
    streams = [
        Stream(i, f"n{i - 1}", f"n{i}", Grouping("shuffle")) for i in range(1, len(parallelism))
    ]
    return Topology("chain", nodes, streams)


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    """Random DAGs: edges only go from earlier to later nodes, file order shuffled."""
    n = draw(st.integers(1, 8))
    par = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    edges = [(i, j) for j in range(1, n) for i in draw(st.sets(st.integers(0, j - 1), min_size=1))]
    order = draw(st.permutations(range(n)))
    nodes = {
        f"n{i}": Node(
            f"n{i}", "bolt" if any(d == i for _, d in edges) else "spout", "x", parallelism=par[i]
        )
        for i in order
    }
    streams = [
        Stream(k + 1, f"n{i}", f"n{j}", Grouping("shuffle")) for k, (i, j) in enumerate(edges)
    ]
    return Topology("random", nodes, streams)


hosts_lists = st.integers(1, 5).map(lambda k: [f"h{i}" for i in range(k)])


def assert_well_formed(topo: Topology, phys: PhysicalTopology) -> None:
    """Unique IDs, one worker per (node, index), unique ports per host."""
    ids = [w.worker_id for w in phys.workers]
    assert len(set(ids)) == len(ids) and all(1 <= i <= 0xFFFE for i in ids)
    slots = sorted((w.node, w.index) for w in phys.workers)
    assert slots == sorted((n.name, i) for n in topo.nodes.values() for i in range(n.parallelism))
    ports = [(w.host, w.port) for w in phys.workers]
    assert len(set(ports)) == len(ports)


@settings(max_examples=200, deadline=None)
@given(topologies(), hosts_lists, st.integers(1, 100))
def test_schedule_properties(topo: Topology, hosts: list[str], first_port: int) -> None:
    phys = schedule(topo, hosts, 7, first_port)
    assert_well_formed(topo, phys)
    workers = sorted(phys.workers, key=lambda w: w.worker_id)
    total = len(workers)
    assert [w.worker_id for w in workers] == list(range(1, total + 1))
    # IDs follow the topological order: every sender has a smaller ID than its receivers
    for s in topo.streams:
        assert max(w.worker_id for w in phys.of_node(s.src)) < min(
            w.worker_id for w in phys.of_node(s.dst)
        )
    # balance: at most ceil(N/H) per host, hosts filled in list order
    per_host = Counter(w.host for w in workers)
    capacity = math.ceil(total / len(hosts))
    counts = [per_host[h] for h in hosts]
    assert max(counts) <= capacity
    assert (
        counts == sorted(counts, reverse=True)
        and counts.count(0) + sum(c == capacity for c in counts) >= len(hosts) - 1
    )
    # locality: each host holds one contiguous run of IDs, so at most H-1 host changes
    sequence = [w.host for w in workers]
    runs = [h for i, h in enumerate(sequence) if i == 0 or h != sequence[i - 1]]
    assert len(runs) == len(set(runs)) <= len(hosts)
    # ports: first_port, first_port + 1, ... per host, in ID order
    for h in hosts:
        assert [w.port for w in workers if w.host == h] == list(
            range(first_port, first_port + per_host[h])
        )
    # determinism: same input, same output
    assert schedule(topo, hosts, 7, first_port) == phys


def test_three_node_chain() -> None:
    """Co-location wins until it would break the balance cap of ceil(N/H)."""

    def hosts_of(n_hosts: int) -> list[str]:
        phys = schedule(chain(1, 1, 1), [f"h{i}" for i in range(n_hosts)], 1)
        return [phys.of_node(f"n{i}")[0].host for i in range(3)]

    assert hosts_of(1) == ["h0", "h0", "h0"]
    assert hosts_of(2) == ["h0", "h0", "h1"]
    assert hosts_of(3) == ["h0", "h1", "h2"]  # cap 1: one worker per host
    assert hosts_of(4) == ["h0", "h1", "h2"]


def test_wordcount_placement() -> None:
    topo = load_topology(GOOD / "wordcount.yaml")
    phys = schedule(topo, ["a", "b"], app_id_for(topo.name))
    got = [(w.worker_id, w.node, w.index, w.host, w.port) for w in phys.workers]
    assert got == [
        (1, "source", 0, "a", 10),
        (2, "split", 0, "a", 11),
        (3, "split", 1, "a", 12),
        (4, "count", 0, "a", 13),
        (5, "count", 1, "b", 10),
        (6, "count", 2, "b", 11),
        (7, "count", 3, "b", 12),
    ]
    assert (phys.name, phys.version) == ("wordcount", 1)


def test_topological_order_breaks_ties_by_file_order() -> None:
    topo = load_topology(GOOD / "all_groupings.yaml")
    assert topological_order(topo) == [
        "sentences",
        "words",
        "by_word",
        "tap",
        "total",
        "pinned",
        "near",
        "balanced",
        "paired",
    ]


def test_schedule_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one host"):
        schedule(chain(1), [], 1)
    with pytest.raises(ValueError, match="twice"):
        schedule(chain(1), ["a", "a"], 1)
    with pytest.raises(ValueError, match="app_id"):
        schedule(chain(1), ["a"], 0)


def test_app_id_is_stable_and_in_range() -> None:
    assert app_id_for("wordcount") == app_id_for("wordcount") == 55401
    ids = {app_id_for(f"app-{i}") for i in range(5000)}
    assert all(1 <= i <= 0xFFFE for i in ids) and len(ids) > 4750


def with_parallelism(topo: Topology, **par: int) -> Topology:
    nodes = {
        n: dataclasses.replace(node, parallelism=par.get(n, node.parallelism))
        for n, node in topo.nodes.items()
    }
    return Topology(topo.name, nodes, topo.streams, topo.config)


def test_reschedule_same_topology_keeps_everything() -> None:
    topo = load_topology(GOOD / "wordcount.yaml")
    old = schedule(topo, ["a", "b"], 9)
    new = reschedule(topo, old, ["a", "b"])
    assert new.workers == old.workers and new.version == 2 and new.app_id == 9


def test_reschedule_scale_out_keeps_workers_and_fills_emptiest_host() -> None:
    topo = load_topology(GOOD / "wordcount.yaml")
    old = schedule(topo, ["a", "b"], 9)  # a: 4 workers, b: 3 workers
    new = reschedule(with_parallelism(topo, count=6), old, ["a", "b"])
    assert set(old.workers) <= set(new.workers)
    added = [(w.worker_id, w.node, w.index, w.host, w.port) for w in new.workers[7:]]
    # 8 -> b (3 < 4), then a and b have 4 each: tie goes to a host running 'count' (a, in order)
    assert added == [(8, "count", 4, "b", 13), (9, "count", 5, "a", 14)]
    assert_well_formed(with_parallelism(topo, count=6), new)


def test_reschedule_prefers_a_host_already_running_the_node() -> None:
    topo = chain(1, 1)
    old = PhysicalTopology(
        "chain",
        3,
        [
            schedule(topo, ["x"], 3).workers[0],  # n0 on x
            dataclasses.replace(schedule(topo, ["x"], 3).workers[1], host="y", port=10),  # n1 on y
        ],
    )
    new = reschedule(with_parallelism(topo, n1=2), old, ["x", "y"])
    assert new.of_node("n1")[1].host == "y"


def test_reschedule_scale_in_does_not_reuse_ports_of_draining_workers() -> None:
    topo = load_topology(GOOD / "wordcount.yaml")
    old = schedule(topo, ["a", "b"], 9)
    smaller = with_parallelism(topo, count=2, split=1)
    new = reschedule(smaller, old, ["a", "b"])
    assert [w.worker_id for w in new.workers] == [1, 2, 4, 5]
    again = reschedule(with_parallelism(smaller, count=3), new, ["a", "b"])
    added = again.by_id(6)
    assert (added.node, added.index) == ("count", 2)
    # b has count[1] on port 10 (kept); ports 11 and 12 were freed one version ago
    assert (added.host, added.port) == ("b", 11)


def test_reschedule_replaces_workers_of_a_lost_host() -> None:
    topo = load_topology(GOOD / "wordcount.yaml")
    old = schedule(topo, ["a", "b", "c"], 9)
    lost = {w.worker_id for w in old.workers if w.host == "b"}
    new = reschedule(topo, old, ["a", "c"])
    assert_well_formed(topo, new)
    assert {w.worker_id for w in new.workers} & lost == set()
    survivors = [w for w in old.workers if w.host != "b"]
    assert [w for w in new.workers if w.worker_id <= 7] == survivors
    replacements = [(w.worker_id, w.node, w.index) for w in new.workers if w.worker_id > 7]
    assert replacements == [
        (8 + i, w.node, w.index) for i, w in enumerate(w for w in old.workers if w.host == "b")
    ]


def test_reschedule_drops_removed_nodes() -> None:
    topo = chain(2, 2, 2)
    old = schedule(topo, ["a"], 1)
    shorter = Topology("chain", {k: topo.nodes[k] for k in ("n0", "n1")}, topo.streams[:1])
    new = reschedule(shorter, old, ["a"])
    assert {w.node for w in new.workers} == {"n0", "n1"} and len(new.workers) == 4


def test_reschedule_rejects_another_application() -> None:
    old = schedule(chain(1), ["a"], 1)
    other = Topology("other", chain(1).nodes, [])
    with pytest.raises(ValueError, match="cannot reschedule"):
        reschedule(other, old, ["a"])


@settings(max_examples=150, deadline=None)
@given(topologies(), hosts_lists, hosts_lists, st.data())
def test_reschedule_properties(
    topo: Topology, hosts: list[str], new_hosts: list[str], data: st.DataObject
) -> None:
    old = schedule(topo, hosts, 5)
    par = {n: data.draw(st.integers(1, 6), label=n) for n in topo.nodes}
    changed = with_parallelism(topo, **par)
    new = reschedule(changed, old, new_hosts)
    assert_well_formed(changed, new)
    assert new.version == old.version + 1
    old_by_id = {w.worker_id: w for w in old.workers}
    for w in new.workers:
        if w.worker_id in old_by_id:
            assert old_by_id[w.worker_id] == w  # kept workers never move
        else:
            assert w.worker_id > max(old_by_id)
            assert (w.host, w.port) not in {(o.host, o.port) for o in old.workers}
    for o in old.workers:
        if o.index < par[o.node] and o.host in new_hosts:
            assert o in new.workers
    assert reschedule(changed, old, new_hosts) == new


def test_spread_placement_puts_worker_i_of_every_node_on_host_i() -> None:
    topo = chain(1, 3, 3)
    topo.config["placement"] = "spread"
    phys = schedule(topo, ["h0", "h1", "h2"], 1, first_port=10)
    assert [(w.worker_id, w.node, w.index, w.host, w.port) for w in phys.workers] == [
        (1, "n0", 0, "h0", 10),
        (2, "n1", 0, "h0", 11),
        (3, "n1", 1, "h1", 10),
        (4, "n1", 2, "h2", 10),
        (5, "n2", 0, "h0", 12),
        (6, "n2", 1, "h1", 11),
        (7, "n2", 2, "h2", 11),
    ]
