"""Reconfiguration of chained nodes: what keeps chain processes whole, and refusals.

A chain instance (typhoon.topology.chaining) is one process; its inner edges
are function calls (or on the network, unchained live: ``typhoon.reconfig.unchain``).
Scaling a chained node scales its whole chain (``edit.scaled_together``): new
instances are new processes, removed ones drain whole, the others stay as they
are.  An update that would take a worker out of its chain's process (swap,
remove, move), reroute an inner edge, or split or form a chain's process while
the application runs would need processes split or merged live, which the
stable update does not do: it is refused (409) with one sentence naming
``config: {chaining: false}``, which keeps every edge on the network so each of
those updates works.
"""

from __future__ import annotations

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
    ChainedError,
    chain_groups,
    refuse_chained,
    refuse_chained_edge,
)
from typhoon.topology.model import PhysicalTopology, Topology

_WHAT = {Swap: "swapping the operator of", Remove: "removing"}


def check_request(request: Request, topology: Topology, physical: PhysicalTopology) -> None:
    """409 when ``request`` needs a chained node on its own or a chained edge on the network."""
    try:
        if isinstance(request, (Swap, Remove)) and request.node in topology.nodes:
            refuse_chained(topology, [request.node], _WHAT[type(request)] + " a node")
        elif isinstance(request, Move):
            w = next((w for w in physical.workers if w.worker_id == request.worker), None)
            if w is not None:
                refuse_chained(topology, [w.node], "moving a worker")
        elif isinstance(request, Insert):
            refuse_chained_edge(topology, request.src, request.dst, "inserting a node")
        elif isinstance(request, Reroute):
            for s in topology.streams:
                if request.stream in (s.id, f"{s.src}->{s.dst}", f"{s.src}:{s.dst}"):
                    refuse_chained_edge(topology, s.src, s.dst, "rerouting a stream")
    except ChainedError as e:
        raise ReconfigError(str(e), 409) from None


def check_groups(
    old: tuple[Topology, PhysicalTopology], new: tuple[Topology, PhysicalTopology]
) -> None:
    """409 unless every chain process stays as it is (none split, none formed from
    running workers); a rescaled chain may gain or lose whole instances (processes)."""
    before, after = chain_groups(*old), chain_groups(*new)
    kept = {w.worker_id for w in new[1].workers} & {w.worker_id for w in old[1].workers}
    changed = {h: ws for h, ws in before.items() if after.get(h) != ws} | {
        h: ws for h, ws in after.items() if before.get(h) != ws
    }
    if any(kept & set(ws) for ws in changed.values()):
        raise ReconfigError(
            "this update would split or form a chain of workers that run in one process, "
            f"which a running application cannot do; set {CHAINING_OFF} on the nodes of the "
            "forward edges (or the topology) and resubmit",
            409,
        )
