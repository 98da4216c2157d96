"""mininet_env/topo.py: the Mininet topology numbers fabric ports as FabricPlan promises."""

from __future__ import annotations

import pytest

from mininet_env.fabric import FabricPlan
from mininet_env.topo import FabricTopo


def fabric_ports(topo: FabricTopo, plan: FabricPlan) -> set[tuple[str, int, str, int]]:
    host_of = {plan.bridge(i): f"h{i}" for i in range(1, plan.hosts + 1)}
    out = set()
    for a, b, info in topo.links(withInfo=True):
        if a in host_of and b in host_of:
            out.add((host_of[a], info["port1"], host_of[b], info["port2"]))
    return out


@pytest.mark.parametrize("shape", ["mesh", "line", "star"])
@pytest.mark.parametrize("hosts", [1, 2, 4])
def test_fabric_ports_match_the_plans_cluster(shape: str, hosts: int) -> None:
    plan = FabricPlan(hosts, shape, prefix="tq")
    namespaces = {i: (f"tqh{i}", {"ip": f"10.9.0.{i}/24"}) for i in range(1, hosts + 1)}
    for topo in (FabricTopo(plan), FabricTopo(plan, namespaces)):
        planned = {(x.a, x.a_port, x.b, x.b_port) for x in plan.cluster().links}
        assert fabric_ports(topo, plan) == planned
        assert topo.switches() == sorted(plan.bridge(i) for i in range(1, hosts + 1))
        for i in range(1, hosts + 1):
            assert topo.nodeInfo(plan.bridge(i))["dpid"] == f"{plan.dpid(i):016x}"


def test_namespaces_hang_off_their_own_bridge_after_the_fabric_links() -> None:
    plan = FabricPlan(3, "mesh", prefix="tq")
    namespaces = {i: (f"tqh{i}", {"ip": f"10.9.0.{i}/24", "mac": f"02:00:00:00:00:{i:02x}"})
                  for i in (1, 2, 3)}  # fmt: skip
    topo = FabricTopo(plan, namespaces)
    assert topo.hosts() == ["tqh1", "tqh2", "tqh3"]
    assert topo.nodeInfo("tqh2") == {"ip": "10.9.0.2/24", "mac": "02:00:00:00:00:02"}
    # each bridge: two fabric links (ports 1, 2), then its host on port 3
    assert topo.port("tqh2", "tq2") == (0, 3)
    assert not topo.shaped


def test_shaped_links_carry_the_plans_bandwidth_and_delay() -> None:
    plan = FabricPlan(2, "line", prefix="tq", bw_mbit=100.0, delay="1ms")
    topo = FabricTopo(plan)
    ((_, _, info),) = topo.links(withInfo=True)
    assert (info["bw"], info["delay"]) == (100.0, "1ms") and topo.shaped
