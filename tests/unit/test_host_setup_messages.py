"""`typhoon cluster apply|check` name a missing kernel datapath as the cause, with the fix."""

from __future__ import annotations

from typhoon import host_setup
from typhoon.bridge_plan import BridgeState

CONSEQUENCES = [
    "bridge br-typhoon has DPID none, the file says 0x2",
    "tunnel tyt1 (to h1) is OpenFlow port None, not 1",
    "controller tcp:10.0.0.1:6653 unreachable: connection refused",
]


def test_no_kernel_module_is_said_directly_with_datapath_netdev(tmp_path, monkeypatch):
    monkeypatch.setattr(host_setup, "KERNEL_MODULE", tmp_path / "openvswitch")  # absent
    state = BridgeState("br-typhoon", exists=True, dpid=None, datapath_type="system")
    found = host_setup.without_datapath(state, CONSEQUENCES)
    assert found == [
        "bridge br-typhoon has no datapath: datapath: system needs the openvswitch kernel "
        "module, which is not loaded on this host (modprobe openvswitch); or set datapath: "
        "netdev for this host in the cluster file (Open vSwitch's userspace datapath: tunnels "
        "then need the underlay address on a bridge of its own, br-phy, docs/deploy.md "
        "section 2)",
        CONSEQUENCES[2],  # not a consequence: kept
    ]


def test_other_datapath_failures_point_at_the_log(tmp_path, monkeypatch):
    (tmp_path / "openvswitch").mkdir()
    monkeypatch.setattr(host_setup, "KERNEL_MODULE", tmp_path / "openvswitch")
    state = BridgeState("br-typhoon", exists=True, dpid=None, datapath_type="system")
    assert host_setup.without_datapath(state, CONSEQUENCES)[0] == (
        "bridge br-typhoon has no datapath: Open vSwitch could not create its system "
        "datapath (see ovs-vswitchd.log)"
    )


def test_a_bridge_with_a_datapath_keeps_its_problems_as_they_are():
    state = BridgeState("br-typhoon", exists=True, dpid=2, datapath_type="system")
    assert host_setup.without_datapath(state, CONSEQUENCES) == CONSEQUENCES
    assert host_setup.without_datapath(BridgeState("br-typhoon"), ["x"]) == ["x"]
