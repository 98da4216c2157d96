"""Per-worker routing state derived from the logical and physical topology.

This is what a worker's framework layer needs for each output stream (paper
§3.3.2: next hops, policy, policy state) and what a ROUTING control tuple
carries when it changes.  Pure functions: the controller, the manager and the
tcp runner compute the same tables from the same topology.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from typhoon.topology.keygroups import KEY_ROUTED, owners
from typhoon.topology.model import PhysicalTopology, Stream, Topology, WorkerAssignment


@dataclass
class Route:
    """Routing state of one output stream of one worker."""

    stream: int  # stream ID (frame header)
    policy: str  # a grouping type
    next_hops: list[int]  # receiving worker IDs, in index order
    fields: list[int] = field(default_factory=list)  # key field indices (fields, direct)
    table: dict[str, int] = field(default_factory=dict)  # direct: key -> worker ID
    local: list[int] = field(default_factory=list)  # next hops on the sender's host
    lb_node: int = 0  # sdn: index of the receiving node (load-balancer address)
    version: int = 0
    # sdn: True = send to the node's load-balancer address (the switch picks the worker),
    # False = pick workers like shuffle; None = keep the mode the stream has (only the
    # load-balancer app switches it, other ROUTING updates leave it alone)
    balanced: bool | None = None
    # fields, direct: receiving worker ID per key group (typhoon.topology.keygroups)
    groups: list[int] = field(default_factory=list)

    def to_body(self) -> dict[str, Any]:
        """The body of the ROUTING control tuple that installs this route."""
        body = {
            "stream": self.stream,
            "policy": self.policy,
            "next_hops": list(self.next_hops),
            "fields": list(self.fields),
            "table": dict(self.table),
            "local": list(self.local),
            "lb_node": self.lb_node,
            "version": self.version,
            "groups": list(self.groups),
        }
        if self.balanced is not None:
            body["balanced"] = self.balanced
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Route:
        return cls(
            stream=body["stream"],
            policy=body["policy"],
            next_hops=list(body["next_hops"]),
            fields=list(body.get("fields", [])),
            table=dict(body.get("table", {})),
            local=list(body.get("local", [])),
            lb_node=body.get("lb_node", 0),
            version=body.get("version", 0),
            balanced=body.get("balanced"),
            groups=list(body.get("groups", [])),
        )


def node_index(topology: Topology, node: str) -> int:
    """Position of a node in the file (stable id used in load-balancer addresses)."""
    return list(topology.nodes).index(node)


def position(physical: PhysicalTopology, worker_id: int) -> int:
    """Index of ``worker_id`` among its node's active workers (its own index if draining)."""
    me = physical.by_id(worker_id)
    ids = [w.worker_id for w in physical.active_of_node(me.node)]
    return ids.index(worker_id) if worker_id in ids else me.index


def forward_peer(physical: PhysicalTopology, worker_id: int, node: str) -> list[WorkerAssignment]:
    """A ``forward`` stream's one partner of ``worker_id`` in ``node``: the worker at the
    same position (none when ``node`` has fewer workers)."""
    others = physical.active_of_node(node)
    at = position(physical, worker_id)
    return others[at : at + 1]


def stream_pairs(
    physical: PhysicalTopology, stream: Stream
) -> list[tuple[WorkerAssignment, WorkerAssignment]]:
    """(sender, receiver) pairs whose link ``stream`` may use: every pair, or for a
    ``forward`` stream each sender with its partner."""
    senders, receivers = physical.of_node(stream.src), physical.of_node(stream.dst)
    if stream.grouping.type != "forward":
        return [(u, v) for u in senders for v in receivers]
    return [(u, v) for u in senders for v in forward_peer(physical, u.worker_id, stream.dst)]


def routes_for(topology: Topology, physical: PhysicalTopology, worker_id: int) -> list[Route]:
    """Routes of every output stream of ``worker_id``, in stream order.

    Draining receivers are left out: a reconfiguration is removing them.  A
    ``forward`` stream goes to the receiver at the sender's own position only.
    """
    me = physical.by_id(worker_id)
    routes = []
    for s in topology.outputs_of(me.node):
        receivers = physical.active_of_node(s.dst)
        if s.grouping.type == "forward":
            receivers = forward_peer(physical, worker_id, s.dst)
        hops = [w.worker_id for w in receivers]
        src_fields = list(topology.nodes[s.src].output_fields)
        key = [src_fields.index(f) for f in s.grouping.fields if f in src_fields]
        table = {}
        for k, idx in s.grouping.table.items():
            if 0 <= idx < len(receivers):
                table[str(k)] = receivers[idx].worker_id
        routes.append(
            Route(
                stream=s.id,
                policy=s.grouping.type,
                next_hops=hops,
                fields=key,
                table=table,
                local=[w.worker_id for w in receivers if w.host == me.host],
                lb_node=node_index(topology, s.dst),
                version=physical.version,
                groups=owners(topology, physical, s.dst) if s.grouping.type in KEY_ROUTED else [],
            )
        )
    return routes


def upstream_of(
    topology: Topology, physical: PhysicalTopology, worker_id: int
) -> dict[int, list[int]]:
    """Stream ID -> worker IDs that send to ``worker_id`` on that stream.

    Draining senders are left out: no route of theirs will ever include a worker
    that starts while they drain, so none would send it end of stream.
    """
    me = physical.by_id(worker_id)
    return {
        s.id: [
            w.worker_id
            for w in (
                forward_peer(physical, worker_id, s.src)
                if s.grouping.type == "forward"
                else physical.active_of_node(s.src)
            )
        ]
        for s in topology.inputs_of(me.node)
    }


def receivers_of(topology: Topology, physical: PhysicalTopology, worker_id: int) -> set[int]:
    """Every worker that ``worker_id`` routes to, over all its output streams."""
    return {h for r in routes_for(topology, physical, worker_id) for h in r.next_hops}
