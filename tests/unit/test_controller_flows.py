"""Compiled rules, checked by forwarding frames through fake bridges (not by reading them)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from fakeflows import FakeFabric, Packet, cluster_of, line_cluster, mesh_cluster
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.rules.cookies import RuleKind, make_cookie, parse_cookie
from controller.rules.flows import (
    OFPP_CONTROLLER,
    RuleSpec,
    compile_default_rules,
    compile_rules,
    match,
    output,
)
from typhoon.cluster import Cluster
from typhoon.topology.chaining import chain_groups
from typhoon.topology.loader import load_topology, load_topology_text
from typhoon.topology.model import (
    GROUPINGS,
    Grouping,
    Node,
    PhysicalTopology,
    Stream,
    Topology,
    WorkerAssignment,
)
from typhoon.topology.scheduler import schedule
from typhoon.wire import ETHERTYPE, controller_mac, mac_str, multicast_mac, worker_mac

FIXTURES = Path(__file__).parent / "fixtures" / "topologies" / "good"
APP = 7
FIRST_PORT = 100

BROADCAST = """
name: fanout
spouts:
  - {id: source, operator: sentence_source}
bolts:
  - {id: sink, operator: collect, parallelism: 6}
streams:
  - {from: source, to: sink, grouping: all}
"""


def mac(w: WorkerAssignment, app: int = APP) -> str:
    return mac_str(worker_mac(app, w.worker_id))


def install(topology: Topology, physical: PhysicalTopology, cluster: Cluster) -> FakeFabric:
    rules = compile_rules(topology, physical, cluster)
    return FakeFabric(cluster, {h: r | compile_default_rules() for h, r in rules.items()})


def frame(
    u: WorkerAssignment, eth_dst: str, eth_src: str | None = None, app: int = APP, **kw
) -> Packet:
    return Packet(u.port, eth_src or mac(u, app), eth_dst, **kw)


def deploy(topology: Topology, cluster: Cluster) -> tuple[PhysicalTopology, FakeFabric]:
    physical = schedule(topology, sorted(cluster.hosts), APP, FIRST_PORT)
    return physical, install(topology, physical, cluster)


def allowed_pairs(topology: Topology, physical: PhysicalTopology) -> set[tuple[int, int]]:
    """(src worker, dst worker) pairs that may exchange unicast frames: data and credits,
    both ways for every grouping (a one-to-many link sends base SYNCs and EOS unicast).
    A forward stream pairs worker i with worker i only, and none of a chain's pairs (one
    process, typhoon/topology/chaining.py)."""
    pairs = set()
    same_process = {
        (a, b) for ws in chain_groups(topology, physical).values() for a in ws for b in ws
    }
    for s in topology.streams:
        us, vs = physical.of_node(s.src), physical.of_node(s.dst)
        for i, u in enumerate(us):
            for j, v in enumerate(vs):
                if s.grouping.type == "forward" and i != j:
                    continue
                if (u.worker_id, v.worker_id) in same_process:
                    continue
                pairs.add((v.worker_id, u.worker_id))
                pairs.add((u.worker_id, v.worker_id))
    return pairs


def assert_only_delivered_to(trace, w: WorkerAssignment) -> None:
    assert trace.delivered == Counter({(w.host, w.port): 1})
    assert not trace.controller and not trace.drops
    assert all(n == 1 for n in trace.links.values())


@pytest.fixture(scope="module")
def wordcount() -> Topology:
    return load_topology(FIXTURES / "wordcount.yaml")


CLUSTERS = {"line": line_cluster(3), "mesh": mesh_cluster(3)}


@pytest.mark.parametrize("shape", CLUSTERS)
def test_wordcount_every_pair_reaches_exactly_its_receiver(wordcount, shape):
    physical, fabric = deploy(wordcount, CLUSTERS[shape])
    assert len({w.host for w in physical.workers}) == 3  # the test must cross hosts
    for s in wordcount.streams:
        for u in physical.of_node(s.src):
            for v in physical.of_node(s.dst):
                assert_only_delivered_to(fabric.send(u.host, frame(u, mac(v))), v)
                assert_only_delivered_to(fabric.send(v.host, frame(v, mac(u))), u)  # credit


@pytest.mark.parametrize("shape", CLUSTERS)
def test_wordcount_nothing_else_is_delivered(wordcount, shape):
    physical, fabric = deploy(wordcount, CLUSTERS[shape])
    allowed = allowed_pairs(wordcount, physical)
    for u in physical.workers:
        for v in physical.workers:
            if (u.worker_id, v.worker_id) in allowed:
                continue
            trace = fabric.send(u.host, frame(u, mac(v)))
            assert not trace.delivered and not trace.controller, (u, v)
        # another EtherType, a multicast group, another app's address: all dropped
        v = physical.workers[-1] if u != physical.workers[-1] else physical.workers[0]
        for pkt in (
            frame(u, mac(v), eth_type=0x0800),
            frame(u, mac_str(multicast_mac(APP, 1))),
            frame(u, mac(v, app=APP + 1)),
            frame(u, "ff:ff:ff:ff:ff:ff"),
        ):
            trace = fabric.send(u.host, pkt)
            assert not trace.delivered and not trace.controller, pkt


def drop_kind(trace) -> RuleKind:
    [(_, rule)] = trace.drops
    return parse_cookie(rule.cookie).kind


def test_spoofed_source_is_dropped_by_the_port_rule(wordcount):
    physical, fabric = deploy(wordcount, CLUSTERS["line"])
    source, split0, split1 = physical.workers[:3]
    count0 = physical.of_node("count")[0]
    assert split0.host == split1.host
    # split0 claims to be split1 (a legitimate sender to count0): dropped at its own port
    trace = fabric.send(split0.host, frame(split0, mac(count0), eth_src=mac(split1)))
    assert not trace.delivered
    assert drop_kind(trace) == RuleKind.SPOOF_DROP
    assert parse_cookie(trace.drops[0][1].cookie).worker == split0.worker_id
    # a worker sending as the controller (control tuples to a peer) is dropped too
    ctl = mac_str(controller_mac(APP))
    trace = fabric.send(split0.host, frame(split0, mac(count0), eth_src=ctl))
    assert not trace.delivered and drop_kind(trace) == RuleKind.SPOOF_DROP
    trace = fabric.send(source.host, frame(source, mac(split0), eth_src=ctl))
    assert not trace.delivered and drop_kind(trace) == RuleKind.SPOOF_DROP


def test_frames_injected_on_a_fabric_port_must_follow_a_known_path(wordcount):
    physical, fabric = deploy(wordcount, CLUSTERS["line"])
    count0 = physical.of_node("count")[0]
    source = physical.workers[0]
    assert source.host == "h1" and count0.host == "h2"
    # source never sends to count: a frame from h1's fabric port claiming so is dropped
    trace = fabric.send("h2", Packet(1, mac(source), mac(count0)))
    assert not trace.delivered and drop_kind(trace) == RuleKind.DEFAULT_DROP


def test_worker_to_controller(wordcount):
    physical, fabric = deploy(wordcount, CLUSTERS["line"])
    for w in physical.workers:
        trace = fabric.send(w.host, frame(w, mac_str(controller_mac(APP))))
        assert trace.controller == Counter({w.host: 1})
        assert not trace.delivered and not trace.links


@pytest.mark.parametrize("shape", CLUSTERS)
def test_broadcast_one_copy_per_sink_and_per_link(shape):
    topology = load_topology_text(BROADCAST)
    physical, fabric = deploy(topology, CLUSTERS[shape])
    [source] = physical.of_node("source")
    sinks = physical.of_node("sink")
    assert {w.host for w in sinks} == {"h1", "h2", "h3"}
    trace = fabric.send(source.host, frame(source, mac_str(multicast_mac(APP, 1))))
    assert trace.delivered == Counter({(w.host, w.port): 1 for w in sinks})
    assert not trace.drops and not trace.controller
    expected = {"line": {("h1", "h2"), ("h2", "h3")}, "mesh": {("h1", "h2"), ("h1", "h3")}}
    assert trace.links == Counter(dict.fromkeys(expected[shape], 1))
    for w in sinks:  # credits go back by unicast
        assert_only_delivered_to(fabric.send(w.host, frame(w, mac(source))), source)


def test_broadcast_from_the_middle_of_a_line():
    topology = load_topology_text(BROADCAST)
    c = line_cluster(3)
    workers = [WorkerAssignment(1, "source", 0, "h2", 100)] + [
        WorkerAssignment(2 + i, "sink", i, h, 100 + i)
        for i, h in enumerate("h1 h1 h2 h3 h3 h3".split())
    ]
    physical = PhysicalTopology("fanout", APP, workers)
    fabric = install(topology, physical, c)
    trace = fabric.send("h2", frame(workers[0], mac_str(multicast_mac(APP, 1))))
    assert trace.delivered == Counter({(w.host, w.port): 1 for w in workers[1:]})
    assert trace.links == Counter({("h2", "h1"): 1, ("h2", "h3"): 1})


def test_all_grouping_has_unicast_credit_paths_both_ways():
    """A one-to-many link needs unicast too: a joining receiver's base SYNC and the end of
    stream go sender -> receiver, grants and NACKs back; both are credit rules (cookie).
    Before, the base SYNC met the sender port's anti-spoofing drop rule."""
    topology = load_topology_text(BROADCAST)
    physical, fabric = deploy(topology, CLUSTERS["line"])
    rules = compile_rules(topology, physical, CLUSTERS["line"])
    [source] = physical.of_node("source")
    for sink in physical.of_node("sink"):
        there = fabric.send(source.host, frame(source, mac(sink)))
        assert there.delivered == Counter({(sink.host, sink.port): 1}), sink
        back = fabric.send(sink.host, frame(sink, mac(source)))
        assert back.delivered == Counter({(source.host, source.port): 1}), sink
    unicast_to_sinks = [
        r
        for host_rules in rules.values()
        for r in host_rules
        if r.match_dict().get("eth_src") == mac(source)
        and r.match_dict().get("eth_dst") != mac_str(multicast_mac(APP, 1))
        and r.priority == 100
    ]
    assert unicast_to_sinks and all(parse_cookie(r.cookie).credit for r in unicast_to_sinks)


def test_rules_have_the_documented_shape(wordcount):
    physical = schedule(wordcount, ["h1", "h2", "h3"], APP, FIRST_PORT)
    rules = compile_rules(wordcount, physical, line_cluster(3))
    source, split0 = physical.workers[:2]
    local = RuleSpec(
        100,
        match(in_port=source.port, eth_src=mac(source), eth_dst=mac(split0), eth_type=ETHERTYPE),
        (output(split0.port),),
        make_cookie(APP, RuleKind.LOCAL, source.worker_id, split0.worker_id),
    )
    assert local in rules["h1"]
    for rule in rules["h1"] | rules["h2"] | rules["h3"]:
        c = parse_cookie(rule.cookie)
        assert c is not None and c.app_id == APP
        if rule.priority > 10:
            assert {"in_port", "eth_src", "eth_dst", "eth_type"} == set(rule.match_dict())
        if c.kind == RuleKind.TO_CONTROLLER:
            assert rule.actions == (output(OFPP_CONTROLLER),) and rule.priority == 200
        if c.kind == RuleKind.SPOOF_DROP:
            assert rule.actions == () and rule.priority == 10
            assert set(rule.match_dict()) == {"in_port"}


def test_default_rules():
    [rule] = compile_default_rules()
    assert (rule.priority, rule.match, rule.actions) == (0, (), ())
    assert parse_cookie(rule.cookie).kind == RuleKind.DEFAULT_DROP
    assert parse_cookie(rule.cookie).app_id == 0


def test_deterministic_and_every_host_present(wordcount):
    c = cluster_of(["h1", "h2", "h3", "h4"], [("h1", "h2"), ("h2", "h3"), ("h3", "h4")])
    physical = schedule(wordcount, ["h1", "h2", "h3"], APP, FIRST_PORT)
    a = compile_rules(wordcount, physical, c)
    b = compile_rules(wordcount, physical, c)
    assert a == b and list(a) == ["h1", "h2", "h3", "h4"]
    assert a["h4"] == frozenset()


def test_two_streams_between_the_same_nodes_merge():
    text = """
name: twice
spouts:
  - {id: a, operator: sentence_source, parallelism: 2}
bolts:
  - {id: b, operator: collect, parallelism: 2}
streams:
  - {from: a, to: b, grouping: shuffle}
  - {from: a, to: b, stream: other, grouping: global}
"""
    topology = load_topology_text(text)
    physical = schedule(topology, ["h1", "h2"], APP, FIRST_PORT)
    one = Topology(topology.name, topology.nodes, topology.streams[:1])
    assert compile_rules(topology, physical, line_cluster(2)) == compile_rules(
        one, physical, line_cluster(2)
    )


@pytest.mark.parametrize(
    "worker, error",
    [
        (WorkerAssignment(2, "sink", 0, "h9", 100), "unknown host"),
        (WorkerAssignment(2, "sink", 0, "h1", 1), "taken"),  # h1's fabric port
        (WorkerAssignment(2, "sink", 0, "h1", 100), "taken"),  # the source's port
    ],
)
def test_bad_placements_are_rejected(worker, error):
    topology = load_topology_text(BROADCAST.replace("parallelism: 6", "parallelism: 1"))
    physical = PhysicalTopology(
        "fanout", APP, [WorkerAssignment(1, "source", 0, "h1", 100), worker]
    )
    with pytest.raises(ValueError, match=error):
        compile_rules(topology, physical, line_cluster(2))


def test_partitioned_fabric_is_an_error(wordcount):
    c = cluster_of(["h1", "h2", "h3"], [("h1", "h2")])
    physical = schedule(wordcount, ["h1", "h2", "h3"], APP, FIRST_PORT)
    with pytest.raises(ValueError, match="no fabric path"):
        compile_rules(wordcount, physical, c)


def test_other_ethertype():
    topology = load_topology_text(BROADCAST)
    physical = schedule(topology, ["h1"], APP, FIRST_PORT)
    c = line_cluster(1)
    rules = compile_rules(topology, physical, c, ethertype=0x1234)
    fabric = FakeFabric(c, rules)
    [source] = physical.of_node("source")
    assert fabric.send(
        "h1", frame(source, mac_str(multicast_mac(APP, 1)), eth_type=0x1234)
    ).delivered
    assert not fabric.send("h1", frame(source, mac_str(multicast_mac(APP, 1)))).delivered


# ----------------------------------------------------------------------------- property


@st.composite
def deployments(draw):
    """A random DAG topology, a random connected cluster, a random placement."""
    n_nodes = draw(st.integers(2, 4))
    names = [f"n{i}" for i in range(n_nodes)]
    nodes = {
        n: Node(n, "spout" if i == 0 else "bolt", "identity", parallelism=draw(st.integers(1, 3)))
        for i, n in enumerate(names)
    }
    edges = {(names[draw(st.integers(0, i - 1))], names[i]) for i in range(1, n_nodes)}
    extra = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    edges |= set(draw(st.lists(st.sampled_from(extra), max_size=3)))
    streams = [
        Stream(k + 1, a, b, Grouping(draw(st.sampled_from(GROUPINGS))))
        for k, (a, b) in enumerate(sorted(edges))
    ]
    topology = Topology("prop", nodes, streams)

    n_hosts = draw(st.integers(1, 4))
    hosts = [f"h{i}" for i in range(n_hosts)]
    links = {(hosts[draw(st.integers(0, i - 1))], hosts[i]) for i in range(1, n_hosts)}
    pairs = [(a, b) for i, a in enumerate(hosts) for b in hosts[i + 1 :]]
    if pairs:
        links |= set(draw(st.lists(st.sampled_from(pairs), max_size=3)))
    cluster = cluster_of(hosts, sorted(links))

    next_port = dict.fromkeys(hosts, FIRST_PORT)
    workers = []
    for name in names:
        for index in range(nodes[name].parallelism):
            host = draw(st.sampled_from(hosts))
            workers.append(WorkerAssignment(len(workers) + 1, name, index, host, next_port[host]))
            next_port[host] += 1
    app = draw(st.integers(1, 0xFFFE))
    return topology, PhysicalTopology("prop", app, workers), cluster


@settings(max_examples=150, deadline=None)
@given(deployments())
def test_random_deployments_deliver_exactly(deployment):
    topology, physical, cluster = deployment
    app = physical.app_id
    rules = compile_rules(topology, physical, cluster)
    fabric = FakeFabric(cluster, {h: r | compile_default_rules() for h, r in rules.items()})
    allowed = allowed_pairs(topology, physical)
    for u in physical.workers:
        for v in physical.workers:
            trace = fabric.send(u.host, frame(u, mac(v, app), app=app))
            if (u.worker_id, v.worker_id) in allowed:
                assert_only_delivered_to(trace, v)
            else:
                assert not trace.delivered and not trace.controller
    for s in topology.streams:
        if s.grouping.type != "all":
            continue
        receivers = physical.of_node(s.dst)
        for u in physical.of_node(s.src):
            trace = fabric.send(u.host, frame(u, mac_str(multicast_mac(app, s.id)), app=app))
            assert trace.delivered == Counter({(v.host, v.port): 1 for v in receivers})
            assert all(n == 1 for n in trace.links.values())
            assert not any((b, a) in trace.links for a, b in trace.links)


def test_link_order_does_not_matter(wordcount):
    physical = schedule(wordcount, ["h1", "h2", "h3"], APP, FIRST_PORT)
    c1 = mesh_cluster(3)
    c2 = Cluster(c1.hosts, list(reversed(c1.links)))
    assert compile_rules(wordcount, physical, c1) == compile_rules(wordcount, physical, c2)


def test_transit_on_a_4_host_line_is_one_rule_per_bridge_per_direction():
    """The linefab benchmark's placement (source h1, sink h4, idle bolts on h2 and h3):
    every data frame and every credit crosses h2 and h3 by one exact-match TRANSIT rule
    each, never the controller, so transit costs the datapath one lookup per frame and
    holds a fixed number of rules whatever the traffic."""
    topology = load_topology_text(
        """
name: linefab
spouts:
  - {id: source, operator: sequence_source}
bolts:
  - {id: pad2, operator: identity}
  - {id: pad3, operator: identity}
  - {id: sink, operator: sequence_check}
streams:
  - {from: source, to: sink, grouping: shuffle}
  - {from: source, to: pad2, stream: idle, grouping: shuffle}
  - {from: source, to: pad3, stream: idle, grouping: shuffle}
"""
    )
    cluster = line_cluster(4)
    physical, fabric = deploy(topology, cluster)
    [source], [sink] = physical.of_node("source"), physical.of_node("sink")
    assert (source.host, sink.host) == ("h1", "h4")
    rules = compile_rules(topology, physical, cluster)
    for u, v in ((source, sink), (sink, source)):
        trace = fabric.send(u.host, frame(u, mac(v)))
        assert_only_delivered_to(trace, v)
        hops = [("h1", "h2"), ("h2", "h3"), ("h3", "h4")]
        if u is sink:
            hops = [(b, a) for a, b in reversed(hops)]
        assert trace.links == Counter(dict.fromkeys(hops, 1))
        for here in ("h2", "h3"):
            hit = [
                r
                for r in rules[here]
                if r.match_dict().get("eth_src") == mac(u)
                and r.match_dict().get("eth_dst") == mac(v)
                and parse_cookie(r.cookie).kind == RuleKind.TRANSIT
            ]
            assert len(hit) == 1 and hit[0].actions[0][0] == "output", here
    # transit rules: h3 carries source <-> sink both ways, h2 also source <-> pad3
    transit = {
        h: sum(parse_cookie(r.cookie).kind == RuleKind.TRANSIT for r in rules[h])
        for h in ("h2", "h3")
    }
    assert transit == {"h2": 4, "h3": 2}
    assert not any(
        OFPP_CONTROLLER in (a[1] for a in r.actions)
        for h in ("h2", "h3")
        for r in rules[h]
        if r.match_dict().get("in_port") in (1, 2)  # the fabric ports of a line's middle
    )
