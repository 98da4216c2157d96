"""Swap in place: ``typhoon swap`` of a chained node keeps its workers in their processes.

A node whose workers run in chain processes (``typhoon.topology.chaining``) is
swapped without new workers: the plan writes the new logical topology (the
physical one only gets a new version: same workers, same places, same rules),
then sends each of the node's workers a SWAP control tuple, acked once the worker
ended its old operator instance and opened the new one inside its process
(``typhoon.runtime.operator_swap``), then commits.  No route, rule or edge
changes, so the chain's edges stay function calls and nothing is drained.
Before the commit a failure is undone as any update's: SWAP back to the old
operator, the old topology written again.

A node with keyed state swaps in place too, chained or not, when both operators
declare their ``keyed_shape``: its workers keep their keyed state across the cut and
the new operator goes on from it (``typhoon.operators.swap_rules.keyed_carry``); a
new operator that would drop or misread that state is refused (409, one sentence).

It runs in place only when the cut is all there is to it (:func:`in_place_refusal`
says why not otherwise); every other swap of a chained node unchains first and
starts new workers alone (``typhoon.reconfig.chains``), and of a keyed node that
runs alone starts new workers with empty state, as before.
"""

from __future__ import annotations

import dataclasses

from typhoon.checkpoint.settings import guarantee_of
from typhoon.operators import OperatorError, resolve_operator
from typhoon.operators.swap_rules import carry_refusal, in_place_blockers, keyed_carry
from typhoon.reconfig.edit import apply_request, check_topology
from typhoon.reconfig.plan_model import Plan, Step, _control
from typhoon.reconfig.requests import ReconfigError, Request, Swap
from typhoon.topology.chaining import chain_groups
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.topology.routing import routes_for, upstream_of


def in_place_refusal(
    old: Topology, new: Topology, physical: PhysicalTopology, node: str
) -> str | None:
    """Why swapping ``node`` from ``old`` to ``new`` cannot run in place (None: it can).

    In place means one cut in each worker's input and nothing else: so not under a
    guarantee (checkpoints hold the old operator's snapshots) unless the state is keyed
    state that goes over (a recovery carries a part of before the swap to the new
    operator too); with keyed state only when both operators keep it and declare its
    shape (the new one inherits it); not with hooks whose state the framework holds
    (``typhoon.operators.swap_rules``), and not when the new operator changes what the
    node emits (fields, hence routes) or who it runs with.  Raises
    :class:`ReconfigError` (409) when both declare keyed state and the new operator
    cannot take the old one's over."""
    a, b = old.nodes[node], new.nodes[node]
    if guarantee_of(old) != "none" and not (a.keyed and b.keyed):
        return f"'{old.name}' runs under guarantee '{guarantee_of(old)}'"
    try:
        a_cls, b_cls = (
            resolve_operator(a.operator, a.engine),
            resolve_operator(b.operator, b.engine),
        )
    except OperatorError as e:
        return str(e)
    if a.keyed or b.keyed:
        if not (a.keyed and b.keyed):
            return f"only one of '{a.operator}' and '{b.operator}' keeps keyed state"
        carry = keyed_carry((a.operator, a_cls, a.args), (b.operator, b_cls, b.args))
        if carry is None:
            return f"'{a.operator}' or '{b.operator}' declares no keyed_shape"
        refusal = carry_refusal(carry, a.operator, b.operator)
        if refusal is not None:
            raise ReconfigError(f"'{node}' cannot swap its keyed state over: {refusal}", 409)
    hooks = in_place_blockers(a_cls) + in_place_blockers(b_cls)
    if hooks:
        return f"the operators have hooks {sorted(set(hooks))}"
    if a.output_fields != b.output_fields:
        return f"'{node}' would emit other fields ({list(b.output_fields)})"
    for w in physical.workers:
        wid = w.worker_id
        if (routes_for(old, physical, wid), upstream_of(old, physical, wid)) != (
            routes_for(new, physical, wid),
            upstream_of(new, physical, wid),
        ):
            return f"worker {wid}'s routes would change"
    if chain_groups(old, physical) != chain_groups(new, physical):
        return "its processes would change"
    return None


def plan_swap_in_place(
    request: Request,
    topology: Topology,
    physical: PhysicalTopology,
    exited: set[int] | frozenset = frozenset(),
    allow_imports: bool = False,
) -> Plan | None:
    """The plan of a swap in place, or None when ``request`` is not a swap of a node that
    runs in a chain process or keeps keyed state, or cannot run in place (the caller
    plans it the usual way)."""
    if not isinstance(request, Swap) or request.node not in topology.nodes:
        return None
    workers = [w.worker_id for w in physical.of_node(request.node)]
    chained = {w for ws in chain_groups(topology, physical).values() for w in ws}
    if not chained & set(workers) and not topology.nodes[request.node].keyed:
        return None
    new_topo, _ = apply_request(topology, request)
    new_topo = check_topology(new_topo, topology, allow_imports)
    if in_place_refusal(topology, new_topo, physical, request.node) is not None:
        return None
    same = dataclasses.replace(
        physical,
        workers=list(physical.workers),
        version=physical.version + 1,
        key_groups={n: list(t) for n, t in physical.key_groups.items()},
        worker_generations=dict(physical.worker_generations),
        unchained=list(physical.unchained),
        kept_chains=[list(g) for g in physical.kept_chains],
    )
    node = new_topo.nodes[request.node]
    body = {"operator": node.operator, "args": dict(node.args)}
    live = [w for w in workers if w not in exited]
    steps = [
        Step(
            "write",
            f"write the new topology and physical version {same.version}: "
            f"'{node.name}' swaps in place, its workers stay in their processes",
        ),
        Step("wait_rules", "the controller compiles the new version (the same rules)"),
    ]
    if live:
        what = (
            f"SWAP: each worker of '{node.name}' ends its operator as at its end of input "
            f"and runs {node.operator} from there, in its process"
        )
        if node.keyed:
            what = (
                f"SWAP: each worker of '{node.name}' runs {node.operator} from there, in its "
                "process, on the keyed state its operator kept"
            )
        steps.append(_control(what, "SWAP", [(w, dict(body)) for w in live]))
    steps.append(Step("commit", "commit: from here on the update only goes forward"))
    return Plan(request, topology, physical, new_topo, same, same, [], [], steps)
