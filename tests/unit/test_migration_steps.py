"""Stepwise key-group migration (typhoon/reconfig/steps.py): the rounds a rescale plans.

Pure logic; the model check in tests/unit/test_keyed_migration.py runs these rounds
through the real worker layers and checks the counts stay exact.
"""

from __future__ import annotations

import pytest

from typhoon.reconfig import Scale, plan
from typhoon.reconfig.steps import (
    DEFAULT_MIGRATION_STEP,
    migration_step,
    split_groups,
    table_after,
)
from typhoon.topology import TopologyError, load_topology_text, schedule
from typhoon.topology.keygroups import is_round, round_id, update_of

HOSTS = ["h1", "h2", "h3"]

JOB = """
name: steps
{top}spouts:
  - id: source
    operator: sentence_source
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: count
    operator: running_count
    parallelism: 4
    config: {{max_parallelism: 64{step}}}
streams:
  - {{from: source, to: split, grouping: shuffle}}
  - {{from: split, to: count, grouping: {{type: fields, fields: [word]}}}}
"""


def job(step: int | None = None, top: str = ""):
    text = JOB.format(step="" if step is None else f", migration_step: {step}", top=top)
    t = load_topology_text(text)
    return t, schedule(t, HOSTS, 7, first_port=100)


def moves(pairs: dict[tuple[int, int], list[int]]) -> dict[int, tuple[int, int]]:
    return {g: pair for pair, gs in pairs.items() for g in gs}


def test_split_takes_step_groups_per_round_round_robin_over_the_owner_pairs():
    groups = moves({(1, 5): [0, 1, 2, 3], (2, 6): [8, 9, 10, 11], (3, 7): [16, 17]})
    rounds = split_groups(groups, 3)
    assert [len(r) for r in rounds] == [3, 3, 3, 1]
    # every group exactly once, with its own pair
    assert sorted(g for r in rounds for g in r) == sorted(groups)
    assert all(r[g] == groups[g] for r in rounds for g in r)
    # round-robin: the first round asks each old owner for one group, not one owner for all
    assert {a for a, _ in rounds[0].values()} == {1, 2, 3}


@pytest.mark.parametrize("step", [0, 10, 99])
def test_step_zero_or_at_least_all_groups_is_one_round(step):
    groups = moves({(1, 5): [0, 1, 2], (2, 6): [8, 9, 10, 11]})
    assert split_groups(groups, step) == [groups]
    assert split_groups({}, step) == []


def test_table_after_applies_only_the_moved_groups():
    assert table_after([1, 1, 2, 2], {1: (1, 5), 3: (2, 6)}) == [1, 5, 2, 6]


def test_round_ids_are_never_table_versions_and_name_their_update():
    ids = [round_id(12, i) for i in range(40)]
    assert len(set(ids)) == 40 and all(is_round(m) for m in ids)
    assert all(update_of(m) == 12 for m in ids) and update_of(12) == 12 and not is_round(12)
    assert round_id(13, 0) not in ids


def test_the_step_comes_from_the_node_then_the_topology_then_the_default():
    t, _ = job()
    assert migration_step(t, "count") == DEFAULT_MIGRATION_STEP
    t, _ = job(top="config: {migration_step: 2}\n")
    assert migration_step(t, "count") == 2
    t, _ = job(1, top="config: {migration_step: 2}\n")
    assert migration_step(t, "count") == 1


def test_a_negative_step_is_refused_by_the_loader():
    with pytest.raises(TopologyError, match="migration_step"):
        job(-1)


def _rounds(p):
    """(prepare, ROUTING, finish) triples of the plan, in order."""
    ctl = [s for s in p.steps if s.control in ("KEYGROUPS", "ROUTING") and s.action == "control"]
    ctl = [s for s in ctl if not any("release" in b for _, b in s.bodies)]
    assert len(ctl) % 3 == 0
    return [tuple(ctl[i : i + 3]) for i in range(0, len(ctl), 3)]


@pytest.mark.parametrize(("start", "to"), [(4, 8), (4, 2), (4, 7)])
def test_a_scale_moves_its_groups_in_rounds_of_valid_tables(start, to):
    t, phys = job(4)
    p = plan(Scale("count", to), t, phys, HOSTS, 100)
    rounds = _rounds(p)
    old_owner = dict(enumerate(_table(phys, "count")))
    final = _table(p.physical, "count")
    moving = {g for g in range(64) if old_owner[g] != final[g]}
    assert len(rounds) == -(-len(moving) // 4) > 1
    splits = {w.worker_id for w in phys.of_node("split")}
    seen: set[int] = set()
    table = [old_owner[g] for g in range(64)]
    ids = []
    for i, (prepare, routing, finish) in enumerate(rounds):
        mid = prepare.bodies[0][1]["migration"]
        ids.append(mid)
        assert all(b["migration"] == mid for _, b in prepare.bodies + finish.bodies)
        ins = {int(g): a for _, b in prepare.bodies for g, a in b["in"].items()}
        outs = {int(g): n for _, b in prepare.bodies for g, n in b["out"].items()}
        assert set(ins) == set(outs) and 0 < len(ins) <= 4 and not set(ins) & seen
        seen |= set(ins)
        for g in ins:  # each group goes straight from its old owner to its final one
            assert ins[g] == old_owner[g] and outs[g] == final[g]
            table[g] = final[g]
        # every splitter installs the table with this round applied, and hands off
        assert {w for w, _ in routing.bodies} == splits
        for _, b in routing.bodies:
            assert b["groups"] == table and b["handoff"] == mid
            assert set(b["groups"]) <= set(b["next_hops"])  # every owner is reachable
        assert is_round(mid) == (i < len(rounds) - 1)
    assert seen == moving and table == final
    assert len(set(ids)) == len(ids) and ids[-1] == p.physical.version


def _table(phys, node):
    by_index = {w.index: w.worker_id for w in phys.active_of_node(node)}
    return [by_index[i] for i in phys.key_groups.get(node) or _default(phys, node)]


def _default(phys, node):
    from typhoon.topology.keygroups import default_table

    return default_table(64, len(phys.active_of_node(node)))


@pytest.mark.parametrize(
    ("step", "top"),
    [
        (0, ""),
        (None, "config: {guarantee: exactly_once}\n"),
        (2, "config: {guarantee: at_least_once}\n"),
    ],
)
def test_all_at_once_when_asked_or_under_a_guarantee(step, top):
    t, phys = job(step, top)
    p = plan(Scale("count", 8), t, phys, HOSTS, 100)
    (only,) = _rounds(p)
    assert only[0].bodies[0][1]["migration"] == p.physical.version
    assert sum(len(b["in"]) for _, b in only[0].bodies) == 32
