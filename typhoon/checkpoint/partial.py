"""Partial rollback (SAND §4.2): which workers a failure rolls back inside a region,
and which ones replay to them from their output buffers instead.

The rollback set of failed workers ``F`` is ``F`` and everything downstream of
it on the worker graph (``typhoon.checkpoint.regions.worker_edges``): a
receiver of a rolled-back worker gets its output again, in another
interleaving, so it goes back too.  Its upstream boundary (the senders of the
set that are not in it) replays, from its output buffers
(``typhoon.checkpoint.output_buffers``), what it sent each member after the
anchor of the epoch the set restores; every other worker is not told anything.

It falls back to region rollback (``typhoon.checkpoint.regions``) when the set
holds a source (its input is outside the job: it seeks back instead, and
numbers its epochs anew) or a boundary worker's buffer cannot reach back to the
epoch restored (trimmed past its bound, or it sent through a load-balancer
address and cannot tell which worker got what).  Pure functions; the
controller and the model check act on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from typhoon.checkpoint.output_buffers import START
from typhoon.checkpoint.regions import GLOBAL, REGION, rollback_set, worker_edges
from typhoon.checkpoint.settings import partial_enabled
from typhoon.topology.model import PhysicalTopology, Topology

PARTIAL = "partial"  # the failed workers and their downstream closure; the boundary replays


@dataclass(frozen=True)
class PartialRollback:
    """What a failure of some workers does: roll back ``workers`` to an epoch, and have
    each of ``replayers`` resend its buffers to the members it sends to."""

    workers: frozenset[int]
    path: str  # PARTIAL, REGION or GLOBAL
    replayers: dict[int, tuple[int, ...]] = field(default_factory=dict)  # sender -> members
    reason: str = ""  # why not PARTIAL


def downstream_closure(edges: Iterable[tuple[int, int]], failed: Iterable[int]) -> frozenset[int]:
    """``failed`` and every worker reachable from one of them along ``edges``.

    A search of its own, not networkx: the controller imports this module, and
    networkx would add 0.2 s of CPU to its start."""
    after: dict[int, list[int]] = {}
    for a, b in edges:
        after.setdefault(a, []).append(b)
    out = set(failed)
    frontier = list(out)
    while frontier:
        for nxt in after.get(frontier.pop(), ()):
            if nxt not in out:
                out.add(nxt)
                frontier.append(nxt)
    return frozenset(out)


def boundary(
    edges: Iterable[tuple[int, int]], members: frozenset[int]
) -> dict[int, tuple[int, ...]]:
    """Senders outside ``members`` -> the members they send to."""
    out: dict[int, set[int]] = {}
    for a, b in edges:
        if b in members and a not in members:
            out.setdefault(a, set()).add(b)
    return {a: tuple(sorted(bs)) for a, bs in sorted(out.items())}


def covered(coverage: Mapping[int, int | None], worker: int, epoch: int | None) -> bool:
    """A worker that reported ``backup_from`` = ``coverage[worker]`` can replay from
    ``epoch`` (its buffers purge only through checkpoints complete for its region, so
    an epoch at or after what it reported stays covered unless it trims)."""
    start = coverage.get(worker)
    if start is None:
        return False
    e = START if epoch is None else epoch
    return start == START or (e != START and e >= start)


def partial_rollback(
    topology: Topology,
    physical: PhysicalTopology,
    failed: Iterable[int],
    epoch: int | None,
    coverage: Mapping[int, int | None],
) -> PartialRollback:
    """The rollback of ``failed`` to ``epoch`` (None: the start): PARTIAL when every
    boundary worker's buffers reach back to ``epoch`` (``coverage``: worker ->
    ``backup_from`` it reported, see :func:`covered`) and no source is in the set;
    else the failed workers' regions (REGION or GLOBAL), with the reason."""
    ids = {w.worker_id for w in physical.workers}
    dead = set(failed) & ids
    edges = worker_edges(topology, physical)
    members = downstream_closure(edges, dead)
    region = rollback_set(topology, physical, dead)

    if not members:
        return PartialRollback(frozenset(), PARTIAL, {}, "no failed worker is in the job")

    def fallback(reason: str) -> PartialRollback:
        return PartialRollback(region.workers, region.path, {}, reason)

    spouts = {
        w.worker_id for w in physical.workers if topology.nodes[w.node].kind == "spout"
    } & members
    if spouts:
        return fallback(f"sources {sorted(spouts)} are in the rollback set: they seek back")
    replayers = boundary(edges, members)
    short = [w for w in replayers if not covered(coverage, w, epoch)]
    if short:
        return fallback(f"the output buffers of {short} do not reach back to epoch {epoch}")
    if members >= region.workers:
        return PartialRollback(region.workers, region.path, {}, "the set is the whole region")
    return PartialRollback(members, PARTIAL, replayers)


__all__ = [
    "GLOBAL",
    "PARTIAL",
    "REGION",
    "PartialRollback",
    "downstream_closure",
    "partial_enabled",
]
