"""Mirror outputs, checked by forwarding frames through fake bridges (no switch)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from fakeflows import FakeFabric, Packet, mesh_cluster

from controller.rules.cookies import RuleKind, make_cookie, parse_cookie
from controller.rules.flows import (
    RuleSpec,
    compile_default_rules,
    compile_rules,
    goto_table,
    meter,
    output,
)
from controller.rules.meters import (
    METER_BASE,
    MeterSpec,
    diff_meters,
    is_typhoon_meter,
    meter_id,
    sampling_meter,
)
from controller.rules.mirror import (
    DEFAULT_RATE,
    MIRROR_TABLE,
    MirrorTap,
    apply_mirrors,
    mirror_meters,
    mirrored,
)
from typhoon.topology.loader import load_topology, load_topology_text
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment
from typhoon.topology.scheduler import schedule
from typhoon.wire import controller_mac, mac_str, multicast_mac, worker_mac

FIXTURES = Path(__file__).parent / "fixtures" / "topologies" / "good"
APP = 7
DEBUG_PORT = 65000


def mac(w: WorkerAssignment) -> str:
    return mac_str(worker_mac(APP, w.worker_id))


def compiled(topology: Topology) -> tuple[PhysicalTopology, dict[str, frozenset[RuleSpec]]]:
    cluster = mesh_cluster(3)
    physical = schedule(topology, sorted(cluster.hosts), APP, 100)
    rules = compile_rules(topology, physical, cluster)
    return physical, {h: r | compile_default_rules() for h, r in rules.items()}


def fabric_with(rules: dict[str, frozenset[RuleSpec]], *taps: tuple[str, MirrorTap]) -> FakeFabric:
    """Bridges with the mirrors of ``taps`` (host, tap), as the app applies them."""
    by_host = {h: apply_mirrors(r, [t for host, t in taps if host == h]) for h, r in rules.items()}
    return FakeFabric(mesh_cluster(3), by_host)


def tap_on(w: WorkerAssignment, direction: str, port: int = DEBUG_PORT) -> tuple[str, MirrorTap]:
    return w.host, MirrorTap(APP, w.worker_id, w.port, direction, port)


def send(fabric: FakeFabric, u: WorkerAssignment, dst: str) -> Counter:
    return fabric.send(u.host, Packet(u.port, mac(u), dst)).delivered


@pytest.fixture(scope="module")
def wordcount():
    topology = load_topology(FIXTURES / "wordcount.yaml")
    physical, rules = compiled(topology)
    return topology, physical, rules


def test_output_of_a_split_worker_is_copied_once_and_still_delivered(wordcount):
    topology, physical, rules = wordcount
    split0 = physical.of_node("split")[0]
    fabric = fabric_with(rules, tap_on(split0, "out"))
    for count in physical.of_node("count"):
        got = send(fabric, split0, mac(count))
        assert got == Counter({(count.host, count.port): 1, (split0.host, DEBUG_PORT): 1})


def test_nothing_else_is_copied(wordcount):
    topology, physical, rules = wordcount
    split0 = physical.of_node("split")[0]
    source = physical.of_node("source")[0]
    fabric = fabric_with(rules, tap_on(split0, "out"))
    plain = FakeFabric(mesh_cluster(3), rules)
    for u in physical.workers:
        for v in physical.workers:
            if u == split0 and v.node == "count":
                continue  # the observed output
            pkt = Packet(u.port, mac(u), mac(v))
            assert fabric.send(u.host, pkt).delivered == plain.send(u.host, pkt).delivered
    # split0's credits to the source and its replies to the controller are not data
    assert send(fabric, split0, mac(source)) == Counter({(source.host, source.port): 1})
    ctl = fabric.send(split0.host, Packet(split0.port, mac(split0), mac_str(controller_mac(APP))))
    assert not ctl.delivered and ctl.controller[split0.host] == 1


def test_input_direction_copies_what_the_worker_receives(wordcount):
    topology, physical, rules = wordcount
    count0 = physical.of_node("count")[0]
    fabric = fabric_with(rules, tap_on(count0, "in"))
    for split in physical.of_node("split"):
        got = send(fabric, split, mac(count0))
        assert got == Counter({(count0.host, count0.port): 1, (count0.host, DEBUG_PORT): 1})
        # its credits back to the split workers are not copied
        assert send(fabric, count0, mac(split)) == Counter({(split.host, split.port): 1})
    other = physical.of_node("count")[1]
    assert (count0.host, DEBUG_PORT) not in send(fabric, physical.of_node("split")[0], mac(other))


def test_both_directions_and_two_sessions(wordcount):
    topology, physical, rules = wordcount
    split0 = physical.of_node("split")[0]
    source = physical.of_node("source")[0]
    fabric = fabric_with(rules, tap_on(split0, "both"), tap_on(split0, "out", DEBUG_PORT + 1))
    count0 = physical.of_node("count")[0]
    assert send(fabric, split0, mac(count0)) == Counter(
        {
            (count0.host, count0.port): 1,
            (split0.host, DEBUG_PORT): 1,
            (split0.host, DEBUG_PORT + 1): 1,
        }
    )
    assert send(fabric, source, mac(split0)) == Counter(
        {(split0.host, split0.port): 1, (split0.host, DEBUG_PORT): 1}
    )


def test_mirrored_rules_keep_their_match_and_outputs_and_say_mirror(wordcount):
    topology, physical, rules = wordcount
    split0 = physical.of_node("split")[0]
    _, tap = tap_on(split0, "out")
    host_rules = rules[split0.host]
    after = apply_mirrors(host_rules, [tap])
    changed = {r for r in after - host_rules if r.table_id == 0}
    copies = {r for r in after if r.table_id == MIRROR_TABLE}
    carried = mirrored(host_rules, tap)
    assert len(carried) == len(changed) == len(copies) == len(physical.of_node("count"))
    assert {r.table_id for r in after} == {0, MIRROR_TABLE}
    before_by_key = {r.key: r for r in host_rules}
    for rule in changed:
        old = before_by_key[rule.key]
        assert rule.actions == old.actions + (goto_table(MIRROR_TABLE),)
        c, o = parse_cookie(rule.cookie), parse_cookie(old.cookie)
        assert c.kind == RuleKind.MIRROR and (c.app_id, c.worker, c.aux) == (
            o.app_id,
            o.worker,
            o.aux,
        )
        # its copy: same match and priority in table 1, through the session's meter
        [copy] = [r for r in copies if (r.priority, r.match) == (rule.priority, rule.match)]
        assert copy.actions == (meter(meter_id(DEBUG_PORT)), output(DEBUG_PORT))
        assert copy.cookie == rule.cookie
    assert {r.key for r in after if r.table_id == 0} == {r.key for r in host_rules}
    assert mirror_meters([tap]) == {MeterSpec(meter_id(DEBUG_PORT), DEFAULT_RATE, 20)}
    # detaching is not applying: the same rules as before, cookies included
    assert apply_mirrors(host_rules, []) == host_rules
    # taps of another application or of a worker elsewhere change nothing
    assert apply_mirrors(host_rules, [MirrorTap(APP + 1, 2, split0.port, "out", 9)]) == host_rules


def test_a_closed_meter_drops_the_copy_never_the_frame(wordcount):
    """What is not sampled is never output toward the debug port."""
    topology, physical, rules = wordcount
    split0 = physical.of_node("split")[0]
    host, tap = tap_on(split0, "out")
    by_host = {h: apply_mirrors(r, [tap] if h == host else []) for h, r in rules.items()}
    fabric = FakeFabric(mesh_cluster(3), by_host, closed={host: {tap.meter.meter_id}})
    for count in physical.of_node("count"):
        assert send(fabric, split0, mac(count)) == Counter({(count.host, count.port): 1})
    assert fabric.tables[host].meter_hits[tap.meter.meter_id] == 0


def test_two_sessions_on_one_rule_are_chained_fastest_first(wordcount):
    topology, physical, rules = wordcount
    split0 = physical.of_node("split")[0]
    count0 = physical.of_node("count")[0]
    slow = MirrorTap(APP, split0.worker_id, split0.port, "out", DEBUG_PORT, rate=10)
    fast = MirrorTap(APP, split0.worker_id, split0.port, "both", DEBUG_PORT + 1, rate=500)
    host = split0.host
    after = apply_mirrors(rules[host], [slow, fast])
    some = mirrored(rules[host], slow)[0].match
    chain = sorted((r for r in after if r.match == some), key=lambda r: r.table_id)
    assert [r.actions[-1] for r in chain] == [
        goto_table(1),
        goto_table(2),
        output(DEBUG_PORT),
    ]
    assert chain[1].actions[:2] == (meter(fast.meter.meter_id), output(DEBUG_PORT + 1))
    assert chain[2].actions == (meter(slow.meter.meter_id), output(DEBUG_PORT))
    by_host = {h: apply_mirrors(r, [slow, fast] if h == host else []) for h, r in rules.items()}

    def delivered(closed: set[int]) -> Counter:
        fabric = FakeFabric(mesh_cluster(3), by_host, closed={host: closed})
        return send(fabric, split0, mac(count0))

    both = {(count0.host, count0.port): 1, (host, DEBUG_PORT): 1, (host, DEBUG_PORT + 1): 1}
    assert delivered(set()) == Counter(both)
    # the slow session's meter drops only its own copy
    del both[(host, DEBUG_PORT)]
    assert delivered({slow.meter.meter_id}) == Counter(both)
    # the fast one's drops both copies (the slow session samples what the fast one got)
    assert delivered({fast.meter.meter_id}) == Counter({(count0.host, count0.port): 1})


def test_an_unmetered_session_copies_every_frame_and_goes_first_in_a_chain(wordcount):
    """``--rate all``: no meter, every frame copied; a metered session after it still
    samples the same frames, and a closed meter never stops the unmetered copy."""
    topology, physical, rules = wordcount
    split0 = physical.of_node("split")[0]
    count0 = physical.of_node("count")[0]
    every = MirrorTap(APP, split0.worker_id, split0.port, "out", DEBUG_PORT, rate=None)
    slow = MirrorTap(APP, split0.worker_id, split0.port, "out", DEBUG_PORT + 1, rate=10)
    assert every.meter is None and mirror_meters([every, slow]) == {slow.meter}
    host = split0.host
    after = apply_mirrors(rules[host], [slow, every])
    some = mirrored(rules[host], every)[0].match
    chain = sorted((r for r in after if r.match == some), key=lambda r: r.table_id)
    assert chain[1].actions == (output(DEBUG_PORT), goto_table(2))  # no meter, first
    assert chain[2].actions == (meter(slow.meter.meter_id), output(DEBUG_PORT + 1))
    by_host = {h: apply_mirrors(r, [every, slow] if h == host else []) for h, r in rules.items()}
    fabric = FakeFabric(mesh_cluster(3), by_host, closed={host: {slow.meter.meter_id}})
    assert send(fabric, split0, mac(count0)) == Counter(
        {(count0.host, count0.port): 1, (host, DEBUG_PORT): 1}
    )
    alone = {h: apply_mirrors(r, [every] if h == host else []) for h, r in rules.items()}
    fabric = FakeFabric(mesh_cluster(3), alone)
    for count in physical.of_node("count"):
        got = send(fabric, split0, mac(count))
        assert got == Counter({(count.host, count.port): 1, (host, DEBUG_PORT): 1})


def test_meter_specs_and_their_diff():
    assert meter_id(65000) == METER_BASE + 65000 and is_typhoon_meter(meter_id(65000))
    assert not is_typhoon_meter(1) and not is_typhoon_meter(METER_BASE)
    with pytest.raises(ValueError):
        meter_id(0x10000)
    with pytest.raises(ValueError, match="rate"):
        MeterSpec(meter_id(65000), 0, 1)
    assert sampling_meter(65000, 5).burst == 1 and sampling_meter(65000, 300).burst == 30
    a, b = sampling_meter(65000, 100), sampling_meter(65001, 100)
    foreign = MeterSpec(7, 100, 10)
    plan = diff_meters([a, b], [foreign, sampling_meter(65000, 50)])
    assert plan.add == (b,) and plan.modify == (a,) and plan.delete == ()
    plan = diff_meters([], [a, foreign])
    assert plan.delete == (a,) and not plan.add and not plan.modify
    assert not diff_meters([a], [a])


def test_rule_specs_order_instructions_and_refuse_backward_gotos():
    r = RuleSpec(100, (), (goto_table(1), output(3), meter(5)), 0)
    assert r.actions == (meter(5), output(3), goto_table(1))
    with pytest.raises(ValueError, match="forward"):
        RuleSpec(100, (), (goto_table(1),), 0, table_id=1)
    with pytest.raises(ValueError, match="at most one"):
        RuleSpec(100, (), (meter(1), meter(2)), 0)


BROADCAST = """
name: fanout
spouts:
  - {id: source, operator: sentence_source}
bolts:
  - {id: sink, operator: collect, parallelism: 6}
streams:
  - {from: source, to: sink, grouping: all}
"""


def test_multicast_copies_once_per_frame_on_either_side():
    topology = load_topology_text(BROADCAST, "fanout")
    physical, rules = compiled(topology)
    source = physical.of_node("source")[0]
    sinks = physical.of_node("sink")
    group = mac_str(multicast_mac(APP, topology.streams[0].id))
    plain = send(FakeFabric(mesh_cluster(3), rules), source, group)
    out = send(fabric_with(rules, tap_on(source, "out")), source, group)
    assert out == plain + Counter({(source.host, DEBUG_PORT): 1})
    remote = next(s for s in sinks if s.host != source.host)
    into = send(fabric_with(rules, tap_on(remote, "in")), source, group)
    assert into == plain + Counter({(remote.host, DEBUG_PORT): 1})


def test_a_bad_direction_is_refused():
    with pytest.raises(ValueError, match="direction"):
        MirrorTap(APP, 1, 100, "sideways", DEBUG_PORT)


def test_a_load_balancer_rule_is_copied_before_its_group_picks_a_receiver():
    lb = RuleSpec(
        100,
        (("in_port", 101), ("eth_src", mac_str(worker_mac(APP, 3)))),
        (("group", 42),),
        make_cookie(APP, RuleKind.LB_GROUP, 3, 1),
    )
    after, copy = sorted(
        apply_mirrors(frozenset({lb}), [MirrorTap(APP, 3, 101, "out", DEBUG_PORT)]),
        key=lambda r: r.table_id,
    )
    assert after.actions == (("group", 42), goto_table(MIRROR_TABLE))
    assert copy.actions == (meter(meter_id(DEBUG_PORT)), output(DEBUG_PORT))
    assert apply_mirrors(frozenset({lb}), [MirrorTap(APP, 3, 101, "in", DEBUG_PORT)]) == {lb}
