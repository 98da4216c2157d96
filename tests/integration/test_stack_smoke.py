"""Smoke test of the whole SDN stack: Ryu + Typhoon controller + userspace OVS + Mininet.

Two userspace-datapath OVS bridges, linked together, connect to the controller
over OpenFlow 1.3; the controller sees both and installs its drop rule.
"""

import re

import pytest
from mininet.net import Mininet
from mininet.node import OVSSwitch, RemoteController

from controller.rules.cookies import RuleKind, parse_cookie

pytestmark = pytest.mark.integration


def test_two_switches_connect_and_get_the_drop_rule(ovs, ryu_manager, net_names):
    ryu = ryu_manager("apps/typhoon_core.py")
    names = [net_names.switch("a"), net_names.switch("b")]
    dpids = [net_names.dpid(1), net_names.dpid(2)]

    net = Mininet(topo=None, controller=None, build=False, autoSetMacs=False)
    try:
        net.addController(
            net_names.prefix + "c", controller=RemoteController, ip="127.0.0.1", port=ryu.ofp_port
        )
        switches = [
            net.addSwitch(
                name,
                cls=OVSSwitch,
                datapath="user",
                protocols="OpenFlow13",
                failMode="secure",
                dpid=dpid,
            )
            for name, dpid in zip(names, dpids, strict=True)
        ]
        net.addLink(*switches)
        net.start()

        for name in names:
            ovs.wait_for(lambda n=name: ovs.controller_connected(n), 30, what=f"{name} to connect")
            assert ovs.run("ovs-vsctl", "get", "Bridge", name, "datapath_type").strip() == "netdev"
            assert ovs.run("ovs-vsctl", "get-fail-mode", name).strip() == "secure"
        for dpid in dpids:
            ovs.wait_for(
                lambda d=dpid: f"switch connected: dpid={d}" in ryu.log(),
                30,
                what=f"the controller to log dpid {dpid}",
            )
        for name in names:
            rules = ovs.wait_for(lambda n=name: ovs.flows(n), 30, what=f"flows on {name}")
            assert len(rules) == 1, rules
            cookie = parse_cookie(int(re.search(r"cookie=(0x[0-9a-f]+)", rules[0])[1], 16))
            assert cookie is not None and cookie.kind is RuleKind.DEFAULT_DROP, rules[0]
            assert "priority=0" in rules[0]
            assert rules[0].endswith("actions=drop")
    finally:
        net.stop()

    assert net_names.leftover_bridges() == []
    assert net_names.leftover_links() == []
