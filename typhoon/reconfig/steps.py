"""Stepwise key-group migration (Megaphone, VLDB 2019): a rescale moves its key groups in
rounds of a few, so that only the current round's keys wait for their state.

Moving every group at once makes every moving key wait for one blob per old -> new
owner pair (pack, write, load: tens of ms for 10 MB, hundreds for 200 MB), and an
old owner packs all its leaving state in one go, stalling its other keys too.  In
rounds, each round is the whole protocol of ``typhoon.runtime.migration``
(``KEYGROUPS prepare``, ``ROUTING`` with ``handoff`` to an *intermediate* table,
``KEYGROUPS finish``) for ``step`` groups, so each round is exact on its own: it
moves the key groups of a valid table to another valid table.  The last round
installs the plan's final routes.  Pure logic, used by ``typhoon.reconfig.plan``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typhoon.checkpoint.settings import guarantee_of
from typhoon.topology.config import DEFAULTS
from typhoon.topology.keygroups import round_id
from typhoon.topology.routing import routes_for

DEFAULT_MIGRATION_STEP = DEFAULTS.migration_step  # docs/keyed_state.md, "Stepwise migration"

Moved = dict[int, tuple[int, int]]  # group -> (old owner, new owner), worker IDs


def migration_step(topology: Any, node: str) -> int:
    """Key groups per round for ``node``: its ``config.migration_step``, else the
    topology's, else the default; 0 moves every group at once."""
    n = topology.nodes[node]
    value = (getattr(n, "config", None) or {}).get("migration_step")
    if value is None:
        value = (topology.config or {}).get("migration_step", DEFAULT_MIGRATION_STEP)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"migration_step of '{node}' must be an integer >= 0, not {value!r}")
    return value


def stepwise_allowed(topology: Any, migrating: dict[str, dict[str, Any]]) -> bool:
    """Rounds only for one node's key groups with no named key, no whole worker and no
    guarantee (a checkpoint between rounds would see a newcomer owning groups whose
    state is still elsewhere: docs/keyed_state.md, "Stepwise migration")."""
    if len(migrating) != 1 or guarantee_of(topology) != "none":
        return False
    (moving,) = migrating.values()
    named = any(moving.get("pins", {}).values())
    return not moving["keys"] and "worker" not in moving and not named


def split_groups(groups: Moved, step: int) -> list[Moved]:
    """The rounds of a migration: ``step`` groups each (0: one round), taken round-robin
    over the (old, new) owner pairs so that each round asks every old owner for a small
    part of its leaving state instead of one owner for all of it."""
    if not groups:
        return []
    if step <= 0 or step >= len(groups):
        return [dict(groups)]
    by_pair: dict[tuple[int, int], list[int]] = {}
    for g in sorted(groups):
        by_pair.setdefault(groups[g], []).append(g)
    order: list[int] = []
    queues = [list(gs) for _, gs in sorted(by_pair.items())]
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    return [{g: groups[g] for g in order[i : i + step]} for i in range(0, len(order), step)]


def table_after(before: list[int], moved: Moved) -> list[int]:
    """A worker-ID key-group table with ``moved`` applied."""
    table = list(before)
    for g, (_, b) in moved.items():
        table[g] = b
    return table


def round_body(before: dict[str, Any], after: dict[str, Any], table: list[int]) -> dict[str, Any]:
    """A sender's ROUTING body for an intermediate table: the final route's settings, the
    receivers of the old route and the new one (leaving workers still own groups, new
    ones already do), and ``table``."""
    hops = sorted(set(before.get("next_hops", [])) | set(after.get("next_hops", [])))
    local = sorted(set(before.get("local", [])) | set(after.get("local", [])))
    return {**after, "next_hops": hops, "local": local, "groups": table}


def stepwise_rounds(
    old: tuple[Any, Any],
    node: str,
    moving: dict[str, Any],
    routing: list[tuple[int, dict[str, Any]]],
    moving_streams: set[int],
    step: int,
    version: int,
    keygroup_steps: Callable[[dict[str, Any], int], tuple[Any, Any]],
    routing_step: Callable[[str, list[tuple[int, dict[str, Any]]]], Any],
) -> tuple[list[Any], dict[str, Any]]:
    """Every round but the last as plan steps, and what the last round moves.

    ``moving`` is ``node``'s entry of the plan's migration (groups only: a plan that
    moves named keys or a whole worker keeps one round).  ``routing`` holds the plan's
    final ROUTING bodies; ``keygroup_steps(migrating, id)`` builds a round's KEYGROUPS
    prepare and finish, ``routing_step(what, bodies)`` its ROUTING step."""
    rounds = split_groups(moving["groups"], step)
    if len(rounds) <= 1:
        return [], moving
    before = {
        (w, r.stream): r.to_body() for w in {w for w, _ in routing} for r in routes_for(*old, w)
    }
    ours = [(w, b) for w, b in routing if b["stream"] in moving_streams]
    size = len(moving["groups"]) and 1 + max(moving["groups"])
    if any(len(before.get((w, b["stream"]), {}).get("groups", [])) < size for w, b in ours):
        return [], moving  # a sender without an old key-group table: one round
    steps: list[Any] = []
    done: Moved = {}
    for i, part in enumerate(rounds[:-1]):
        done.update(part)
        mid = round_id(version, i)
        bodies = []
        for w, after in ours:
            old_body = before[(w, after["stream"])]
            table = table_after(old_body.get("groups", []), done)
            bodies.append((w, {**round_body(old_body, after, table), "handoff": mid}))
        prepare, finish = keygroup_steps({node: {"groups": part, "keys": {}}}, mid)
        what = f"ROUTING: round {i + 1} of {len(rounds)}, senders move {len(part)} key groups"
        steps += [prepare, routing_step(what, bodies), finish]
    return steps, {**moving, "groups": rounds[-1]}
