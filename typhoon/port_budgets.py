"""How many bytes each worker may have in flight: its share of the switch's sockets.

Userspace Open vSwitch reads every port through a packet socket that holds
``socket_buffer`` bytes of kernel truesize (``HostInfo.socket_buffer``,
:mod:`typhoon.runtime.truesize`); what does not fit is dropped.  A frame a worker
has written and its receivers have not consumed yet can sit in

* the socket of the sender's own port (the TAP), with every other frame of that
  worker: so a worker's frames in flight must fit its port's buffer;
* the socket at the far end of every fabric link its frames cross (the receiving
  bridge reads the link through one), together with the frames of *every* worker
  whose frames cross that link in that direction.

So with ``n(L)`` workers sending across the directed link ``L`` into host ``b``,
a worker ``s`` may have

    budget(s) = min( B(host(s)) - reserve(s),
                     min over links L its frames cross: (B(b) - reserve(L)) / n(L) )

bytes in flight (``docs/flow_control.md`` works examples).  The reserves keep room
for what shares the sockets without credit: grants, SYNCs and NACKs (two credit
frames per link that uses the socket) and control tuples.  The controller and the
agents compute the same numbers from the same physical topology; the controller
sends a worker a FLOW_CONTROL control tuple when its share changes.

The receiver's side holds frames, not bytes: the TAP device queues up to
``txqueuelen`` frames toward its worker, and each link into it has at most a
window of them in flight; :func:`plan_budgets` says when that can overflow.

Pure functions over the topology model: no Ryu, no sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typhoon.cluster import DEFAULT_SOCKET_BUFFER, Cluster
from typhoon.runtime.tap import DEFAULT_TXQUEUELEN
from typhoon.runtime.truesize import CREDIT_TRUESIZE, MAX_TRUESIZE
from typhoon.topology.fabric import fabric_graph, shortest_paths
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.topology.routing import stream_pairs

CONTROL_RESERVE_SHARE = 8  # 1/8 of a socket stays free for control tuples and replies
CREDIT_FRAMES_PER_LINK = 2  # a grant and a NACK (or a SYNC) per link using a socket

Hop = tuple[str, str]  # a directed fabric link: frames go from host a into host b


@dataclass
class BudgetPlan:
    """Every worker's budget, and how it came about (for docs, logs and tests)."""

    budgets: dict[int, int] = field(default_factory=dict)  # worker id -> bytes
    senders: dict[Hop, list[int]] = field(default_factory=dict)  # link -> workers crossing
    shares: dict[Hop, int] = field(default_factory=dict)  # link -> bytes per sender
    warnings: list[str] = field(default_factory=list)


def _reserve(buffer: int, links: int) -> int:
    """Room kept free in a socket of ``buffer`` bytes that ``links`` links use."""
    return buffer // CONTROL_RESERVE_SHARE + CREDIT_FRAMES_PER_LINK * CREDIT_TRUESIZE * links


def plan_budgets(
    topology: Topology,
    physical: PhysicalTopology,
    cluster: Cluster,
    window: int | None = None,
    txqueuelen: int = DEFAULT_TXQUEUELEN,
) -> BudgetPlan:
    """Budgets of every worker of one application (see the module docstring).

    Workers on hosts the cluster does not know, or that no fabric path joins,
    keep their own port's share: the controller refuses such placements anyway.
    """
    graph = fabric_graph(cluster)
    paths = {h: shortest_paths(graph, h) for h in graph.nodes}
    by_id = {w.worker_id: w for w in physical.workers}
    peers: dict[int, set[int]] = {w: set() for w in by_id}  # workers each one talks to
    crosses: dict[int, set[Hop]] = {w: set() for w in by_id}  # links each one's frames cross
    carried: dict[Hop, int] = {}  # (sender, receiver) pairs whose frames cross a link
    in_links: dict[int, int] = {}  # links into each receiver (its TAP queue holds them)
    for s in topology.streams:
        for u, v in stream_pairs(physical, s):
            peers[u.worker_id].add(v.worker_id)
            peers[v.worker_id].add(u.worker_id)
            in_links[v.worker_id] = in_links.get(v.worker_id, 0) + 1
            path = paths.get(u.host, {}).get(v.host)
            if path is None:
                continue
            for hop in zip(path, path[1:], strict=False):
                crosses[u.worker_id].add(hop)
                carried[hop] = carried.get(hop, 0) + 1
                back = (hop[1], hop[0])  # grants and NACKs come back the other way
                carried[back] = carried.get(back, 0) + 1

    def buffer(host: str) -> int:
        info = cluster.hosts.get(host)
        return info.socket_buffer if info is not None else DEFAULT_SOCKET_BUFFER

    plan = BudgetPlan()
    for hop in sorted(carried):
        senders = sorted(w for w, hops in crosses.items() if hop in hops)
        if not senders:
            continue
        room = buffer(hop[1]) - _reserve(buffer(hop[1]), carried[hop])
        plan.senders[hop] = senders
        plan.shares[hop] = max(0, room) // len(senders)
    for wid, w in sorted(by_id.items()):
        own = buffer(w.host) - _reserve(buffer(w.host), len(peers[wid]))
        share = min([own, *(plan.shares[h] for h in crosses[wid])])
        if share < MAX_TRUESIZE:
            plan.warnings.append(
                f"worker {wid} ({w.node}[{w.index}] on {w.host}): its share of the switch's "
                f"socket buffers is {share} bytes, less than one full frame "
                f"({MAX_TRUESIZE}); raise net.core.rmem_default on the hosts"
            )
            share = MAX_TRUESIZE
        plan.budgets[wid] = share
    if window is not None:
        for wid, n in sorted(in_links.items()):
            if n * window > txqueuelen:
                plan.warnings.append(
                    f"worker {wid}: {n} links x window {window} frames exceed its TAP queue "
                    f"({txqueuelen} frames)"
                )
    return plan


def send_budgets(
    topology: Topology, physical: PhysicalTopology, cluster: Cluster
) -> dict[int, int]:
    """worker id -> bytes of truesize it may have in flight."""
    return plan_budgets(topology, physical, cluster).budgets
