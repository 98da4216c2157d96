"""The cluster file: parsing, schema errors, the cluster it yields, the bridge plan and check."""

from __future__ import annotations

import copy

import pytest
import yaml

from typhoon.bridge_plan import BridgeState, PortState, bridge_plan, problems
from typhoon.cluster import Cluster
from typhoon.cluster_file import ClusterFileError, parse_cluster_text
from typhoon.wire import ETH_HLEN, Kind, Reassembler, decode_frame, pack_frames, worker_mac

BASE = {
    "controller": "tcp:10.0.0.1:6653",
    "coordinator": "zk://10.0.0.1:2181/typhoon",
    "fabric": {"type": "vxlan", "mtu": 1500, "key": 42},
    "hosts": {
        "h1": {"address": "10.0.0.1", "bridge": "br-ty", "dpid": 1},
        "h2": {"address": "10.0.0.2", "bridge": "br-ty", "dpid": 2, "datapath": "netdev"},
        "h3": {"address": "10.0.0.3", "bridge": "br-ty", "dpid": 3},
    },
}


def parse(doc: dict):
    return parse_cluster_text(yaml.safe_dump(doc), "c.yaml")


def changed(**top) -> dict:
    doc = copy.deepcopy(BASE)
    doc.update(top)
    return doc


def error(doc: dict) -> str:
    with pytest.raises(ClusterFileError) as e:
        parse(doc)
    return str(e.value)


def test_vxlan_mesh_cluster():
    cf = parse(BASE)
    cluster = cf.cluster()
    assert list(cluster.hosts) == ["h1", "h2", "h3"]
    assert cluster.hosts["h2"].dpid == 2 and cluster.hosts["h2"].address == "10.0.0.2"
    # port N on every bridge leads to host N
    assert {(x.a, x.a_port, x.b, x.b_port) for x in cluster.links} == {
        ("h1", 2, "h2", 1),
        ("h1", 3, "h3", 1),
        ("h2", 3, "h3", 2),
    }
    # 1500-byte underlay less outer IPv4 (20), UDP (8), VXLAN (8), inner Ethernet (14)
    assert cluster.mtu == 1450
    assert Cluster.from_dict(cluster.to_dict()) == cluster


def test_ipv6_tunnels_leave_less_room():
    doc = copy.deepcopy(BASE)
    for i, h in enumerate(doc["hosts"].values(), start=1):
        h["address"] = f"fd00::{i}"
    assert parse(doc).frame_mtu() == 1430


def test_ports_fabric_numbers_links_in_order():
    links = [["h1:eth1", "h2:eth1"], ["h1:eth2", "h3:eth1"]]
    doc = changed(fabric={"type": "ports", "mtu": 9000}, links=links)
    cf = parse(doc)
    assert cf.frame_mtu() == 9000
    assert [(x.a, x.a_port, x.b, x.b_port) for x in cf.cluster().links] == [
        ("h1", 1, "h2", 1),
        ("h1", 2, "h3", 1),
    ]
    assert [(p.interface, p.port, p.peer) for p in cf.fabric_ports("h1")] == [
        ("eth1", 1, "h2"),
        ("eth2", 2, "h3"),
    ]


@pytest.mark.parametrize(
    "doc, message",
    [
        (changed(hosts={"h1": {"address": "10.0.0.1", "bridge": "b", "dpdi": 1}}),
         "c.yaml: hosts.h1: unknown key 'dpdi'; did you mean 'dpid'?"),
        (changed(fabrik={}), "c.yaml: top level: unknown key 'fabrik'; did you mean 'fabric'?"),
        (changed(fabric={"type": "vxlan", "mtu": 1500, "kye": 1}),
         "fabric: unknown key 'kye'; did you mean 'key'?"),
        (changed(fabric={"type": "gre", "mtu": 1500}),
         "fabric.type: must be one of vxlan, geneve, ports, not 'gre'"),
        (changed(fabric={"type": "vxlan", "mtu": 100}), "fabric.mtu: must be an integer in 576"),
        (changed(controller="10.0.0.1:6653"), "controller: must be tcp:HOST:PORT or ssl:HOST:PORT"),
        (changed(coordinator="/var/lib/c.db"), "coordinator: must be zk://"),
        (changed(hosts={"h1": {"address": "nowhere", "bridge": "b", "dpid": 1}}),
         "hosts.h1.address: must be an IP address, not 'nowhere'"),
        (changed(hosts={"h1": {"address": "10.0.0.1", "bridge": "b" * 16, "dpid": 1}}),
         "hosts.h1.bridge: must be an interface name"),
        (changed(hosts={"h1": {"address": "10.0.0.1", "bridge": "b", "dpid": 1},
                        "h2": {"address": "10.0.0.2", "bridge": "b", "dpid": 1}}),
         "hosts.h2.dpid: 1 is also host h1's"),
        (changed(hosts={"h1": {"address": "10.0.0.1", "bridge": "b"}}), "hosts.h1: missing 'dpid'"),
        (changed(links=[["h1:eth1", "h2:eth1"]]), "links: a vxlan fabric is a full mesh"),
        (changed(fabric={"type": "ports", "mtu": 1500}, links=[["h1:eth1", "hh2:eth1"]]),
         "links[0]: no host named 'hh2'; did you mean 'h2'?"),
        (changed(fabric={"type": "ports", "mtu": 1500}), "links: a ports fabric needs"),
        ({"hosts": []}, "top level: missing 'controller'"),
    ],
)  # fmt: skip
def test_schema_errors(doc, message):
    assert message in error(doc)


def test_broken_yaml_names_the_line():
    with pytest.raises(ClusterFileError, match=r"^c.yaml: line 2: not valid YAML: mapping values"):
        parse_cluster_text("controller: a\n  fabric: b\n", "c.yaml")


def test_plan_for_a_tunnel_host():
    cf = parse(BASE)
    plan = bridge_plan(cf, "h2")
    assert plan[0][:4] == ["ovs-vsctl", "--may-exist", "add-br", "br-ty"]
    assert {"datapath_type=netdev", "other-config:datapath-id=0000000000000002",
            "protocols=OpenFlow13", "fail_mode=secure"} <= set(plan[0])  # fmt: skip
    assert plan[1] == ["ovs-vsctl", "set-controller", "br-ty", "tcp:10.0.0.1:6653"]
    tunnels = {c[4]: c for c in plan[2:]}
    assert set(tunnels) == {"tyt1", "tyt3"}
    assert {"type=vxlan", "options:remote_ip=10.0.0.1", "options:local_ip=10.0.0.2",
            "options:key=42", "ofport_request=1"} <= set(tunnels["tyt1"])  # fmt: skip
    # every element is its own argument: nothing goes through a shell
    assert all(isinstance(a, str) and a for c in plan for a in c)


def test_plan_removes_stale_tunnels_only():
    cf = parse(BASE)
    state = BridgeState(
        "br-ty", exists=True, ports={n: PortState(n) for n in ("tyt1", "tyt9", "eth0")}
    )
    plan = bridge_plan(cf, "h2", state)
    assert plan[-1] == ["ovs-vsctl", "--if-exists", "del-port", "br-ty", "tyt9"]
    assert not any("eth0" in c for c in plan)


def test_plan_keeps_a_controller_that_is_already_set():
    cf = parse(BASE)
    state = good_state(cf, "h1")
    assert not any("set-controller" in c for c in bridge_plan(cf, "h1", state))
    state.controllers = ["tcp:10.0.0.9:6653"]
    assert ["ovs-vsctl", "set-controller", "br-ty", "tcp:10.0.0.1:6653"] in bridge_plan(
        cf, "h1", state
    )


def good_state(cf, host: str) -> BridgeState:
    h = cf.hosts[host]
    ports = {
        t.name: PortState(t.name, cf.fabric_type, t.port, {"remote_ip": t.remote_ip})
        for t in cf.tunnels(host)
    }
    return BridgeState(h.bridge, True, h.dpid, h.datapath, "secure", ["OpenFlow13"],
                       list(cf.controllers), True, ports,
                       {t.remote_ip: 1500 for t in cf.tunnels(host)})  # fmt: skip


def test_check_finds_each_problem_once():
    cf = parse(BASE)
    assert problems(cf, "h1", good_state(cf, "h1")) == []
    assert problems(cf, "h1", BridgeState("br-ty")) == [
        "bridge br-ty missing (run: typhoon cluster apply c.yaml --host h1)"
    ]
    state = good_state(cf, "h1")
    state.dpid = 7
    state.fail_mode = "standalone"
    state.underlay_mtu["10.0.0.3"] = 1400
    del state.ports["tyt2"]
    state.connected = False
    assert problems(cf, "h1", state) == [
        "bridge br-ty has DPID 0x7, the file says 0x1",
        "bridge br-ty fail_mode is standalone, not secure",
        "bridge br-ty is not connected to its controller tcp:10.0.0.1:6653",
        "tunnel tyt2 to h2 missing",
        "MTU too small: the path to h3 (10.0.0.3) has MTU 1400, the fabric needs 1500",
    ]


def test_a_tuple_bigger_than_a_tunnel_frame_is_segmented_to_fit():
    """What a worker sends over a 1500-byte VXLAN underlay: frames of at most
    14 + 1450 bytes, a 5000-byte entry cut into segments."""
    mtu = parse(BASE).frame_mtu()
    src, dst = worker_mac(1, 1), worker_mac(1, 2)
    big = bytes(range(256)) * 20
    frames = pack_frames(dst, src, Kind.DATA, 0, 0, [b"small", big, b"tail"], mtu)
    assert len(frames) > 3
    assert max(len(f) for f in frames) <= ETH_HLEN + mtu
    r = Reassembler()
    got = [p for f in frames for p in r.feed(decode_frame(f, mtu=mtu))]
    assert got == [b"small", big, b"tail"]
