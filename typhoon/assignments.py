"""What the coordinator assigns to one host: the workers its agent must run.

Read afresh on every reconcile; an application whose topologies cannot be read
is reported apart, so the agent leaves its running workers alone rather than
stopping them over a bad read.
"""

from __future__ import annotations

import logging

from typhoon.coordinator import Coordinator, CoordinatorError
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment

log = logging.getLogger("typhoon.agent")

Assigned = dict[tuple[str, int], tuple[Topology, PhysicalTopology, WorkerAssignment]]


def assigned_workers(c: Coordinator, host: str) -> tuple[Assigned, set[str]]:
    """(app, wid) -> (topology, physical, assignment) for ``host``; apps not readable."""
    desired: Assigned = {}
    unreadable: set[str] = set()
    for name in c.physical_names():
        try:
            physical = c.get_physical(name)
            topology = c.get_topology(name)
        except CoordinatorError as e:
            log.error("skipping application %s: %s", name, e)
            unreadable.add(name)
            continue
        if physical is None:
            continue  # deleted since the listing
        if topology is None or physical.name != name:
            log.error("skipping application %s: no matching logical topology", name)
            unreadable.add(name)
            continue
        for w in physical.workers:
            if w.host == host:
                desired[(name, w.worker_id)] = (topology, physical, w)
    return desired, unreadable


def relevant(key: str) -> bool:
    """A changed coordinator key that may change what this host runs."""
    return key == "cluster" or key.startswith(("physical/", "topology/", "debug/"))
