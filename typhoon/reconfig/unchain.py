"""Live unchaining: a chained edge goes on the network, or back to a function call.

A chain instance (``typhoon.topology.chaining``) is one process whose workers each
keep their own transport; only the inner edges are function calls.  Unchaining
keeps the process: the physical topology lists the receiving worker in
``unchained``, so the controller compiles the edge's rules like any link's, and
once the switches hold them a CHAIN control tuple tells the sender to send on
the network (what it called before was delivered then and there, so nothing is
overtaken).  Chaining again is the reverse, make before break: the rules stay
until the sender acked CHAIN, which it does only once the receiver has handed
its framework every frame of the link (``typhoon.runtime.chain``).
"""

from __future__ import annotations

from typhoon.reconfig.plan_model import Plan, Step
from typhoon.reconfig.requests import Chain, ReconfigError, Unchain
from typhoon.topology.chaining import inner_edges
from typhoon.topology.model import PhysicalTopology, Topology


def plan_unchain(
    request: Unchain | Chain,
    topology: Topology,
    physical: PhysicalTopology,
    exited: set[int] | frozenset = frozenset(),
) -> Plan:
    """The steps that unchain (or chain again) the edges ``request`` names (409 when
    there is none, or none to change)."""
    if request.node not in topology.nodes:
        raise ReconfigError(f"'{topology.name}' has no node '{request.node}'", 404)
    if request.worker is not None and all(
        w.worker_id != request.worker for w in physical.of_node(request.node)
    ):
        raise ReconfigError(f"worker {request.worker} is not a worker of '{request.node}'", 404)
    edges = inner_edges(topology, physical, request.node, request.worker)
    if not edges:
        raise ReconfigError(
            f"'{request.node}' runs in no chain process (no forward edge of it is chained), "
            "so it has nothing to unchain or chain again",
            409,
        )
    off = set(physical.unchained)
    unchain = isinstance(request, Unchain)
    todo = [(a, b) for a, b in edges if (b in off) != unchain and a not in exited]
    if not todo:
        state = "on the network already" if unchain else "function calls already"
        raise ReconfigError(f"the chained edges of '{request.node}' are {state}", 409)
    receivers = {b for _, b in todo}
    new = PhysicalTopology(
        physical.name,
        physical.app_id,
        list(physical.workers),
        physical.version + 1,
        physical.generation,
        physical.restore_epoch,
        {n: list(t) for n, t in physical.key_groups.items()},
        dict(physical.worker_generations),
        sorted(off | receivers if unchain else off - receivers),
    )
    bodies = [(a, {"receiver": b, "chained": not unchain}) for a, b in todo]
    pairs = ", ".join(f"{a}->{b}" for a, b in todo)
    write = Step("write", f"write physical version {new.version}: {pairs} {_state(unchain)}")
    if unchain:
        steps = [
            write,
            Step("wait_rules", "the controller installs the rules of the unchained edges"),
            Step(
                "control",
                "CHAIN: senders send on the network",
                [a for a, _ in todo],
                "CHAIN",
                bodies,
            ),  # fmt: skip
            Step("commit", "commit: from here on the update only goes forward"),
        ]
    else:
        steps = [
            Step("keep_rules", "keep the edges' rules until their last frame is delivered"),
            write,
            Step("wait_rules", "the controller compiles the new version"),
            Step(
                "control",
                "CHAIN: senders call again once the receiver caught up",
                [a for a, _ in todo],
                "CHAIN",
                bodies,
            ),  # fmt: skip
            Step("commit", "commit: from here on the update only goes forward"),
            Step("drop_rules", "remove the rules of the chained edges"),
            Step("wait_rules", "every switch holds exactly the new rules"),
        ]
    return Plan(request, topology, physical, topology, new, new, [], [], steps)


def _state(unchain: bool) -> str:
    return "on the network" if unchain else "function calls again"
