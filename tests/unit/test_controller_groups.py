"""Load-balancer select groups: compiled as data, checked by forwarding frames through fake
bridges that apply groups the way OVS does, and read back through Ryu's real parser."""

from __future__ import annotations

import dataclasses
import struct
from collections import Counter

import pytest
from fakeflows import FakeFabric, Packet, hash_entries, hash_table, line_cluster
from test_controller_ofp import FakeDatapath

from controller import ofp
from controller.framework.ryu_compat import ofproto_v1_3, ofproto_v1_3_parser
from controller.rules.cookies import RuleKind, parse_cookie
from controller.rules.dp_hash import dp_hash
from controller.rules.flows import compile_default_rules, compile_rules
from controller.rules.groups import (
    GROUP_MAGIC,
    HASH_ENTRIES,
    Bucket,
    GroupPlan,
    GroupSpec,
    apportion,
    balanced_streams,
    bucket_weights,
    compile_lb,
    compile_lb_all,
    diff_groups,
    lb_group_id,
    parse_group_id,
)
from controller.rules.reconcile import diff
from typhoon.topology.loader import load_topology_text
from typhoon.topology.scheduler import schedule
from typhoon.wire import LB_SLOTS, lb_mac, mac_bytes, mac_str, parse_mac, worker_mac

APP = 7
BALANCED = """
name: lb
spouts:
  - {id: source, operator: sequence_source, parallelism: 2}
bolts:
  - {id: work, operator: identity, parallelism: 3}
  - {id: sink, operator: sequence_check}
streams:
  - {from: source, to: work, grouping: sdn}
  - {from: work, to: sink, grouping: shuffle}
"""


@pytest.fixture
def app():
    topology = load_topology_text(BALANCED, "lb.yaml")
    physical = schedule(topology, ["h1", "h2", "h3"], APP, 100)
    return topology, physical, line_cluster(3)


def mac(wid: int) -> str:
    return mac_str(worker_mac(APP, wid))


def fabric(topology, physical, cluster, weights=None, down=()):
    groups, lb_rules = compile_lb(topology, physical, cluster, weights, down)
    rules = compile_rules(topology, physical, cluster)
    merged = {
        h: rules.get(h, frozenset()) | lb_rules.get(h, frozenset()) | compile_default_rules()
        for h in cluster.hosts
    }
    return FakeFabric(cluster, merged, groups), groups, lb_rules


def spread(fab, physical, sender) -> Counter:
    """Where each of the 256 slot addresses of node ``work`` (index 1) ends up."""
    got: Counter = Counter()
    for slot in range(LB_SLOTS):
        pkt = Packet(sender.port, mac(sender.worker_id), mac_str(lb_mac(APP, 1, slot)))
        trace = fab.send(sender.host, pkt)
        assert sum(trace.delivered.values()) == 1, trace
        [(where, _)] = trace.delivered.items()
        got[where] += 1
    return got


# ----------------------------------------------------------------------------- ids, weights


def test_group_ids_carry_magic_app_and_node():
    gid = lb_group_id(0x1234, 5)
    assert gid >> 24 == GROUP_MAGIC and parse_group_id(gid) == (0x1234, 5)
    assert parse_group_id(7) is None and parse_group_id(0xFFFFFF00) is None
    assert gid < ofproto_v1_3.OFPG_MAX
    with pytest.raises(ValueError):
        lb_group_id(0x10000, 0)


@pytest.mark.parametrize(
    "shares",
    [{1: 3, 2: 3, 3: 1}, {1: 1, 2: 1}, {5: 0.2, 9: 0.5, 11: 0.3}, {1: 1, 2: 0, 3: 0}, {4: 1}],
)
def test_apportion_sums_gives_everyone_one_and_follows_shares(shares):
    out = apportion(shares, 64)
    assert sum(out.values()) == 64 and min(out.values()) >= 1
    total = sum(shares.values())
    for k, s in shares.items():
        assert abs(out[k] - 64 * s / total) <= len(shares)
    assert apportion(shares, 64) == out  # deterministic


def test_bucket_weights_are_one_hash_entry_each_in_runs_per_worker():
    # 3:3:1 in 64ths is 28:27:9 (27.4, 27.4, 9.1; the remainder to the first); 64 buckets of
    # weight 1 make OVS build its full 64-entry table with entry i in bucket i
    buckets = bucket_weights({1: 3, 2: 3, 3: 1})
    assert len(buckets) == HASH_ENTRIES and {w for _, w in buckets} == {1}
    assert [wid for wid, _ in buckets] == [1] * 28 + [2] * 27 + [3] * 9
    group = GroupSpec(1, tuple(Bucket(w, (("output", wid),)) for wid, w in buckets))
    assert hash_entries(group) == list(range(HASH_ENTRIES))
    table = hash_table(group)
    assert Counter(b.actions[0][1] for b in table) == {1: 28, 2: 27, 3: 9}


def test_a_share_moving_between_neighbours_moves_only_the_entries_between_them():
    before = [wid for wid, _ in bucket_weights({1: 28, 2: 27, 3: 9})]
    after = [wid for wid, _ in bucket_weights({1: 26, 2: 29, 3: 9})]
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [26, 27]


def test_many_workers_get_plain_weights():
    buckets = bucket_weights(dict.fromkeys(range(1, 41), 1.0))
    assert len(buckets) == 40 and sum(w for _, w in buckets) == 1000


# ----------------------------------------------------------------------------- compile


def test_groups_only_where_senders_are_and_one_rule_per_sender(app):
    topology, physical, cluster = app
    [b] = balanced_streams(topology, physical)
    assert (b.node, b.node_index) == ("work", 1)
    groups, rules = compile_lb(topology, physical, cluster)
    sender_hosts = {u.host for u in b.senders}
    assert set(groups) == sender_hosts
    gid = lb_group_id(APP, 1)
    for gs in groups.values():
        [g] = gs
        assert g.group_id == gid and g.type == "select"
        assert set(g.weights()) == {mac(w.worker_id) for w in b.receivers}
    for u in b.senders:
        [rule] = [r for r in rules[u.host] if parse_cookie(r.cookie).worker == u.worker_id]
        assert rule.actions == (("group", gid),)
        c = parse_cookie(rule.cookie)
        assert (c.kind, c.aux) == (RuleKind.LB_GROUP, 1)
        assert rule.match_dict()["eth_dst"] == (mac_str(lb_mac(APP, 1, 0)), "ff:ff:ff:ff:ff:00")


def test_every_slot_reaches_a_worker_of_the_node_with_its_own_address(app):
    topology, physical, cluster = app
    fab, _, _ = fabric(topology, physical, cluster)
    receivers = {(w.host, w.port): w for w in physical.of_node("work")}
    for sender in physical.of_node("source"):
        for slot in (0, 17, 255):
            pkt = Packet(sender.port, mac(sender.worker_id), mac_str(lb_mac(APP, 1, slot)))
            trace = fab.send(sender.host, pkt)
            [where] = trace.delivered
            assert where in receivers  # local bucket or across the fabric by unicast rules
        spread(fab, physical, sender)


def test_split_follows_the_weights(app):
    topology, physical, cluster = app
    work = physical.of_node("work")
    weights = {work[0].worker_id: 3.0, work[1].worker_id: 3.0, work[2].worker_id: 1.0}
    fab, _, _ = fabric(topology, physical, cluster, weights)
    sender = physical.of_node("source")[0]
    got = spread(fab, physical, sender)
    slow = (work[2].host, work[2].port)
    # 9 of 64 table entries; which slots hash where is luck: a few points either way
    assert abs(got[slow] / LB_SLOTS - 9 / 64) < 0.06, got


def test_down_workers_leave_the_group_unless_none_is_left(app):
    topology, physical, cluster = app
    work = [w.worker_id for w in physical.of_node("work")]
    groups, _ = compile_lb(topology, physical, cluster, down={work[1]})
    for gs in groups.values():
        [g] = gs
        assert set(g.weights()) == {mac(work[0]), mac(work[2])}
    groups, _ = compile_lb(topology, physical, cluster, down=set(work))
    for gs in groups.values():
        [g] = gs
        assert len(g.weights()) == 3


def test_lb_rules_never_collide_with_compiled_rules(app):
    topology, physical, cluster = app
    _, lb_rules = compile_lb(topology, physical, cluster)
    compiled = compile_rules(topology, physical, cluster)
    for host, rules in lb_rules.items():
        keys = {r.key for r in compiled.get(host, ())}
        assert not keys & {r.key for r in rules}
        assert diff(rules | compiled.get(host, frozenset()), ()).add  # one consistent set


def test_no_sdn_stream_no_groups(app):
    _, physical, cluster = app
    plain = load_topology_text(BALANCED.replace("grouping: sdn", "grouping: shuffle"), "x.yaml")
    assert compile_lb(plain, physical, cluster) == ({}, {})


# ----------------------------------------------------------------------------- reconcile


def g(gid: int, *weights: int) -> GroupSpec:
    return GroupSpec(gid, tuple(Bucket(w, (("output", i + 1),)) for i, w in enumerate(weights)))


def test_diff_groups_adds_modifies_deletes_ours_only():
    ours, other, stale, foreign = lb_group_id(7, 1), lb_group_id(7, 2), lb_group_id(9, 1), 5
    plan = diff_groups(
        [g(ours, 1, 2), g(other, 3)],
        [g(ours, 1, 1), g(stale, 1), g(foreign, 1)],
    )
    assert plan == GroupPlan(add=(g(other, 3),), modify=(g(ours, 1, 2),), delete=(g(stale, 1),))
    assert not diff_groups([g(ours, 1)], [g(ours, 1), g(foreign, 2)])


# ----------------------------------------------------------------------------- OpenFlow


def switch_reports(mod) -> object:
    """The ofp_group_desc entry a switch would report for the group ``mod`` created."""
    buckets = bytearray()
    for b in mod.buckets:
        b.serialize(buckets, len(buckets))
    head = struct.pack(
        ofproto_v1_3.OFP_GROUP_DESC_STATS_PACK_STR, 8 + len(buckets), mod.type, mod.group_id
    )
    return ofproto_v1_3_parser.OFPGroupDescStats.parser(head + bytes(buckets), 0)


def test_group_mod_reads_back_equal(app):
    topology, physical, cluster = app
    dp = FakeDatapath()
    groups, _ = compile_lb(topology, physical, cluster, {physical.of_node("work")[0].worker_id: 5})
    for gs in groups.values():
        for spec in gs:
            mod = ofp.group_mod(dp, spec, "add")
            assert (mod.command, mod.type) == (dp.ofproto.OFPGC_ADD, dp.ofproto.OFPGT_SELECT)
            dp.set_xid(mod)
            mod.serialize()
            back = ofp.spec_from_group_desc(switch_reports(mod))
            assert back == spec
            assert not diff_groups([spec], [back])
    delete = ofp.group_mod(dp, spec, "delete")
    assert delete.command == dp.ofproto.OFPGC_DELETE and delete.buckets == []
    with pytest.raises(ValueError):
        ofp.group_mod(dp, spec, "replace")


# ----------------------------------------------------------------------------- every app at once


def test_every_balanced_app_is_merged_and_a_broken_one_is_left_out(app):
    topology, physical, cluster = app
    alone = compile_lb(topology, physical, cluster, {}, ())
    errors: list[str] = []
    broken = dataclasses.replace(physical, app_id=0x10000)  # no group id for it
    got = compile_lb_all(
        {"a": (topology, physical), "b": (topology, broken)},
        cluster,
        {},
        {},
        lambda name, e: errors.append(name),
    )
    assert got == alone and errors == ["b"]


def test_bucket_counters_become_packets_per_worker(app):
    topology, physical, cluster = app
    groups, _ = compile_lb(topology, physical, cluster)
    g = next(iter(next(iter(groups.values()))))
    counts = g.packets_per_worker(range(len(g.buckets)))
    by_mac: Counter = Counter()
    for i, b in enumerate(g.buckets):
        by_mac[b.worker_mac()] += i
    assert {mac(w): n for w, n in counts.items()} == dict(by_mac)
    with pytest.raises(ValueError):  # counters of another group shape
        g.packets_per_worker([1])


def slot_split(group: GroupSpec, senders, node_index: int = 1) -> dict[int, float]:
    """Worker id -> share of the senders' slot addresses, by OVS's hash (rules/dp_hash.py)."""
    got: Counter = Counter()
    for u in senders:
        for slot in range(LB_SLOTS):
            entry = dp_hash(worker_mac(APP, u.worker_id), lb_mac(APP, node_index, slot))
            got[parse_mac(mac_bytes(group.buckets[entry % HASH_ENTRIES].worker_mac())).value] += 1
    return {w: n / sum(got.values()) for w, n in got.items()}


@pytest.mark.parametrize("ratio", [(3, 3, 1), (1, 1, 1), (5, 2, 1), (1, 4, 2)])
def test_the_senders_slots_split_as_weighted_on_every_host(app, ratio):
    """The runs lie over the entries in the slot order of the senders on that host: each
    worker's share of their slots is within 2 points of its weight (contiguous runs over
    plain entry order: 3-4 points off on average, up to 11)."""
    topology, physical, cluster = app
    work = physical.of_node("work")
    weights = {w.worker_id: float(r) for w, r in zip(work, ratio, strict=True)}
    groups, _ = compile_lb(topology, physical, cluster, weights)
    gid = lb_group_id(APP, 1)
    senders = physical.of_node("source")
    for host, gs in groups.items():
        [group] = [g for g in gs if g.group_id == gid]
        split = slot_split(group, [u for u in senders if u.host == host])
        for wid, weight in weights.items():
            assert abs(split.get(wid, 0.0) - weight / sum(weights.values())) <= 0.02, (host, split)


def test_an_entry_order_must_be_one_of_the_64_entries():
    with pytest.raises(ValueError):
        bucket_weights({1: 1.0, 2: 1.0}, [0] * HASH_ENTRIES)
    order = list(reversed(range(HASH_ENTRIES)))
    assert [w for w, _ in bucket_weights({1: 1.0, 2: 3.0}, order)] == [2] * 48 + [1] * 16
