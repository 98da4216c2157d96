"""Logical -> physical topology: worker IDs, hosts and switch ports (paper §5).

Typhoon's scheduler replaces Storm's round-robin: it lays the workers out in
topological order and fills one host after another, so workers that talk to
each other share a host and their tuples stay on the local switch.  What
:func:`schedule` guarantees, for the same input, always the same output:

* worker IDs 1..N follow the topological order of nodes (ties: file order),
  then the worker index;
* every host gets at most ``ceil(N / len(hosts))`` workers (balance), hosts
  are filled in list order, and each host holds a contiguous run of worker
  IDs, so along the topological order the workers change host at most
  ``len(hosts) - 1`` times;
* ports on each host are ``first_port, first_port + 1, ...`` in worker ID order.

:func:`reschedule` changes a running application: it never moves a worker
that can stay, so only added or removed workers need flows and routing.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Collection, Mapping

from .model import PhysicalTopology, Topology, WorkerAssignment

MAX_ID = 0xFFFE  # worker and application IDs are 16-bit; 0 and 0xFFFF stay reserved


def app_id_for(name: str) -> int:
    """Stable 16-bit application ID (1..0xFFFE) from the topology name.

    ``zlib.crc32`` is the same in every process and Python version, unlike
    ``hash()``, so every host derives the same worker addresses.  Reducing it
    modulo 0xFFFE spreads similar names better than XOR-folding the halves.
    Different names can still collide: whoever admits an application should
    check that its ID is not in use on the same switches.
    """
    return zlib.crc32(name.encode("utf-8")) % MAX_ID + 1


def topological_order(topology: Topology) -> list[str]:
    """Node names, sources first; ties keep file order so the result never varies."""
    import networkx as nx  # here, not at the top: workers import this module, never call it

    graph = nx.DiGraph()
    graph.add_nodes_from(topology.nodes)
    graph.add_edges_from((s.src, s.dst) for s in topology.streams)
    position = {name: i for i, name in enumerate(topology.nodes)}
    return list(nx.lexicographical_topological_sort(graph, key=position.__getitem__))


def schedule(
    topology: Topology, hosts: list[str], app_id: int, first_port: int = 10
) -> PhysicalTopology:
    """Place every worker of ``topology`` on ``hosts`` (see the module docstring)."""
    _check_hosts(hosts)
    if not 1 <= app_id <= MAX_ID:
        raise ValueError(f"app_id must be in 1..{MAX_ID}, not {app_id}")
    slots = [
        (name, i)
        for name in topological_order(topology)
        for i in range(topology.nodes[name].parallelism)
    ]
    if len(slots) > MAX_ID:
        raise ValueError(f"{len(slots)} workers do not fit in 16-bit worker IDs")
    if topology.config.get("placement") == "spread":
        return _spread(topology, slots, hosts, app_id, first_port)
    capacity = math.ceil(len(slots) / len(hosts)) if slots else 0
    workers = []
    for n, (node, index) in enumerate(slots):
        host_no, slot_on_host = divmod(n, capacity)
        workers.append(
            WorkerAssignment(n + 1, node, index, hosts[host_no], first_port + slot_on_host)
        )
    return PhysicalTopology(topology.name, app_id, workers)


def _spread(
    topology: Topology, slots: list[tuple[str, int]], hosts: list[str], app_id: int,
    first_port: int,
) -> PhysicalTopology:  # fmt: skip
    """``config: {placement: spread}``: worker ``i`` of every node on host ``i mod H``
    (Storm's round-robin), so each host runs a share of every node.  Key routing
    then decides what crosses hosts (locality-aware routing, ``typhoon/locality/``)."""
    next_port = dict.fromkeys(hosts, first_port)
    workers = []
    for n, (node, index) in enumerate(slots):
        host = hosts[index % len(hosts)]
        workers.append(WorkerAssignment(n + 1, node, index, host, next_port[host]))
        next_port[host] += 1
    return PhysicalTopology(topology.name, app_id, workers)


def reschedule(
    topology: Topology,
    old: PhysicalTopology,
    hosts: list[str],
    first_port: int = 10,
    *,
    replace: Collection[str] = (),
    avoid: Collection[tuple[str, int]] = (),
    min_id: int = 1,
    closed: Collection[str] = (),
    move: Mapping[int, str] | None = None,
) -> PhysicalTopology:
    """Adapt ``old`` to a changed ``topology`` (parallelism, nodes) or host list.

    Keeps every active worker (same ID, host, port) whose node still exists,
    is not in ``replace`` (nodes whose logic changes get all-new workers), whose
    index is below the node's new parallelism and whose host is still listed.
    Missing (node, index) pairs get new workers with IDs above every old ID,
    on the host with the fewest workers (ties: a host already running that
    node, then host order), at the lowest port >= ``first_port`` that no old
    worker on that host used, since a removed worker may still be draining
    while its replacement starts, and that is not in ``avoid`` (ports of other
    applications).  New IDs are at least ``min_id``: an application never
    reuses the ID of a worker that ran before (its status and report remain).
    Hosts in ``closed`` keep their workers but get no new ones (a host whose
    agent went silent), unless every host is closed.  ``move`` (worker ID ->
    host): those workers are not kept; the new worker of their (node, index)
    goes to that host (``typhoon move``), a port chosen as above.
    The result holds only the kept and new workers.
    """
    _check_hosts(hosts)
    if topology.name != old.name:
        raise ValueError(f"cannot reschedule '{old.name}' as '{topology.name}'")
    move = move or {}
    kept = [
        w
        for w in old.workers
        if w.active
        and w.node in topology.nodes
        and w.node not in replace
        and w.index < topology.nodes[w.node].parallelism
        and w.host in hosts
        and w.worker_id not in move
    ]
    have = {(w.node, w.index) for w in kept}
    target = {(w.node, w.index): move[w.worker_id] for w in old.workers if w.worker_id in move}
    load = dict.fromkeys(hosts, 0)
    for w in kept:
        load[w.host] += 1
    used = {(w.host, w.port) for w in old.workers} | set(avoid)
    next_id = max(max((w.worker_id for w in old.workers), default=0) + 1, min_id)
    workers = list(kept)
    open_hosts = [h for h in hosts if h not in closed] or hosts
    for name in topological_order(topology):
        for index in range(topology.nodes[name].parallelism):
            if (name, index) in have:
                continue
            if next_id > MAX_ID:
                raise ValueError("no 16-bit worker IDs left for new workers")
            home = {w.host for w in workers if w.node == name}
            host = target.get((name, index)) or min(
                open_hosts, key=lambda h: (load[h], h not in home, hosts.index(h))
            )
            port = first_port
            while (host, port) in used:
                port += 1
            used.add((host, port))
            load[host] += 1
            workers.append(WorkerAssignment(next_id, name, index, host, port))
            next_id += 1
    workers.sort(key=lambda w: w.worker_id)
    return PhysicalTopology(
        old.name,
        old.app_id,
        workers,
        old.version + 1,
        old.generation,
        old.restore_epoch,
        {n: list(t) for n, t in old.key_groups.items() if n in topology.nodes},
        # kept workers stay in their failover region's generation (new ones: the newest)
        {
            w.worker_id: old.worker_generations[w.worker_id]
            for w in kept
            if w.worker_id in old.worker_generations
        },
    )


def _check_hosts(hosts: list[str]) -> None:
    if not hosts:
        raise ValueError("need at least one host")
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"host list names a host twice: {hosts}")
