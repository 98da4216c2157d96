"""Paths between host bridges on the emulated fabric (docs/design.md §3, "remote").

The cluster's bridges and the links between them form an undirected graph; a
tuple between workers on different hosts follows the shortest path, and a
one-to-many tuple follows a tree. Both come from the same per-source choice of
paths: fewest hops, ties broken by the lexicographically smallest sequence of
host names. Because that choice is prefix-closed (the path to a host extends
the path to its predecessor), the union of the paths from one source is a
tree, so every inter-host link carries at most one copy of a multicast frame,
and every bridge computes the same next hop as its neighbours.

Pure Python over networkx: no Ryu import.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from typhoon.cluster import Cluster

Path = tuple[str, ...]


class NoPath(ValueError):
    """Two hosts that must exchange tuples are not connected by the fabric."""


@dataclass(frozen=True)
class TreeHop:
    """One host of a multicast tree: where the frame enters, where copies leave."""

    in_port: int | None  # fabric port from the parent; None at the source host
    children: tuple[tuple[str, int], ...]  # (child host, out port on this host), by name


def fabric_graph(cluster: Cluster) -> nx.Graph:
    """Hosts as nodes, fabric links as edges; `graph.edges[a, b]["ports"][a]` is a's port.

    Parallel links between two hosts collapse to the one with the lowest ports
    (there is no multipath); a port used twice on one host is an error.
    """
    graph = nx.Graph()
    graph.add_nodes_from(sorted(cluster.hosts))
    used: dict[tuple[str, int], tuple[str, str]] = {}
    canonical = sorted(
        sorted([(link.a, link.a_port), (link.b, link.b_port)]) for link in cluster.links
    )
    for (a, a_port), (b, b_port) in canonical:
        for host in (a, b):
            if host not in cluster.hosts:
                raise ValueError(f"fabric link names unknown host {host!r}")
        if a == b:
            raise ValueError(f"fabric link from {a!r} to itself")
        for end in ((a, a_port), (b, b_port)):
            if end in used:
                raise ValueError(f"port {end[1]} of host {end[0]!r} is on two fabric links")
            used[end] = (a, b)
        if not graph.has_edge(a, b):
            graph.add_edge(a, b, ports={a: a_port, b: b_port})
    return graph


def shortest_paths(graph: nx.Graph, src: str) -> dict[str, Path]:
    """The chosen path from `src` to every reachable host (module docstring for the rule)."""
    if src not in graph:
        raise KeyError(f"unknown host {src!r}")
    paths: dict[str, Path] = {src: (src,)}
    frontier = [src]
    while frontier:
        reached: dict[str, Path] = {}
        for host in frontier:
            for peer in graph.neighbors(host):
                if peer in paths:
                    continue
                candidate = paths[host] + (peer,)
                if peer not in reached or candidate < reached[peer]:
                    reached[peer] = candidate
        paths.update(reached)
        frontier = sorted(reached)
    return paths


def path(graph: nx.Graph, src: str, dst: str) -> list[str]:
    """Hosts from `src` to `dst`, both included."""
    try:
        return list(shortest_paths(graph, src)[dst])
    except KeyError:
        if dst not in graph:
            raise KeyError(f"unknown host {dst!r}") from None
        raise NoPath(f"no fabric path from {src!r} to {dst!r}") from None


def port_to(graph: nx.Graph, host: str, peer: str) -> int:
    """`host`'s port on its link to the adjacent `peer`."""
    return graph.edges[host, peer]["ports"][host]


def next_hop_port(graph: nx.Graph, src: str, dst: str) -> int:
    """The port on `src` toward `dst` (a different host)."""
    hops = path(graph, src, dst)
    if len(hops) < 2:
        raise ValueError(f"{src!r} is the destination itself: no next hop")
    return port_to(graph, hops[0], hops[1])


def multicast_tree(graph: nx.Graph, src: str, dsts: Iterable[str]) -> dict[str, TreeHop]:
    """Every host that handles a frame sent from `src` to all of `dsts`.

    The source always appears (in_port None); hosts on the way appear even if
    they hold no receiver. Children are sorted by host name.
    """
    paths = shortest_paths(graph, src)
    parent: dict[str, str] = {}
    for dst in set(dsts):
        if dst not in paths:
            if dst not in graph:
                raise KeyError(f"unknown host {dst!r}")
            raise NoPath(f"no fabric path from {src!r} to {dst!r}")
        hops = paths[dst]
        parent.update(zip(hops[1:], hops[:-1], strict=True))
    children: dict[str, list[str]] = {src: []}
    for child in parent:
        children.setdefault(child, [])
    for child, up in parent.items():
        children[up].append(child)
    return {
        host: TreeHop(
            in_port=port_to(graph, host, parent[host]) if host in parent else None,
            children=tuple((c, port_to(graph, host, c)) for c in sorted(kids)),
        )
        for host, kids in sorted(children.items())
    }
