"""Failover regions: which workers a failure makes roll back (Flink's region failover).

Tuples and punctuations only travel along the physical dataflow graph: worker
``a`` is joined to worker ``b`` when one of ``a``'s routes names ``b``.  Every
grouping names every active worker of the receiving node (``global`` and
``direct`` pick one for the data, but anchors, marks and end of stream go to
all of them), so a stream couples all workers of its two nodes.  A connected
component of that graph (edges taken both ways) is a failover region.  A
checkpoint anchor starts at the sources of a region and reaches every worker
of it and nothing else, so a region's workers hold a consistent cut of their
own, independent of every other region: on a failure only the regions of the
failed workers roll back, and the rest never stops.

Each region keeps its own generation (the newest recovery it went through) and
therefore its own epoch numbering (``generation * EPOCHS_PER_GENERATION + n``).
The physical topology records it per worker (``PhysicalTopology.worker_generations``):
a replacement starts in its region's generation from its region's epoch, the
core's catch-up ROLLBACK and COMPLETE compare each worker with its own region.
Pure functions of the topology; the controller acts on them
(``controller/recovery/region_recovery.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.topology.routing import receivers_of

REGION = "region"  # only the failed workers' regions roll back
GLOBAL = "global"  # the failed workers' regions are the whole job


def worker_edges(topology: Topology, physical: PhysicalTopology) -> set[tuple[int, int]]:
    """``(sender, receiver)`` for every pair of workers one of the sender's routes joins."""
    return {
        (w.worker_id, h)
        for w in physical.workers
        for h in receivers_of(topology, physical, w.worker_id)
        if h != w.worker_id
    }


def failover_regions(topology: Topology, physical: PhysicalTopology) -> list[frozenset[int]]:
    """The connected components of the worker graph, ordered by their lowest worker ID.

    Every worker of ``physical`` is in exactly one region (one with no route to or
    from anybody is a region of its own).  ``config: {failover: global}`` makes the
    whole job one region: every failure rolls every worker back, as before regions
    (Flink's ``full`` failover strategy; the recovery benchmark's baseline)."""
    if topology.config.get("failover") == GLOBAL:
        return [frozenset(w.worker_id for w in physical.workers)] if physical.workers else []
    nodes = [w.worker_id for w in physical.workers]
    return components(nodes, worker_edges(topology, physical))


def components(nodes: Iterable[int], edges: Iterable[tuple[int, int]]) -> list[frozenset[int]]:
    """The connected components of an undirected graph, ordered by their lowest node;
    edges with an end outside ``nodes`` are ignored.  A search of its own, not
    networkx: the controller imports this module, and networkx would add 0.2 s of
    CPU to its start."""
    peers: dict[int, set[int]] = {n: set() for n in nodes}
    for a, b in edges:
        if a in peers and b in peers:
            peers[a].add(b)
            peers[b].add(a)
    found: list[frozenset[int]] = []
    placed: set[int] = set()
    for start in peers:
        if start in placed:
            continue
        region, frontier = {start}, [start]
        while frontier:
            for peer in peers[frontier.pop()]:
                if peer not in region:
                    region.add(peer)
                    frontier.append(peer)
        placed |= region
        found.append(frozenset(region))
    return sorted(found, key=min)


@dataclass(frozen=True)
class RollbackSet:
    """The workers a failure of ``failed`` rolls back, and the path that is."""

    workers: frozenset[int]
    path: str  # REGION or GLOBAL
    regions: int  # how many regions the job has


def rollback_set(
    topology: Topology, physical: PhysicalTopology, failed: Iterable[int]
) -> RollbackSet:
    """Every worker of a region that holds one of ``failed`` (IDs not in ``physical``
    are ignored); ``GLOBAL`` when that is every worker of the job."""
    regions = failover_regions(topology, physical)
    dead = set(failed)
    touched = frozenset().union(*(r for r in regions if r & dead))
    everyone = {w.worker_id for w in physical.workers}
    path = GLOBAL if touched >= everyone else REGION
    return RollbackSet(touched, path, len(regions))


def region_parts(physical: PhysicalTopology, workers: Iterable[int]) -> set[str]:
    """Checkpoint store part names (node-index) of the active ones among ``workers``."""
    chosen = set(workers)
    return {f"{w.node}-{w.index}" for w in physical.workers if w.active and w.worker_id in chosen}


def roll_back(
    physical: PhysicalTopology, workers: Iterable[int], generation: int, epoch: int | None
) -> PhysicalTopology:
    """``physical`` after ``workers`` went to ``generation`` from ``epoch``.

    ``generation`` and ``restore_epoch`` become the newest recovery's; every other
    worker keeps the generation it is in, recorded in ``worker_generations`` (left
    empty when every worker is in the newest one, as after a global rollback)."""
    moved = set(workers)
    kept = {
        w.worker_id: physical.generation_of(w.worker_id)
        for w in physical.workers
        if w.worker_id not in moved
    }
    table: dict[int, tuple[int, int | None]] = {}
    if any(gen != (generation, epoch) for gen in kept.values()):
        table = {**kept, **{w: (generation, epoch) for w in moved}}
    return dataclasses.replace(
        physical, generation=generation, restore_epoch=epoch, worker_generations=table
    )


def replayed_since(replayed: Any, generation: int) -> int | None:
    """Tuples a source emitted again after the rollback an incident of ``generation`` sent
    it, from its METRIC_RESP ``replayed`` (generation, as a string -> tuples emitted since
    its rollback to it): the count of the first generation it rolled back as since (a
    newer failure of the region may have covered that incident's own generation); None
    when it says nothing of one."""
    if not isinstance(replayed, dict):
        return None
    counts = {
        int(g): n
        for g, n in replayed.items()
        if isinstance(g, str) and g.isdigit() and type(n) is int
    }
    since = [g for g in counts if g >= generation]
    return counts[min(since)] if since else None
