"""`typhoon cluster apply|check FILE` against the real Open vSwitch and ZooKeeper.

The bridge is the test's own (net_names prefix), the controller a real
ryu-manager, the coordinator a real ZooKeeper server; the two peers are
TEST-NET addresses that only appear as tunnel endpoints.  apply also installs
the fabric firewall (an nftables table of its own, here in the root namespace:
the test removes it with ``typhoon cluster teardown``, and in any case at its
end); what the filter lets through is tests/integration/test_fabric_firewall.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run

from typhoon.cluster import Cluster
from typhoon.coordinator import open_coordinator


def typhoon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "typhoon_cli", *args],
        capture_output=True, text=True, timeout=60, cwd=REPO, env=os.environ.copy(),
    )  # fmt: skip


def write(path: Path, bridge: str, dpid: int, ofp_port: int, zk: str, mtu: int = 1500,
          peers: int = 2) -> Path:  # fmt: skip
    me = {"address": "198.51.100.1", "bridge": bridge, "dpid": dpid, "datapath": "netdev"}
    hosts = {"t1": me}
    for i in range(2, peers + 2):
        hosts[f"t{i}"] = {"address": f"198.51.100.{i}", "bridge": "br-ty", "dpid": dpid + i}
    doc = {
        "controller": f"tcp:127.0.0.1:{ofp_port}",
        "coordinator": zk,
        "fabric": {"type": "vxlan", "mtu": mtu, "key": 77},
        "hosts": hosts,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def vsctl(*args: str) -> str:
    """ovs-vsctl's answer, without the quotes it puts around some strings."""
    return run("ovs-vsctl", *args).strip().strip('"')


NETDEV = (
    "t1: fabric protection: nftables filter installed, but datapath netdev tunnels bypass it "
    "(userspace tunneling reads the underlay NIC itself)"
)


@pytest.fixture
def fabric_table():
    """The root namespace's fabric table is this test's while it runs: gone afterwards."""
    yield
    run("nft", "delete", "table", "inet", "typhoon_fabric", check=False)


def test_apply_then_check(tmp_path, net_names, ryu_manager, zookeeper_server, ovs, fabric_table):
    bridge = net_names.switch("c")
    dpid = int(net_names.dpid(1), 16)
    # the underlay: the peers are routed through a veth of the test, MTU 1500
    underlay, other_end = net_names.switch("u"), net_names.switch("v")
    run("ip", "link", "add", underlay, "mtu", "1500", "type", "veth", "peer", "name", other_end)
    run("ip", "link", "set", other_end, "up")
    run("ip", "link", "set", underlay, "up")
    run("ip", "route", "add", "198.51.100.0/24", "dev", underlay)
    ryu = ryu_manager("ryu.app.simple_switch_13")
    zk = f"zk://{zookeeper_server.hosts}/typhoon-apply-{net_names.token}"
    cfile = write(tmp_path / "cluster.yaml", bridge, dpid, ryu.ofp_port, zk)

    before = typhoon("cluster", "check", str(cfile), "--host", "t1")
    assert before.returncode == 1, before
    assert f"t1: bridge {bridge} missing" in before.stdout

    applied = typhoon("cluster", "apply", str(cfile), "--host", "t1")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert vsctl("get", "Bridge", bridge, "datapath_id") == f"{dpid:016x}"
    assert vsctl("get", "Bridge", bridge, "fail_mode") == "secure"
    assert vsctl("get", "Bridge", bridge, "protocols") == "[OpenFlow13]"
    assert vsctl("get", "Bridge", bridge, "datapath_type") == "netdev"
    assert vsctl("get-controller", bridge) == f"tcp:127.0.0.1:{ryu.ofp_port}"
    assert sorted(vsctl("list-ports", bridge).split()) == ["tyt2", "tyt3"]
    assert vsctl("get", "Interface", "tyt3", "ofport") == "3"
    assert vsctl("get", "Interface", "tyt3", "type") == "vxlan"
    assert vsctl("get", "Interface", "tyt3", "options:remote_ip") == "198.51.100.3"
    assert vsctl("get", "Interface", "tyt3", "options:key") == "77"
    ovs.wait_for(lambda: ovs.controller_connected(bridge), 20, what="the controller connection")

    # recorded in ZooKeeper: the cluster (with the frame MTU) and the host
    with open_coordinator(zk) as c:
        cluster = c.get_cluster()
        record = c.get("hosts/t1")
    assert isinstance(cluster, Cluster) and cluster.mtu == 1450
    assert cluster.hosts["t1"].bridge == bridge and cluster.hosts["t3"].address == "198.51.100.3"
    assert record["bridge"] == bridge and record["dpid"] == dpid

    # the fabric filter: tunnel UDP from the two peers only (a table of its own)
    table = json.loads(run("nft", "-j", "list", "table", "inet", "typhoon_fabric"))
    peers = [i["set"].get("elem", []) for i in table["nftables"] if "set" in i]
    assert sorted(sum(peers, [])) == ["198.51.100.2", "198.51.100.3"]

    ok = typhoon("cluster", "check", str(cfile), "--host", "t1")
    assert (ok.returncode, ok.stdout) == (0, f"{NETDEV}\nt1: ok\n"), ok.stdout + ok.stderr

    # idempotent: a second apply leaves every port where it was
    uuid = vsctl("get", "Interface", "tyt2", "_uuid")
    again = typhoon("cluster", "apply", str(cfile), "--host", "t1")
    assert again.returncode == 0, again.stdout + again.stderr
    assert vsctl("get", "Interface", "tyt2", "_uuid") == uuid

    # break it: check names each problem on a line of its own
    vsctl(
        "set", "Bridge", bridge, "other-config:datapath-id=00000000000000ff", "fail_mode=standalone"
    )
    vsctl("del-port", bridge, "tyt2")
    run("ip", "link", "set", underlay, "mtu", "1400")
    ovs.wait_for(lambda: ovs.controller_connected(bridge), 20, what="the reconnection")
    bad = typhoon("cluster", "check", str(cfile), "--host", "t1")
    assert bad.returncode == 1
    assert bad.stdout.splitlines() == [
        NETDEV,
        f"t1: bridge {bridge} has DPID 0xff, the file says {dpid:#x}",
        f"t1: bridge {bridge} fail_mode is standalone, not secure",
        "t1: tunnel tyt2 to t2 missing",
        "t1: MTU too small: the path to t3 (198.51.100.3) has MTU 1400, the fabric needs 1500",
    ]
    run("ip", "link", "set", underlay, "mtu", "1500")

    # a smaller cluster: apply removes the tunnel the file no longer names
    small = write(tmp_path / "small.yaml", bridge, dpid, ryu.ofp_port, zk, peers=1)
    stale = typhoon("cluster", "check", str(small), "--host", "t1").stdout.splitlines()
    assert "t1: the coordinator's cluster differs from the file (run apply)" in stale
    assert "t1: tunnel tyt3 is not in the file (apply removes it)" in stale
    assert typhoon("cluster", "apply", str(small), "--host", "t1").returncode == 0
    assert vsctl("list-ports", bridge).split() == ["tyt2"]
    assert vsctl("get", "Bridge", bridge, "fail_mode") == "secure"

    run("nft", "delete", "table", "inet", "typhoon_fabric")
    unguarded = typhoon("cluster", "check", str(small), "--host", "t1").stdout.splitlines()
    assert unguarded[0] == "t1: fabric protection: none: the underlay is trusted"
    assert "t1: fabric firewall missing: nftables table inet typhoon_fabric (run apply)" in (
        unguarded
    )

    ryu.stop()
    gone = typhoon("cluster", "check", str(small), "--host", "t1")
    assert gone.returncode == 1
    assert f"t1: controller tcp:127.0.0.1:{ryu.ofp_port} unreachable: Connection refused" in (
        gone.stdout.splitlines()
    ), gone.stdout

    # teardown undoes apply: the bridge with its tunnels, and the fabric filter
    again = typhoon("cluster", "apply", str(small), "--host", "t1")  # the controller is gone
    assert again.returncode == 0, again.stdout + again.stderr
    assert run("nft", "list", "tables").count("typhoon_fabric") == 1
    down = typhoon("cluster", "teardown", str(small), "--host", "t1")
    assert down.returncode == 0, down.stdout + down.stderr
    assert bridge not in run("ovs-vsctl", "list-br").split()
    assert "typhoon_fabric" not in run("nft", "list", "tables")


def test_bad_file_is_a_usage_error(tmp_path):
    cfile = tmp_path / "c.yaml"
    cfile.write_text(yaml.safe_dump({"controler": "tcp:1.2.3.4:6653"}))
    out = typhoon("cluster", "check", str(cfile))
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"error: {cfile}: top level: unknown key 'controler'; did you mean 'controller'?"
    )
