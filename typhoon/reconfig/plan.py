"""A checked request + the running application -> the ordered steps of a stable update.

See the package docstring for the procedure.  :func:`plan` computes the new
topology, the physical topology during the update (new workers added,
removed ones ``draining``), the final one, and the steps with every control
tuple body they send (versions are added by the executor).  Unchaining and
chaining again live have their own, shorter plan (``typhoon.reconfig.unchain``), and
so has the swap in place of a chained node or of a node with keyed state
(``typhoon.reconfig.swap_in_place``).
"""

from __future__ import annotations

from typing import Any

from typhoon.checkpoint.settings import guarantee_of
from typhoon.reconfig.chains import (
    check_groups,
    kept_after,
    pin_processes,
    unchain_first,
)
from typhoon.reconfig.edit import apply_request, check_topology
from typhoon.reconfig.move import add_worker_move, check_move
from typhoon.reconfig.plan_model import ACTIONS, Bodies, Plan, Step, _control
from typhoon.reconfig.requests import Chain, Move, ReconfigError, Request, Unchain
from typhoon.reconfig.steps import migration_step, stepwise_allowed, stepwise_rounds
from typhoon.reconfig.swap_in_place import plan_swap_in_place
from typhoon.reconfig.unchain import plan_unchain
from typhoon.topology.keygroups import (
    KEY_ROUTED,
    key_group,
    max_parallelism,
    owners,
    rebalance,
    table_of,
)
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment
from typhoon.topology.routing import receivers_of, routes_for, upstream_of
from typhoon.topology.scheduler import reschedule

__all__ = ["ACTIONS", "Plan", "Step", "plan"]


def _flat(d: dict[int, list[int]]) -> set[int]:
    return {w for ws in d.values() for w in ws}


def _route_key(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "version"}


def _generations(
    physical: PhysicalTopology, workers: list[WorkerAssignment]
) -> dict[int, tuple[int, int | None]]:
    """``worker_generations`` across an update after a region failover: a worker kept stays
    in its region's generation; one added joins its node's region (every worker of a node
    is in one), empty (no restore epoch).  Without the table every worker would seem
    behind the newest generation and the core would roll the other regions back to the
    start (``typhoon.checkpoint.regions``)."""
    old = physical.worker_generations
    if not old:
        return {}
    of_node = {w.node: old[w.worker_id][0] for w in physical.workers if w.worker_id in old}
    return {
        w.worker_id: old[w.worker_id]
        if w.worker_id in old
        else (of_node.get(w.node, physical.generation), None)
        for w in workers
    }


def plan(
    request: Request,
    topology: Topology,
    physical: PhysicalTopology,
    hosts: list[str],
    first_port: int,
    avoid: set[tuple[str, int]] | frozenset = frozenset(),
    exited: set[int] | frozenset = frozenset(),
    allow_imports: bool = False,
    min_id: int = 1,
) -> Plan:
    """Every step of the stable update of ``request`` (package docstring).

    ``avoid``: (host, port) pairs other applications hold.  ``exited``: workers
    whose process already ended (a finished source, say); they get no control
    tuples, and new workers do not wait for them.  ``min_id``: the lowest
    worker ID the application never used.
    """
    if physical.draining():
        raise ReconfigError(
            f"'{topology.name}' still has draining workers from an earlier update", 409
        )
    if isinstance(request, (Unchain, Chain)):  # processes stay: typhoon.reconfig.unchain
        return plan_unchain(request, topology, physical, exited)
    in_place = plan_swap_in_place(request, topology, physical, exited, allow_imports)
    if in_place is not None:  # the node's workers swap their operator in their process
        return in_place
    original, prelude = physical, []
    first = unchain_first(request, topology, physical, exited)
    if first is not None:  # a route or insert on a chained edge: unchain it first
        physical, prelude = first
    moving, move = None, None
    if isinstance(request, Move):  # typhoon.reconfig.move
        moving = check_move(request, topology, physical, hosts, exited)
        move = {moving.worker_id: request.host}
    new_topo, replace = apply_request(topology, request)
    new_topo = check_topology(new_topo, topology, allow_imports)
    try:
        placed = reschedule(
            new_topo,
            physical,
            hosts,
            first_port,
            replace=replace,
            avoid=avoid,
            min_id=min_id,
            move=move,
        )
    except ValueError as e:
        raise ReconfigError(f"cannot place the workers: {e}", 409) from None
    placed.kept_chains = [list(g) for g in physical.kept_chains]
    placed.unchained = list(physical.unchained)
    # every running worker stays in its process: none forms from running workers
    placed.kept_chains = pin_processes((topology, physical), (new_topo, placed))
    check_groups((topology, physical), (new_topo, placed))
    kept = {w.worker_id for w in placed.workers}
    old_ids = {w.worker_id for w in physical.workers}
    draining = [
        WorkerAssignment(w.worker_id, w.node, w.index, w.host, w.port, "draining")
        for w in physical.workers
        if w.worker_id not in kept
    ]
    trans = PhysicalTopology(
        physical.name,
        physical.app_id,
        sorted(placed.workers + draining, key=lambda w: w.worker_id),
        physical.version + 1,
        physical.generation,  # under a guarantee, workers it adds start empty in it
        key_groups=dict(placed.key_groups),
        worker_generations=_generations(physical, placed.workers + draining),
        unchained=list(physical.unchained),  # chain processes stay (check_groups)
        kept_chains=[list(g) for g in placed.kept_chains],
    )
    final = PhysicalTopology(
        physical.name,
        physical.app_id,
        placed.workers,
        trans.version + 1,
        physical.generation,
        key_groups=trans.key_groups,
        worker_generations=_generations(physical, placed.workers),
        unchained=[w for w in physical.unchained if w in {x.worker_id for x in placed.workers}],
        kept_chains=kept_after(placed, {w.worker_id for w in placed.workers}),
    )
    migrating = _key_groups(topology, physical, new_topo, trans, set(replace))
    if moving is not None:  # the operator's own state travels too
        add_worker_move(migrating, moving, trans)
    added = sorted(kept - old_ids)
    removed = [w.worker_id for w in draining]
    _check_engine_nodes(topology, new_topo, draining)
    _check_keyed_inputs(topology, new_topo, set(replace))
    staying = sorted(kept & old_ids)
    live = [w for w in staying if w not in exited]
    old, new = (topology, physical), (new_topo, trans)

    steps = [
        Step("keep_rules", "keep the current rules while the update runs"),
        *prelude,
        Step("write", f"write the new topology and physical version {trans.version}", added),
    ]
    if added:
        steps.append(Step("wait_attached", "agents launch and attach the new workers", added))
    steps.append(Step("wait_rules", "the controller installs the new rules"))
    steps += _upstream_steps(old, new, added, live, set(exited))
    routing, release, remapped = _routes(old, new, live)
    steps += _switch_steps(
        old, new, routing, remapped, staying, set(exited), migrating, trans.version
    )
    steps.append(Step("commit", "commit: from here on the update only goes forward"))
    if release:
        what = "ROUTING with release: senders end the streams of the receivers they dropped"
        steps.append(_control(what, "ROUTING", release))
    to_drain = [w for w in removed if w not in exited]
    if to_drain:
        steps.append(Step("drain", "DRAIN: removed workers finish what they hold", to_drain))
    if removed:
        steps.append(Step("write_final", f"write physical version {final.version} without them"))
        steps.append(Step("wait_stopped", "agents stop the drained workers", removed))
    steps.append(Step("drop_rules", "remove the rules nothing uses any more"))
    steps.append(Step("wait_rules", "every switch holds exactly the new rules"))
    return Plan(request, topology, original, new_topo, trans, final, added, removed, steps)


def _check_engine_nodes(old: Topology, new: Topology, draining: list[WorkerAssignment]) -> None:
    """Spark nodes can only be scaled up (409 otherwise, with the reason).

    A running Spark query reads every worker's offset log and hands its output
    to the workers the node started with: a worker cannot leave (its log, and
    the outbox parts it owns, would be orphaned), and the engine service runs
    one fixed function per node, so a spark node cannot be inserted, removed
    or swapped while the application runs.
    """
    for name in sorted(set(old.nodes) | set(new.nodes)):
        a, b = old.nodes.get(name), new.nodes.get(name)
        engine = (a or b).engine  # type: ignore[union-attr]
        if (a is None or a.engine == "python") and (b is None or b.engine == "python"):
            continue
        if (
            a is None
            or b is None
            or (a.engine, a.operator, a.args) != (b.engine, b.operator, b.args)
        ):
            what = "inserted" if a is None else "removed" if b is None else "swapped"
            raise ReconfigError(
                f"{engine} node '{name}' cannot be {what} while the application runs: its "
                "engine service runs a fixed query per node; only scaling it up is supported",
                409,
            )
    guarantee = guarantee_of(old)
    for name, a in old.nodes.items():
        b = new.nodes.get(name)
        if a.engine != "python" and b is not None and b.parallelism != a.parallelism:
            if guarantee != "none":
                raise ReconfigError(
                    f"{a.engine} node '{name}' cannot be scaled under guarantee '{guarantee}': "
                    "a worker added now has no offset log in the global checkpoints its "
                    "Spark query is rewound to, so a recovery could not replay its input",
                    409,
                )
    shrinking = sorted({w.node for w in draining if old.nodes[w.node].engine != "python"})
    if shrinking:
        raise ReconfigError(
            f"spark node '{shrinking[0]}' cannot lose workers: each worker's offset log and the "
            "output it routes belong to the running Spark query; only scaling it up is supported",
            409,
        )


def _check_keyed_inputs(old: Topology, new: Topology, replace: set[str]) -> None:
    """A running keyed node keeps its key: its input stays routed by the same fields (409)."""
    for name, a in old.nodes.items():
        b = new.nodes.get(name)
        if b is None or name in replace or not a.keyed:
            continue
        before = [(s.src, s.grouping.fields) for s in old.inputs_of(name)]
        after = [(s.src, s.grouping.fields) for s in new.inputs_of(name)]
        if not b.keyed or sorted(before) != sorted(after):
            raise ReconfigError(
                f"'{name}' keeps keyed state ({a.operator}) by its input's key fields, so its "
                "input cannot change its key fields or stop being key-routed while it runs; "
                "kill and submit the application again",
                409,
            )


def _upstream_steps(old, new, added: list[int], live: list[int], exited: set[int]) -> list[Step]:
    """UPSTREAM: new workers forget finished senders; staying ones learn new senders."""
    steps = []
    gone = [
        (w, {"add": [], "remove": sorted(_flat(upstream_of(*new, w)) & exited)})
        for w in added
        if _flat(upstream_of(*new, w)) & exited
    ]
    if gone:
        steps.append(_control("new workers stop waiting for finished senders", "UPSTREAM", gone))
    learn = []
    for w in live:
        add = sorted(_flat(upstream_of(*new, w)) - _flat(upstream_of(*old, w)) - exited)
        if add:
            learn.append((w, {"add": add, "remove": []}))
    if learn:
        what = "staying workers learn their new senders (UPSTREAM)"
        steps.append(_control(what, "UPSTREAM", learn))
    return steps


def _routes(old, new, live: list[int]) -> tuple[Bodies, Bodies, set[str]]:
    """(ROUTING bodies, ROUTING-with-release bodies, receiving nodes whose input remaps)."""
    (old_t, _), (new_t, _) = old, new
    routing: Bodies = []
    release: Bodies = []
    remapped: set[str] = set()
    streams = {s.id: s.dst for s in old_t.streams} | {s.id: s.dst for s in new_t.streams}
    for w in live:
        before = {r.stream: _route_key(r.to_body()) for r in routes_for(*old, w)}
        after = {r.stream: _route_key(r.to_body()) for r in routes_for(*new, w)}
        for sid, body in before.items():
            if sid not in after:  # the stream is gone: route it nowhere
                after[sid] = {**body, "next_hops": [], "local": [], "table": {}}
        changed = [b for sid, b in sorted(after.items()) if b != before.get(sid)]
        for body in changed:
            routing.append((w, body))
            remapped.add(streams[body["stream"]])
            remapped.update(s.dst for s in old_t.streams if s.id == body["stream"])
        dropped = sorted(receivers_of(*old, w) - receivers_of(*new, w))
        if dropped:
            last = changed[-1] if changed else next(iter(after.values()))
            release.append((w, {**last, "release": dropped}))
    return routing, release, remapped


# node -> {"groups": {g: (a, b)}, "keys": {k: (a, b)}, "pins": {worker: {k: routed there}}}
Moving = dict[str, dict[str, dict]]


def _key_groups(
    old_t: Topology, old_p: PhysicalTopology, new_t: Topology, trans: PhysicalTopology, replace
) -> Moving:
    """New key-group tables of the key-routed nodes whose workers change (written into
    ``trans``, which ``final`` shares), and what moves with keyed state: per node, the
    groups and the keys a direct table pins whose owner changes (worker IDs)."""
    migrating: Moving = {}
    for name, node in new_t.nodes.items():
        ins = new_t.inputs_of(name)
        if name not in old_t.nodes or not ins:
            continue
        if any(s.grouping.type not in KEY_ROUTED for s in ins):
            continue
        before = old_p.active_of_node(name)
        after = trans.active_of_node(name)
        old_table = table_of(old_t, old_p, name)
        if len(old_table) != max_parallelism(new_t, name):
            continue  # a new max_parallelism: no group keeps its meaning
        new_table = rebalance(old_table, len(after))
        trans.key_groups[name] = new_table
        if not node.keyed or name in replace or not old_t.nodes[name].keyed:
            continue
        old_ids = {w.index: w.worker_id for w in before}
        new_ids = {w.index: w.worker_id for w in after}
        # by worker ID: a moved worker keeps its index (and groups) under a new ID
        groups = {
            g: (old_ids[a], new_ids[b])
            for g, (a, b) in enumerate(zip(old_table, new_table, strict=True))
            if a in old_ids and b in new_ids and old_ids[a] != new_ids[b]
        }
        named_before = {k for s in old_t.inputs_of(name) for k in s.grouping.table}
        named = {k for s in ins for k in s.grouping.table}
        keys = {}
        for k in sorted(named_before | named):
            a, b = _key_owner(old_t, old_p, name, k), _key_owner(new_t, trans, name, k)
            if a is not None and b is not None and a != b:
                keys[k] = (a, b)
        if groups or keys or named != named_before:
            # every worker learns which keys the new tables name, and whether for it: a
            # named key stays where its table sends it when its group moves later
            owner = {k: _key_owner(new_t, trans, name, k) for k in sorted(named)}
            ids = sorted({w.worker_id for w in before + after})
            pins = {w: {k: o == w for k, o in owner.items()} for w in ids}
            migrating[name] = {"groups": groups, "keys": keys, "pins": pins}
    return migrating


def _key_owner(topo: Topology, phys: PhysicalTopology, node: str, key: str) -> int | None:
    """The worker a key (as a direct table spells it) goes to: its table entry, else its
    key group's owner (hashed as that string: exact for string keys)."""
    active = phys.active_of_node(node)
    for s in topo.inputs_of(node):
        index = s.grouping.table.get(key)
        if index is not None and 0 <= index < len(active):
            return active[index].worker_id
    table = owners(topo, phys, node)
    owner = table[key_group([key], len(table))] if table else -1
    return owner if owner > 0 else None


def _migration_steps(
    old, migrating: Moving, exited: set[int], mid: int
) -> tuple[Step | None, Step | None]:
    """KEYGROUPS prepare (before the ROUTING) and finish (after it) of what moves."""
    bodies: dict[int, dict] = {}

    def body(w: int) -> dict:
        return bodies.setdefault(
            w, {"out": {}, "in": {}, "keys_out": {}, "keys_in": {}, "pins": {}}
        )

    for moved in migrating.values():
        for w, pins in moved.get("pins", {}).items():
            body(w)["pins"] = pins
        for g, (a, b) in moved["groups"].items():
            body(a)["out"][str(g)] = b
            body(b)["in"][str(g)] = a
        for k, (a, b) in moved["keys"].items():
            body(a)["keys_out"][k] = b
            body(b)["keys_in"][k] = a
        if "worker" in moved:  # a move: all of a's state (operator too) goes to b
            a, b = moved["worker"]
            body(a)["operator_out"], body(b)["operator_in"] = b, a
    if not bodies:
        return None, None
    prepare = []
    for w, body in sorted(bodies.items()):
        expect = []
        if body["out"] or body["keys_out"] or "operator_out" in body:
            expect = [
                [s, sid] for sid, ss in upstream_of(*old, w).items() for s in ss if s not in exited
            ]
        prepare.append((w, {"migration": mid, "phase": "prepare", **body, "expect": expect}))
    nodes = ", ".join(sorted(migrating))
    n = sum(len(m["groups"]) for m in migrating.values())
    k = sum(len(m["keys"]) for m in migrating.values())
    whole = [m["worker"] for m in migrating.values() if "worker" in m]
    also = "".join(f" with worker {a}'s operator state (to {b})" for a, b in whole)
    return (
        _control(
            f"KEYGROUPS: {n} key groups and {k} pinned keys of {nodes}{also} prepare to move "
            "(new owners hold their tuples)",
            "KEYGROUPS",
            prepare,
        ),
        _control(
            "KEYGROUPS: the moving groups' keyed state reaches its new owners",
            "KEYGROUPS",
            [(w, {"migration": mid, "phase": "finish"}) for w in sorted(bodies)],
        ),
    )


def _switch_steps(
    old,
    new,
    routing: Bodies,
    remapped: set[str],
    staying: list[int],
    exited: set[int],
    migrating: Moving | None = None,
    mid: int = 0,
) -> list[Step]:
    """ROUTING, with keyed state moving around it and a SIGNAL flush of stateful
    receivers (``stateful: true``) before and after it."""
    if not routing:
        return []
    (old_t, old_p), (new_t, _) = old, new
    migrating = migrating or {}
    rounds: list[Step] = []
    moving_streams = {s.id for s in new_t.streams if s.dst in migrating}
    if stepwise_allowed(new_t, migrating):  # Megaphone: a few groups per round (reconfig.steps)
        ((node, moving),) = migrating.items()
        step = migration_step(new_t, node)
        rounds, moving = stepwise_rounds(
            old, node, moving, routing, moving_streams, step, mid,
            lambda m, i: _migration_steps(old, m, exited, i),
            lambda what, bodies: _control(what, "ROUTING", bodies),
        )  # fmt: skip
        migrating = {node: moving}
    prepare, finish = _migration_steps(old, migrating, exited, mid)
    if migrating:
        routing = [
            (w, {**b, "handoff": mid}) if b["stream"] in moving_streams else (w, b)
            for w, b in routing
        ]

    # the Listing-2 flush only for nodes that ask for it (stateful: true); keyed state
    # needs none, it moves
    stateful = sorted(
        n
        for n in remapped
        if (n in new_t.nodes and new_t.nodes[n].stateful)
        or (n in old_t.nodes and old_t.nodes[n].stateful)
    )
    flush = [w.worker_id for n in stateful for w in old_p.of_node(n) if w.worker_id not in exited]
    steps = []
    if flush:
        what = f"SIGNAL: stateful {', '.join(stateful)} flush their cache before the remap"
        steps.append(_control(what, "SIGNAL", [(w, {}) for w in flush]))
    steps += rounds
    if prepare is not None:
        steps.append(prepare)
    steps.append(_control("ROUTING: senders switch to the new routes", "ROUTING", routing))
    if finish is not None:
        steps.append(finish)
    after = [w for w in flush if w in staying]
    if after:
        what = "SIGNAL: flush what arrived under the old key mapping"
        steps.append(_control(what, "SIGNAL", [(w, {}) for w in after]))
    return steps
