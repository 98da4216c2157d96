"""Operator chaining: which consecutive nodes run in one worker process (Flink's rule).

A ``forward`` stream ``A -> B`` pairs worker i of A with worker i of B.  When it
is the only output of A and the only input of B, both run the Python engine and
neither the topology nor either node says ``chaining: false``, the edge needs no
network: worker i of A and worker i of B run in one process (the chain's head
hosts the others), tuples passing by function call (``typhoon.runtime.chain``).
Every worker keeps its ID, its routes, its counters and its report, so a run's
report is the same chained or not.

Pure functions: the launchers (tcp runner, host agents) and the worker
process compute the same chains from the same topology and physical topology
(whose ``kept_chains`` keep running processes as they are across live updates:
``typhoon.reconfig.chains``).
"""

from __future__ import annotations

from .model import PhysicalTopology, Stream, Topology

CHAINING_OFF = "config: {chaining: false}"


class ChainedError(ValueError):
    """A reconfiguration needs an edge that runs as a function call (409 / exit 2)."""


def chaining_on(topology: Topology, node: str) -> bool:
    """The node's own ``chaining`` over the topology's (default: on)."""
    own = (topology.nodes[node].config or {}).get("chaining")
    if own is not None:
        return bool(own)
    return bool((topology.config or {}).get("chaining", True))


def chainable(topology: Topology, stream: Stream) -> bool:
    """True when ``stream`` runs as a function call inside one process."""
    if stream.grouping.type != "forward":
        return False
    a, b = topology.nodes[stream.src], topology.nodes[stream.dst]
    return (
        a.parallelism == b.parallelism
        and a.engine == b.engine == "python"
        and len(topology.outputs_of(a.name)) == 1
        and len(topology.inputs_of(b.name)) == 1
        and chaining_on(topology, a.name)
        and chaining_on(topology, b.name)
    )


def plan_chains(topology: Topology) -> list[list[str]]:
    """Every chain of two or more nodes, head first, in the file order of their heads."""
    nxt = {s.src: s.dst for s in topology.streams if chainable(topology, s)}
    tails = set(nxt.values())
    chains = []
    for name in topology.nodes:
        if name in nxt and name not in tails:
            chain = [name]
            while chain[-1] in nxt:
                chain.append(nxt[chain[-1]])
            chains.append(chain)
    return chains


def chained_nodes(topology: Topology) -> set[str]:
    return {n for chain in plan_chains(topology) for n in chain}


def chained_streams(topology: Topology) -> list[Stream]:
    return [s for s in topology.streams if chainable(topology, s)]


def chain_groups(topology: Topology, physical: PhysicalTopology) -> dict[int, list[int]]:
    """Head worker ID -> the worker IDs one process runs, head first.

    Instance i of a chain is the i-th active worker of each of its nodes.  An
    instance whose workers are not all on one host (or not all there) is not
    grouped: its edges go over the network like any other.  A process kept
    whole after a route or insert on one of its edges (``physical.kept_chains``)
    stays one group, whatever the topology chains now.
    """
    groups: dict[int, list[int]] = {}
    present = {w.worker_id for w in physical.workers}
    taken: set[int] = set()
    for kept in physical.kept_chains:
        ws = [w for w in kept if w in present]
        taken.update(ws)
        if len(ws) > 1:
            groups[ws[0]] = ws
    for chain in plan_chains(topology):
        per_node = [physical.active_of_node(n) for n in chain]
        if len({len(ws) for ws in per_node}) != 1:
            continue
        for instance in zip(*per_node, strict=True):
            if len({w.host for w in instance}) == 1 and not taken & {w.worker_id for w in instance}:
                groups[instance[0].worker_id] = [w.worker_id for w in instance]
    return groups


def hosted_by(topology: Topology, physical: PhysicalTopology) -> dict[int, int]:
    """Worker ID -> the head whose process runs it, for every chained worker but heads."""
    return {w: head for head, ws in chain_groups(topology, physical).items() for w in ws[1:]}


def by_call(topology: Topology, physical: PhysicalTopology) -> dict[int, int]:
    """Like :func:`hosted_by`, without the workers whose input from the previous worker
    of their process was unchained live (``physical.unchained``): that edge has rules."""
    off = set(physical.unchained)
    return {w: head for w, head in hosted_by(topology, physical).items() if w not in off}


def inner_edges(
    topology: Topology, physical: PhysicalTopology, node: str, worker: int | None = None
) -> list[tuple[int, int]]:
    """(sender, receiver) worker IDs of the chained edges inside chain processes that
    touch ``node`` (only the instance of ``worker`` when given), in worker ID order.  Two
    neighbours of a kept process whose edge the topology no longer chains are not one."""
    calls = {(s.src, s.dst) for s in chained_streams(topology)}
    edges = []
    for ws in chain_groups(topology, physical).values():
        if worker is not None and worker not in ws:
            continue
        for a, b in zip(ws, ws[1:], strict=False):
            pair = (physical.by_id(a).node, physical.by_id(b).node)
            if node in pair and pair in calls:
                edges.append((a, b))
    return sorted(edges)


def edge_pairs(
    topology: Topology, physical: PhysicalTopology, src: str, dst: str
) -> list[tuple[int, int]]:
    """(sender, receiver) worker IDs of the chained edge ``src -> dst`` inside chain
    processes (empty when it runs on the network everywhere)."""
    return [
        (a, b)
        for a, b in inner_edges(topology, physical, src)
        if (physical.by_id(a).node, physical.by_id(b).node) == (src, dst)
    ]


def refuse_chained_edge(topology: Topology, src: str, dst: str, what: str) -> None:
    """Raise :class:`ChainedError` when the edge ``src -> dst`` runs as a function call."""
    for s in chained_streams(topology):
        if s.src == src and s.dst == dst:
            raise ChainedError(
                f"{what} needs the edge '{src}' -> '{dst}' on the network, but it runs as a "
                f"function call inside one process; set {CHAINING_OFF} on '{src}' or "
                f"'{dst}' (or the topology) and resubmit"
            )


def group_of(topology: Topology, physical: PhysicalTopology, worker_id: int) -> list[int]:
    """The workers that share ``worker_id``'s process, head first (itself alone if none)."""
    for ws in chain_groups(topology, physical).values():
        if worker_id in ws:
            return ws
    return [worker_id]


def refuse_observing(
    topology: Topology, physical: PhysicalTopology, worker_id: int, direction: str
) -> None:
    """Raise :class:`ChainedError` when the live debugger would watch an edge of
    ``worker_id`` that runs as a function call (no frame of it crosses the switch)."""
    for a, b in observed_calls(topology, physical, worker_id, direction):
        refuse_chained_edge(topology, physical.by_id(a).node, physical.by_id(b).node, "watching")


def observed_calls(
    topology: Topology, physical: PhysicalTopology, worker_id: int, direction: str
) -> list[tuple[int, int]]:
    """The (sender, receiver) edges of ``worker_id`` the live debugger would watch in
    ``direction`` that run as function calls now (none of their frames cross the switch)."""
    group = group_of(topology, physical, worker_id)
    at = group.index(worker_id)
    calls = by_call(topology, physical)
    edges = []
    if direction in ("in", "both") and at > 0 and worker_id in calls:
        edges.append((group[at - 1], worker_id))
    if direction in ("out", "both") and at < len(group) - 1 and group[at + 1] in calls:
        edges.append((worker_id, group[at + 1]))
    return edges
