"""Random valid topologies and the exact result each must produce.

For differential testing (``mininet_env.differential``): a seed gives a DAG of
2-7 nodes built from the keyed operators (``typhoon.operators.keyed``), with
fan-in, fan-out, sources and bolts with several output streams, every
grouping, parallelism 1-6, a placement (1-4 hosts) and a fabric shape.
Because every operator is a pure function of its tuple, :func:`expected_results`
computes what each sink must report by walking the logical topology, tuple by
tuple, with the multiplicity an ``all`` grouping gives.  A run over any
transport must then match it exactly, and the sdn and tcp runs each other.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import yaml

from typhoon.operators.keyed import (
    MASK64,
    KeyedSource,
    SplitStreams,
    keyed_tuple,
    pick_stream,
    split_step,
    tuple_digest,
)
from typhoon.topology.loader import load_topology_text
from typhoon.topology.model import GROUPINGS, Topology

SHAPES = ("mesh", "line", "star")  # mininet_env.fabric.SHAPES; the core does not import it
STREAM_NAMES = ("a", "b", "c")
MAX_WORKERS = 14  # processes per topology: two cores run them all at once
SINKS = ("digest", "count_by_key")


@dataclass
class Case:
    """One generated topology with where to run it and what it must produce."""

    seed: int
    hosts: int
    fabric: str
    text: str  # the topology file (YAML)
    expected: dict[str, Any] = field(default_factory=dict)  # sink node -> result

    def topology(self, name: str | None = None) -> Topology:
        """A fresh model of the file (each run mutates its own copy's name and config)."""
        topo = load_topology_text(self.text, f"seed-{self.seed}.yaml")
        if name is not None:
            topo.name = name
        return topo

    @property
    def groupings(self) -> set[str]:
        return {s.grouping.type for s in self.topology().streams}

    def describe(self) -> str:
        topo = self.topology()
        nodes = ", ".join(f"{n.name}:{n.operator}x{n.parallelism}" for n in topo.nodes.values())
        edges = ", ".join(f"{s.src}.{s.name}->{s.dst}:{s.grouping.type}" for s in topo.streams)
        return (
            f"seed {self.seed}: {self.hosts} host(s), {self.fabric}, "
            f"batch {topo.config['batch_size']}; nodes {nodes}; streams {edges}"
        )


def _edges(rng: random.Random, n: int, n_sources: int) -> list[tuple[int, int]]:
    """A DAG on nodes 0..n-1 (sources first) in which every bolt has an input and
    every source an output; extra edges give fan-in and fan-out."""
    edges: set[tuple[int, int]] = set()
    for b in range(n_sources, n):
        k = rng.choice((1, 1, 2, 2, 3))
        for a in rng.sample(range(b), min(k, b)):
            edges.add((a, b))
    for a in range(n_sources):
        if not any(e[0] == a for e in edges):
            edges.add((a, rng.randrange(n_sources, n)))
    for _ in range(rng.randint(0, 2)):  # more fan-out
        a = rng.randrange(n - 1)
        b = rng.randrange(max(a + 1, n_sources), n)
        edges.add((a, b))
    return sorted(edges)


# drawn by the seed's own generator; ``forward`` is drawn apart (see generate), so adding
# it left every other seed's topology as it was
DRAWN = tuple(g for g in GROUPINGS if g != "forward")
FORWARD_SALT = 0x666F7277  # the forward draws' generator: Random(seed ^ FORWARD_SALT)


def _grouping(rng: random.Random, dst_parallelism: int, keys: int) -> dict[str, Any] | str:
    kind = rng.choice(DRAWN)
    if kind == "fields":
        return {"type": "fields", "fields": ["key"]}
    if kind == "direct":
        chosen = rng.sample(range(keys), min(keys, rng.randint(1, 4)))
        table = {f"k{k}": rng.randrange(dst_parallelism) for k in chosen}
        return {"type": "direct", "fields": ["key"], "table": table}
    return kind


def generate(seed: int, budget: int = 60_000) -> Case:
    """The topology of ``seed``; ``budget`` bounds the tuple arrivals over all nodes."""
    rng = random.Random(seed)
    n = rng.randint(2, 7)
    n_sources = rng.randint(1, min(3, n - 1))
    names = [f"s{i + 1}" for i in range(n_sources)] + [f"b{i + 1}" for i in range(n - n_sources)]
    edges = _edges(rng, n, n_sources)
    outs = {i: [b for a, b in edges if a == i] for i in range(n)}
    parallelism = [rng.randint(1, 6) for _ in range(n)]
    while sum(parallelism) > MAX_WORKERS:
        i = rng.choice([i for i, p in enumerate(parallelism) if p > 1])
        parallelism[i] -= 1
    keys = rng.choice((4, 16, 64))
    batch = rng.choice((1, 10, 50, 100, 200))
    size = rng.choice((0, 16, 100, 400))

    nodes: list[dict[str, Any]] = []
    stream_of: dict[tuple[int, int], str] = {}
    for i, name in enumerate(names):
        node: dict[str, Any] = {"id": name, "parallelism": parallelism[i]}
        if i < n_sources or outs[i]:
            splits = i < n_sources or rng.random() < 0.5
            used = ["default"]
            if splits and len(outs[i]) > 1 and rng.random() < 0.7:
                used = list(STREAM_NAMES[: rng.randint(2, min(3, len(outs[i])))])
            order = list(outs[i])
            rng.shuffle(order)
            for k, b in enumerate(order):  # every stream name has a consumer
                stream_of[(i, b)] = used[k] if k < len(used) else rng.choice(used)
            args: dict[str, Any] = {}
            if used != ["default"]:
                args["streams"] = used
            if i < n_sources:
                node["operator"] = "keyed_source"
                node["args"] = {"count": 1, "keys": keys, "seed": seed * 10 + i, "size": size}
                node["args"].update(args)
            elif splits:
                node["operator"] = "split_streams"
                node["args"] = {"salt": rng.randrange(1 << 16), "drop": rng.choice((0, 0, 3))}
                node["args"].update(args)
            else:
                node["operator"] = "identity"
        else:
            node["operator"] = rng.choice(SINKS)
            if node["operator"] == "count_by_key":
                node["args"] = {"key": "key"}
        nodes.append(node)

    streams = []
    fwd = random.Random(seed ^ FORWARD_SALT)
    for a, b in edges:
        s: dict[str, Any] = {
            "from": names[a],
            "to": names[b],
            "grouping": _grouping(rng, parallelism[b], keys),
        }
        # a shuffle between equal parallelisms may pair worker i with worker i instead
        # (chained into one process when it is the only edge out of a and into b)
        if s["grouping"] == "shuffle" and parallelism[a] == parallelism[b] and fwd.random() < 0.5:
            s["grouping"] = "forward"
        if stream_of[(a, b)] != "default":
            s["stream"] = stream_of[(a, b)]
        streams.append(s)
    doc = {
        "name": f"diff-{seed}",
        "config": {"batch_size": batch},
        "spouts": nodes[:n_sources],
        "bolts": nodes[n_sources:],
        "streams": streams,
    }
    hosts = rng.randint(1, 4)
    fabric = rng.choice(SHAPES)

    # as many tuples per source worker as the budget allows (batch 1 is slow: less);
    # arrivals grow linearly with the count, so a small probe run sizes it
    limit = budget // 5 if batch == 1 else budget
    probe = 100
    for node in doc["spouts"]:
        node["args"]["count"] = probe
    arrivals = [0]
    expected_results(Case(seed, hosts, fabric, yaml.safe_dump(doc)).topology(), arrivals)
    count = rng.choice((2000, 5000, 10000))
    count = max(50, min(count, limit * probe // max(1, arrivals[0])))
    for node in doc["spouts"]:
        node["args"]["count"] = count
    case = Case(seed, hosts, fabric, yaml.safe_dump(doc, sort_keys=False))
    case.expected = expected_results(case.topology())
    return case


def expected_results(topo: Topology, arrivals: list[int] | None = None) -> dict[str, Any]:
    """What each sink of a keyed topology must report, computed without running it.

    ``digest`` sinks: tuples, sum and xor of :func:`tuple_digest`; ``count_by_key``
    sinks: counts per key.  A tuple on an ``all`` stream reaches every worker of
    its destination, so it counts that many times there and downstream.
    ``arrivals`` (a one-element list) receives the number of tuple arrivals.
    """
    results: dict[str, Any] = {}
    for name, node in topo.nodes.items():
        if node.operator == "digest":
            results[name] = {"tuples": 0, "sum": 0, "xor": 0}
        elif node.operator == "count_by_key":
            results[name] = {"counts": {}}
        elif node.operator not in ("keyed_source", "split_streams", "identity"):
            raise ValueError(f"node {name}: operator {node.operator} is not a keyed operator")
    # the operators' own argument handling and defaults
    splitters = {
        name: SplitStreams(**node.args)
        for name, node in topo.nodes.items()
        if node.operator == "split_streams"
    }
    consumers: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for s in topo.streams:
        times = topo.nodes[s.dst].parallelism if s.grouping.type == "all" else 1
        consumers.setdefault((s.src, s.name), []).append((s.dst, times))
    total = 0

    def deliver(src: str, stream: str, values: list, m: int) -> None:
        nonlocal total
        for dst, times in consumers.get((src, stream), ()):
            total += m * times
            arrive(dst, values, m * times)

    def arrive(name: str, values: list, m: int) -> None:
        op = topo.nodes[name].operator
        if op == "identity":
            deliver(name, "default", values, m)
        elif op == "split_streams":
            sp = splitters[name]
            out = split_step(values, sp.salt, sp.drop)
            if out is not None:
                deliver(name, pick_stream(sp.streams, out[2], sp.salt), out, m)
        elif op == "digest":
            r, h = results[name], tuple_digest(values)
            r["tuples"] += m
            r["sum"] = (r["sum"] + h * m) & MASK64
            if m % 2:
                r["xor"] ^= h
        else:
            counts = results[name]["counts"]
            counts[values[0]] = counts.get(values[0], 0) + m

    for name, node in topo.nodes.items():
        if node.operator != "keyed_source":
            continue
        src, p = KeyedSource(**node.args), node.parallelism
        for i in range(p):
            for j in range(src.count):
                t = keyed_tuple(src.seed, j * p + i, src.keys, src.pad)
                deliver(name, pick_stream(src.streams, t[2], src.seed), t, 1)
    if arrivals is not None:
        arrivals[0] = total
    return results
