"""Reconfiguration of chained nodes: processes stay whole, what an update needs on the
network is unchained live first.

A chain instance (typhoon.topology.chaining) is one process; its inner edges
are function calls (or on the network, unchained live: ``typhoon.reconfig.unchain``).
Scaling a chained node scales its whole chain (``edit.scaled_together``): new
instances are new processes, removed ones drain whole, the others stay as they
are.  A route or insert on a chained edge, and a remove, move or swap (one that
cannot run in place: ``typhoon.reconfig.swap_in_place``) of a worker that shares
its process, first unchain the edges they need in the same update
(:func:`unchain_first`: their rules, then CHAIN to their senders) and keep each
running process as it is (``physical.kept_chains``): the update then runs as on
network edges; a worker that leaves drains and the process goes on with the
others (the agent only removes its port), newcomers run alone.  What would form
a process from running workers or move a running worker into another process is
refused (409, one sentence naming ``config: {chaining: false}``):
:func:`check_groups`.
"""

from __future__ import annotations

import dataclasses

from typhoon.reconfig.edit import find_stream
from typhoon.reconfig.plan_model import Step
from typhoon.reconfig.requests import (
    Insert,
    Move,
    ReconfigError,
    Remove,
    Request,
    Reroute,
    Swap,
)
from typhoon.topology.chaining import (
    CHAINING_OFF,
    chain_groups,
    chained_streams,
    edge_pairs,
)
from typhoon.topology.model import PhysicalTopology, Topology


def chained_edge(request: Request, topology: Topology) -> tuple[str, str] | None:
    """(src, dst) of the edge a route or insert changes when that edge is chained."""
    if isinstance(request, Insert):
        edge = (request.src, request.dst)
    elif isinstance(request, Reroute):
        try:
            s = find_stream(topology, request.stream)
        except ReconfigError:
            return None  # apply_request says what is wrong with it
        edge = (s.src, s.dst)
    else:
        return None
    chained = {(s.src, s.dst) for s in chained_streams(topology)}
    return edge if edge in chained else None


def unchain_first(
    request: Request,
    topology: Topology,
    physical: PhysicalTopology,
    exited: set[int] | frozenset = frozenset(),
) -> tuple[PhysicalTopology, list[Step]] | None:
    """For a route or insert on a chained edge, or a move of a worker that shares its
    process: the physical topology with the edge (the worker's edges to its process
    neighbours) unchained and those processes kept whole, and the steps that get there
    (write it, its rules, CHAIN to the live senders, keep its rules while the rest of
    the update runs); None when the request needs no edge of a process on the network."""
    found = _edges_to_unchain(request, topology, physical)
    if found is None:
        return None
    what, pairs = found
    senders = {a for a, _ in pairs}
    groups = [ws for ws in chain_groups(topology, physical).values() if senders & set(ws)]
    touched = {w for ws in groups for w in ws}
    kept = [g for g in physical.kept_chains if not touched & set(g)] + groups
    off = set(physical.unchained)
    new = dataclasses.replace(
        physical,
        workers=list(physical.workers),
        version=physical.version + 1,
        key_groups={n: list(t) for n, t in physical.key_groups.items()},
        worker_generations=dict(physical.worker_generations),
        unchained=sorted(off | {b for _, b in pairs}),
        kept_chains=sorted(kept),
    )
    steps = [
        Step(
            "write",
            f"write physical version {new.version}: {what} on the network, "
            "its processes kept whole",
            physical=new,
        ),  # fmt: skip
        Step("wait_rules", "the controller installs the rules of the unchained edges"),
    ]
    todo = [(a, b) for a, b in pairs if b not in off and a not in exited]
    if todo:
        bodies = [(a, {"receiver": b, "chained": False}) for a, b in todo]
        text = "CHAIN: senders send on the network"
        steps.append(Step("control", text, [a for a, _ in todo], "CHAIN", bodies))
    steps.append(
        Step(
            "keep_rules",
            "keep the unchained edges' rules too while the update runs",
            topology=topology,
            physical=new,
        )  # fmt: skip
    )
    return new, steps


def _edges_to_unchain(
    request: Request, topology: Topology, physical: PhysicalTopology
) -> tuple[str, list[tuple[int, int]]] | None:
    """(what, (sender, receiver) pairs inside processes) ``request`` needs on the network."""
    if isinstance(request, (Move, Swap, Remove)):
        if isinstance(request, Move):
            leaving = {w.worker_id for w in physical.workers if w.worker_id == request.worker}
            what = f"worker {request.worker}'s edges in its process"
        else:
            leaving = {w.worker_id for w in physical.of_node(request.node)}
            what = f"the edges of '{request.node}' in its processes"
        pairs = [
            (a, b)
            for ws in chain_groups(topology, physical).values()
            for a, b in zip(ws, ws[1:], strict=False)
            if leaving & {a, b}
        ]
        return (what, pairs) if pairs else None
    edge = chained_edge(request, topology)
    pairs = edge_pairs(topology, physical, *edge) if edge else []
    if edge is None or not pairs:
        return None
    return f"'{edge[0]}' -> '{edge[1]}'", pairs


def pin_processes(
    old: tuple[Topology, PhysicalTopology], new: tuple[Topology, PhysicalTopology]
) -> list[list[int]]:
    """``new``'s kept processes so that no running worker changes process: each one the
    new topology would group otherwise than now keeps its current group (or runs alone)."""
    before, after = chain_groups(*old), chain_groups(*new)
    running = {w.worker_id for w in old[1].workers}
    member = {w: ws for ws in before.values() for w in ws}
    pins = [list(g) for g in new[1].kept_chains]
    for ws in after.values():
        if before.get(ws[0]) != ws:
            for w in ws:
                group = member.get(w, [w])
                if w in running and group not in pins:
                    pins.append(list(group))
    return sorted(pins)


def kept_after(physical: PhysicalTopology, workers: set[int]) -> list[list[int]]:
    """The kept processes that still run one of ``workers``, with only those."""
    return [[w for w in g if w in workers] for g in physical.kept_chains if workers & set(g)]


def check_groups(
    old: tuple[Topology, PhysicalTopology], new: tuple[Topology, PhysicalTopology]
) -> None:
    """409 unless every running worker stays in the process it runs in with the same
    running workers (none formed, none joined by a newcomer), and every worker that
    leaves a process that goes on had its edges to the others there on the network; a
    rescaled chain may gain or lose whole instances (processes)."""
    before, after = chain_groups(*old), chain_groups(*new)
    kept = {w.worker_id for w in new[1].workers} & {w.worker_id for w in old[1].workers}

    def running(groups: dict[int, list[int]]) -> dict[int, tuple[int, ...]]:
        return {w: tuple(x for x in ws if x in kept) for ws in groups.values() for w in ws}

    was, now = running(before), running(after)
    joined = any(kept & set(ws) and not set(ws) <= kept for ws in after.values())
    moved = any(was.get(w, (w,)) != now.get(w, (w,)) for w in kept)
    off = set(new[1].unchained)
    calls = [
        (a, b)
        for ws in before.values()
        for a, b in zip(ws, ws[1:], strict=False)
        if (a in kept) != (b in kept) and b not in off
    ]
    if joined or moved or calls:
        raise ReconfigError(
            "this update would split or form a chain of workers that run in one process, "
            f"which a running application cannot do; set {CHAINING_OFF} on the nodes of the "
            "forward edges (or the topology) and resubmit",
            409,
        )
