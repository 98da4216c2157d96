"""Mirror outputs, checked by forwarding frames through fake bridges (no switch)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from fakeflows import FakeFabric, Packet, mesh_cluster

from controller.cookies import RuleKind, make_cookie, parse_cookie
from controller.flows import RuleSpec, compile_default_rules, compile_rules
from controller.mirror import MirrorTap, apply_mirrors, mirrored
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
    changed = after - host_rules
    carried = mirrored(host_rules, tap)
    assert len(carried) == len(changed) == len(physical.of_node("count"))
    before_by_key = {r.key: r for r in host_rules}
    for rule in changed:
        old = before_by_key[rule.key]
        assert rule.actions == old.actions + (("output", DEBUG_PORT),)
        c, o = parse_cookie(rule.cookie), parse_cookie(old.cookie)
        assert c.kind == RuleKind.MIRROR and (c.app_id, c.worker, c.aux) == (
            o.app_id,
            o.worker,
            o.aux,
        )
    assert {r.key for r in after} == {r.key for r in host_rules}  # replaced, none added
    # detaching is not applying: the same rules as before, cookies included
    assert apply_mirrors(host_rules, []) == host_rules
    # taps of another application or of a worker elsewhere change nothing
    assert apply_mirrors(host_rules, [MirrorTap(APP + 1, 2, split0.port, "out", 9)]) == host_rules


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
    [after] = apply_mirrors(frozenset({lb}), [MirrorTap(APP, 3, 101, "out", DEBUG_PORT)])
    assert after.actions == (("group", 42), ("output", DEBUG_PORT))
    assert apply_mirrors(frozenset({lb}), [MirrorTap(APP, 3, 101, "in", DEBUG_PORT)]) == {lb}
