# ruff: noqa: E501  (ovs-ofctl lines as printed)
"""Drop-rule counters of a run: parsed from ovs-ofctl, increases become problems."""

from __future__ import annotations

from mininet_env.drops import (
    drop_problems,
    drops_between,
    parse_drop_rules,
    split_dead_address_drops,
)

DUMP = """\
 cookie=0x7a0000000000, duration=3.1s, table=0, n_packets=12, n_bytes=384, priority=10,in_port=101 actions=drop
 cookie=0x7a0000000000, duration=3.1s, table=0, n_packets=900, n_bytes=9000, priority=20,in_port=101,dl_src=02:74:00:07:00:01 actions=output:1
 cookie=0x0, duration=9.0s, table=0, n_packets=2, n_bytes=140, priority=0 actions=drop
"""


def test_only_drop_rules_are_read():
    rules = parse_drop_rules("tys1", DUMP)
    assert rules == {
        ("tys1", "priority=10,in_port=101"): (12, 384),
        ("tys1", "priority=0"): (2, 140),
    }


def test_an_increase_is_a_problem_naming_bridge_and_rule():
    before = {("tys1", "priority=0"): (2, 140)}
    after = parse_drop_rules("tys1", DUMP)
    assert drop_problems(before, after) == [
        "switch tys1: 12 frames (384 bytes) met drop rule priority=10,in_port=101"
    ]
    assert drop_problems(after, after) == []


def test_a_rule_replaced_during_the_run_counts_from_zero():
    before = {("tys1", "priority=0"): (50, 5000)}
    after = {("tys1", "priority=0"): (3, 210)}
    assert drop_problems(before, after) == [
        "switch tys1: 3 frames (210 bytes) met drop rule priority=0"
    ]


def test_drops_at_a_dead_workers_address_go_to_its_incident():
    """The fault detector's rule for a dead address (controller/rules/dead_addresses.py) counts
    what its senders still wrote to it; every other drop stays a problem."""
    dump = (
        " cookie=0x7a0b00040000, duration=3.1s, table=0, n_packets=1033, n_bytes=39254, "
        "priority=20,dl_dst=02:4e:0d:00:00:04 actions=drop\n" + DUMP
    )
    after = parse_drop_rules("tys1", dump)
    drops = drops_between({}, after)
    by_worker, rest = split_dead_address_drops(drops, {"02:4e:0d:00:00:04": 4})
    assert by_worker == {
        4: [
            "switch tys1: 1033 frames (39254 bytes) met drop rule "
            "priority=20,dl_dst=02:4e:0d:00:00:04"
        ]
    }
    assert rest == [
        "switch tys1: 2 frames (140 bytes) met drop rule priority=0",
        "switch tys1: 12 frames (384 bytes) met drop rule priority=10,in_port=101",
    ]
    # a dead-address rule of no incident of this run explains nothing
    unowned = split_dead_address_drops(drops, {})[1]
    assert len(unowned) == 3 and any(line.endswith("00:00:04") for line in unowned)
