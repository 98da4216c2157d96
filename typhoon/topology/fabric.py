"""Paths between host bridges on the emulated fabric (docs/design.md §3, "remote").

The cluster's bridges and the links between them form an undirected graph; a
tuple between workers on different hosts follows the shortest path, and a
one-to-many tuple follows a tree. Both come from the same per-source choice of
paths: fewest hops, ties broken by the lexicographically smallest sequence of
host names. Because that choice is prefix-closed (the path to a host extends
the path to its predecessor), the union of the paths from one source is a
tree, so every inter-host link carries at most one copy of a multicast frame,
and every bridge computes the same next hop as its neighbours.

Pure Python, no Ryu and no networkx: every agent computes its workers' port
budgets over this graph (typhoon.port_budgets), and importing networkx cost
each agent 0.2 s of CPU while an emulated cluster starts on two cores.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from typhoon.cluster import Cluster

Path = tuple[str, ...]


class NoPath(ValueError):
    """Two hosts that must exchange tuples are not connected by the fabric."""


@dataclass(frozen=True)
class TreeHop:
    """One host of a multicast tree: where the frame enters, where copies leave."""

    in_port: int | None  # fabric port from the parent; None at the source host
    children: tuple[tuple[str, int], ...]  # (child host, out port on this host), by name


@dataclass(frozen=True)
class FabricGraph:
    """Hosts as nodes, fabric links as undirected edges; ``ports(a, b)[a]`` is a's port."""

    adjacency: dict[str, dict[str, dict[str, int]]]  # host -> adjacent host -> link's ports

    @property
    def nodes(self) -> list[str]:
        return list(self.adjacency)

    def __contains__(self, host: object) -> bool:
        return host in self.adjacency

    def neighbors(self, host: str) -> Iterable[str]:
        return self.adjacency[host]

    def has_edge(self, a: str, b: str) -> bool:
        return b in self.adjacency.get(a, {})

    def ports(self, a: str, b: str) -> dict[str, int]:
        """Each end's port on the link between adjacent ``a`` and ``b`` (KeyError: none)."""
        return self.adjacency[a][b]

    def links(self) -> Iterator[tuple[str, str, dict[str, int]]]:
        """Every link once, as (a, b, ports) with a < b."""
        for a, peers in self.adjacency.items():
            for b, ports in peers.items():
                if a < b:
                    yield a, b, ports


def fabric_graph(cluster: Cluster) -> FabricGraph:
    """The cluster's hosts and fabric links as a graph.

    Parallel links between two hosts collapse to the one with the lowest ports
    (there is no multipath); a port used twice on one host is an error.
    """
    graph = FabricGraph({h: {} for h in sorted(cluster.hosts)})
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
            ports = {a: a_port, b: b_port}  # one dict for both directions
            graph.adjacency[a][b] = ports
            graph.adjacency[b][a] = ports
    return graph


def shortest_paths(graph: FabricGraph, src: str) -> dict[str, Path]:
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


def path(graph: FabricGraph, src: str, dst: str) -> list[str]:
    """Hosts from `src` to `dst`, both included."""
    try:
        return list(shortest_paths(graph, src)[dst])
    except KeyError:
        if dst not in graph:
            raise KeyError(f"unknown host {dst!r}") from None
        raise NoPath(f"no fabric path from {src!r} to {dst!r}") from None


def port_to(graph: FabricGraph, host: str, peer: str) -> int:
    """`host`'s port on its link to the adjacent `peer`."""
    return graph.ports(host, peer)[host]


def next_hop_port(graph: FabricGraph, src: str, dst: str) -> int:
    """The port on `src` toward `dst` (a different host)."""
    hops = path(graph, src, dst)
    if len(hops) < 2:
        raise ValueError(f"{src!r} is the destination itself: no next hop")
    return port_to(graph, hops[0], hops[1])


def multicast_tree(graph: FabricGraph, src: str, dsts: Iterable[str]) -> dict[str, TreeHop]:
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
