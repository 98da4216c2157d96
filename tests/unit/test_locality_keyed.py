"""A locality move of keyed nodes: the router's tables, the plan's moves, the senders'
routing and the keyed state's ownership agree key by key (docs/keyed_state.md).

A ``direct`` table names keys; keyed state is owned per key group, with the
keys a table names pinned on top (``KeyedStates.pinned``).  So a locality
reroute moves exactly the named keys whose worker changes, each with its
state, and a key the table does not name stays with its key group's owner.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.locality.router import compute_plan, find_chain, reroutes, routed_index
from typhoon.reconfig import plan
from typhoon.runtime.keyed_state import KeyNotOwned, keyed_states
from typhoon.runtime.policies import Router
from typhoon.topology import load_topology, schedule
from typhoon.topology.keygroups import table_of
from typhoon.topology.routing import routes_for

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["h1", "h2", "h3"]
WORDS = [f"w{i}" for i in range(300)]


def app():
    t = load_topology(ROOT / "topologies" / "running_max.yaml")
    t.config.update(placement="spread", locality={"pairs": 1000, "sample": 5})
    t.nodes["count"].parallelism = 3
    t.nodes["max"].parallelism = 3
    return t, schedule(t, HOSTS, 7)


def owner_of(topo, phys, node: str, key: str) -> int:
    """The one worker of ``node`` whose keyed state accepts ``key`` (fails if not one)."""
    accept = []
    for w in phys.active_of_node(node):
        try:
            keyed_states(topo, phys, w.worker_id).check(key)
        except KeyNotOwned:
            continue
        accept.append(w.worker_id)
    assert len(accept) == 1, (node, key, accept)
    return accept[0]


def routed(topo, phys, node: str, key: str) -> set[int]:
    """Where every sender into ``node`` routes ``key``."""
    ins = {s.id for s in topo.inputs_of(node)}
    src = topo.inputs_of(node)[0].src
    return {
        Router(r).select([key])
        for w in phys.active_of_node(src)
        for r in routes_for(topo, phys, w.worker_id)
        if r.stream in ins
    }


def predicted(topo, phys, node: str, key: str) -> int:
    """The router's own idea of where ``key`` goes (``routed_index``), as a worker ID."""
    (s,) = topo.inputs_of(node)
    active = phys.active_of_node(node)
    return active[routed_index(s.grouping, key, len(active), table_of(topo, phys, node))].worker_id


def check_agreement(topo, phys) -> None:
    for node in ("count", "max"):
        for k in WORDS:
            owner = owner_of(topo, phys, node, k)
            assert routed(topo, phys, node, k) == {owner}, (node, k)
            assert predicted(topo, phys, node, k) == owner, (node, k)


@pytest.mark.parametrize("shift", [0, 1])
def test_locality_reroutes_move_exactly_the_named_keys_whose_worker_changes(shift):
    topo, phys = app()
    check_agreement(topo, phys)
    chain = find_chain(topo)
    assert (chain.node, chain.stream_out.dst) == ("count", "max")
    # the running count's pairs are (word, word); only half the words were sampled, so
    # the tables name those and the rest keep their key groups' owners
    pairs = {(k, k): 1 + (i % 7) for i, k in enumerate(WORDS) if i % 2 == shift}
    lp = compute_plan(topo, phys, chain, pairs, 1.03)
    updates = reroutes(chain, lp)
    assert [u.stream for u in updates] == [chain.stream_in.id, chain.stream_out.id]
    for update, node in zip(updates, ("count", "max"), strict=True):
        before = {k: owner_of(topo, phys, node, k) for k in WORDS}
        p = plan(update, topo, phys, HOSTS, 7000)
        assert not any(s.control == "SIGNAL" for s in p.steps)  # state moves, no flush
        controls = [s.control for s in p.steps if s.control in ("KEYGROUPS", "ROUTING")]
        assert controls == ["KEYGROUPS", "ROUTING", "KEYGROUPS"]
        prepare = next(s for s in p.steps if s.control == "KEYGROUPS")
        outs = {k: (w, dst) for w, b in prepare.bodies for k, dst in b["keys_out"].items()}
        ins = {k: (src, w) for w, b in prepare.bodies for k, src in b["keys_in"].items()}
        assert all(not b["out"] and not b["in"] for _, b in prepare.bodies)  # no group moves
        topo, phys = p.topology, p.final
        after = {k: owner_of(topo, phys, node, k) for k in WORDS}
        want = {k: (before[k], after[k]) for k in WORDS if before[k] != after[k]}
        assert want, "the plan moves some keys"
        assert outs == ins == want
        assert set(want) <= set(dict(update.table))  # only keys the table names move
        check_agreement(topo, phys)


def test_metric_req_keys_reports_pinned_keys_apart_from_their_groups():
    """After a locality move a worker holds keys of groups it does not own (a table pins
    them here): METRIC_REQ ``keys`` lists them in ``held_pinned``, not ``held_groups``."""
    from typhoon.runtime.keyed_state import KeyedStates

    ks = KeyedStates("op", "count", 5, [0], 64, set(range(32)))
    foreign = next(k for k in WORDS if ks.group_of(k) >= 32)
    home = next(k for k in WORDS if ks.group_of(k) < 32)
    plain = next(k for k in WORDS if ks.group_of(k) < 32 and k != home)
    ks.pinned.update({foreign: True, home: False})
    counts = ks.state("counts", 0)
    counts[foreign] = 3
    counts[plain] = 1
    with pytest.raises(KeyNotOwned, match="direct grouping's table sends to another worker"):
        counts[home] = 1
    ks.stores["counts"].data[home] = 2  # misplaced, as a missing move would leave it
    assert ks.held_groups() == {ks.group_of(plain): 1}
    assert ks.held_pinned() == {foreign: 1, home: 0}
