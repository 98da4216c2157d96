"""Reconfiguration of chained nodes: refused with the switch that unchains them.

A chain instance (typhoon.topology.chaining) is one process; its inner edges
carry no frames and have no rules.  An update that would take a worker out of
its chain's process (scale, swap, remove, move), reroute or split an inner edge,
or form a new chain while the application runs would need processes split or
merged live, which the stable update does not do: it is refused (409) with one
sentence naming ``config: {chaining: false}``, which keeps every edge on the
network so each of those updates works.
"""

from __future__ import annotations

from typhoon.reconfig.requests import (
    Insert,
    Move,
    ReconfigError,
    Remove,
    Request,
    Reroute,
    Scale,
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

_WHAT = {Scale: "scaling", Swap: "swapping the operator of", Remove: "removing"}


def check_request(request: Request, topology: Topology, physical: PhysicalTopology) -> None:
    """409 when ``request`` needs a chained node on its own or a chained edge on the network."""
    try:
        if isinstance(request, (Scale, Swap, Remove)) and request.node in topology.nodes:
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
    """409 unless every chain's processes stay as they are (none split, none formed)."""
    before, after = chain_groups(*old), chain_groups(*new)
    if before != after:
        raise ReconfigError(
            "this update would split or form a chain of workers that run in one process, "
            f"which a running application cannot do; set {CHAINING_OFF} on the nodes of the "
            "forward edges (or the topology) and resubmit",
            409,
        )
