"""Reconciliation: touch nothing that is right, fix what is wrong, leave others' rules alone."""

import pytest
from fakeflows import line_cluster
from hypothesis import given
from hypothesis import strategies as st

from controller.rules.cookies import RuleKind, make_cookie
from controller.rules.flows import RuleSpec, compile_default_rules, compile_rules, match, output
from controller.rules.reconcile import Plan, diff
from typhoon.topology.loader import load_topology_text
from typhoon.topology.scheduler import schedule

APP = 3
FOREIGN = 0x00C0FFEE


def rule(in_port: int, out: int, cookie: int | None = None, priority: int = 100) -> RuleSpec:
    cookie = make_cookie(APP, RuleKind.LOCAL, in_port, out) if cookie is None else cookie
    return RuleSpec(priority, match(in_port=in_port, eth_type=0x88B5), (output(out),), cookie)


A, B, C = rule(1, 2), rule(2, 1), rule(3, 1)


def test_nothing_to_do_when_equal():
    plan = diff(frozenset({A, B}), [B, A])
    assert plan == Plan() and not plan and len(plan) == 0


def test_missing_rules_are_added():
    assert diff(frozenset({A, B}), [A]) == Plan(add=(B,))


def test_stale_rules_are_deleted():
    assert diff(frozenset({A}), [A, B, C]) == Plan(delete=(B, C))


def test_changed_action_is_a_modify():
    changed = RuleSpec(A.priority, A.match, (output(9),), A.cookie)
    assert diff(frozenset({changed}), [A, B]) == Plan(modify=(changed,), delete=(B,))


def test_changed_cookie_is_an_add_that_replaces():
    # OpenFlow 1.3 MODIFY keeps the old cookie; ADD of the same key replaces the entry
    recooked = RuleSpec(A.priority, A.match, A.actions, make_cookie(APP, RuleKind.TRANSIT, 1, 2))
    assert diff(frozenset({recooked}), [A]) == Plan(add=(recooked,))


def test_foreign_rules_are_untouched():
    foreign = rule(7, 8, cookie=FOREIGN)
    assert diff(frozenset({A}), [A, foreign]) == Plan()
    assert diff(frozenset(), [foreign]) == Plan()


def test_foreign_rule_on_our_key_is_replaced():
    squatter = RuleSpec(A.priority, A.match, (), FOREIGN)
    assert diff(frozenset({A}), [squatter]) == Plan(add=(A,))


def test_priority_and_table_are_part_of_the_key():
    low = RuleSpec(50, A.match, A.actions, A.cookie)
    other_table = RuleSpec(A.priority, A.match, A.actions, A.cookie, table_id=1)
    assert diff(frozenset({A}), [low, other_table]) == Plan(add=(A,), delete=(low, other_table))


def test_ownership_can_be_narrowed_to_one_app():
    other_app = rule(5, 6, cookie=make_cookie(APP + 1, RuleKind.LOCAL, 5, 6))
    plan = diff(frozenset(), [A, other_app], owned=lambda c: c == A.cookie)
    assert plan == Plan(delete=(A,))


def test_two_desired_rules_for_one_entry_are_a_bug():
    with pytest.raises(ValueError, match="two desired rules"):
        diff([A, RuleSpec(A.priority, A.match, (output(9),), A.cookie)], [])


def test_plans_are_sorted_deterministically():
    masked = RuleSpec(100, (("eth_dst", ("03:00:00:00:00:00", "01:00:00:00:00:00")),), (), 1)
    plain = RuleSpec(100, (("eth_dst", "02:00:00:00:00:01"),), (), 1)
    assert diff([masked, plain], []).add == diff([plain, masked], []).add


@given(
    want=st.sets(st.sampled_from([A, B, C, rule(4, 5), rule(5, 4, priority=10)])),
    have=st.sets(st.sampled_from([A, B, rule(4, 9), rule(6, 6, cookie=FOREIGN), rule(3, 2)])),
)
def test_applying_the_plan_gives_the_desired_table(want, have):
    """Apply the plan the way a switch would; our part of the table must equal `want`."""
    plan = diff(frozenset(want), have)
    table = {r.key: r for r in have}
    for r in plan.delete:
        del table[r.key]
    for r in plan.modify:
        table[r.key] = RuleSpec(r.priority, r.match, r.actions, table[r.key].cookie, r.table_id)
    for r in plan.add:
        table[r.key] = r
    ours = {r for r in table.values() if r.cookie != FOREIGN}
    assert ours == want
    assert diff(frozenset(want), table.values()) == Plan()
    assert not (set(plan.add) | set(plan.modify)) & have  # right rules are not touched


def test_a_restarted_controller_changes_only_what_moved():
    text = """
name: wc
spouts:
  - {id: source, operator: sentence_source}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: count, operator: count_by_key, parallelism: 4}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: count, grouping: {type: fields, fields: [word]}}
"""
    topology = load_topology_text(text)
    cluster = line_cluster(3)
    before = compile_rules(topology, schedule(topology, ["h1", "h2", "h3"], APP, 100), cluster)
    topology.nodes["count"].parallelism = 5
    after = compile_rules(topology, schedule(topology, ["h1", "h2", "h3"], APP, 100), cluster)
    for host in cluster.hosts:
        installed = before[host] | compile_default_rules() | {rule(99, 98, cookie=FOREIGN)}
        plan = diff(after[host] | compile_default_rules(), installed)
        assert set(plan.add) == after[host] - before[host]
        assert set(plan.delete) == before[host] - after[host]
        assert plan.modify == ()
        assert diff(after[host] | compile_default_rules(), installed) == plan
