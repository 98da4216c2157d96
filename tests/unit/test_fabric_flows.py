"""The per-bridge readings of the linefab benchmark, from OVS tools' text, and the tcp
baseline's next hops on a line."""

from __future__ import annotations

from benchmarks.fabric_flows import parse_dp_flows, parse_missed, parse_of_rules
from benchmarks.tcp_fabric import next_hops
from mininet_env.fabric import FabricPlan

OF_DUMP = """\
 cookie=0x7000000000000, duration=3.1s, table=0, n_packets=0, n_bytes=0, priority=0 actions=drop
 cookie=0x7000200010004, duration=2.0s, table=0, n_packets=1313, n_bytes=35310000, \
priority=100,in_port=1,dl_src=02:00:00:07:00:01,dl_dst=02:00:00:07:00:04,dl_type=0x88b5 \
actions=output:2
 cookie=0x7000200040001, duration=2.0s, table=0, n_packets=40, n_bytes=2400, \
priority=100,in_port=2,dl_src=02:00:00:07:00:04,dl_dst=02:00:00:07:00:01,dl_type=0x88b5 \
actions=output:1
 cookie=0x7000300020000, duration=2.0s, table=0, n_packets=0, n_bytes=0, \
priority=10,in_port=10 actions=drop
"""

DP_DUMP = """\
flow-dump from the main thread:
recirc_id(0),in_port(tb1-eth1),packet_type(ns=0,id=0),eth(src=02:00:00:07:00:01,\
dst=02:00:00:07:00:04),eth_type(0x88b5), packets:1310, bytes:35000000, used:0.1s, \
actions:tb2-eth2
recirc_id(0),in_port(tb2-eth2),packet_type(ns=0,id=0),eth(src=02:00:00:07:00:04,\
dst=02:00:00:07:00:01),eth_type(0x88b5), packets:41, bytes:2460, used:0.1s, actions:tb2-eth1
recirc_id(0),in_port(other-eth1),packet_type(ns=0,id=0),eth_type(0x0800), packets:9, \
bytes:900, used:0.5s, actions:drop
"""


def test_of_rules_keeps_the_data_rules_and_their_counters():
    rules = parse_of_rules(OF_DUMP)
    assert sorted(rules.values()) == [40, 1313]
    assert all(m.startswith("in_port=") for m in rules)


def test_dp_flows_counted_per_bridge_of_their_input_port():
    ports = {"tb1-eth1": "tb2", "tb2-eth2": "tb2", "tb3-eth1": "tb3"}
    assert parse_dp_flows(DP_DUMP, ports) == {"tb2": (2, 1351)}


def test_missed_is_the_upcall_counter_or_none():
    assert parse_missed("netdev@ovs-netdev: hit:168274 missed:207\n  tb1:\n") == 207
    assert parse_missed("ovs-vswitchd: no datapaths exist") is None


def test_next_hops_follow_the_line_and_the_mesh_direct_links():
    line = next_hops(FabricPlan(4, "line"))
    assert [line[1, 4], line[2, 4], line[3, 4], line[4, 1], line[3, 1]] == [2, 3, 4, 3, 2]
    mesh = next_hops(FabricPlan(4, "mesh"))
    assert all(mesh[i, j] == j for i, j in mesh)
    assert len(mesh) == len(line) == 12
