"""The fabric's protection, pure: the nftables ruleset, its listing, the IPsec options, the
cluster file's keys and what check says.  The rules on a real kernel:
tests/integration/test_fabric_firewall.py."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from typhoon import fabric_guard
from typhoon.bridge_plan import HIDDEN, BridgeState, PortState, bridge_plan, problems, shown
from typhoon.cluster_file import ClusterFileError, parse_cluster_text

BASE = {
    "controller": "tcp:10.0.0.1:6653",
    "coordinator": "zk://10.0.0.1:2181/typhoon",
    "fabric": {"type": "vxlan", "mtu": 1500, "key": 42},
    "hosts": {
        "h1": {"address": "10.0.0.1", "bridge": "br-ty", "dpid": 1},
        "h2": {"address": "10.0.0.2", "bridge": "br-ty", "dpid": 2},
        "h3": {"address": "10.0.0.3", "bridge": "br-ty", "dpid": 3},
    },
}


def cluster(**fabric):
    doc = copy.deepcopy(BASE)
    doc["fabric"].update(fabric)
    return parse_cluster_text(yaml.safe_dump(doc), "c.yaml")


# what `nft -j list table inet typhoon_fabric` printed for h1's table (nftables 1.0.6)
LISTING = {"nftables": [
    {"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
    {"table": {"family": "inet", "name": "typhoon_fabric", "handle": 3}},
    {"set": {"family": "inet", "name": "peers4", "table": "typhoon_fabric",
             "type": "ipv4_addr", "handle": 2, "elem": ["10.0.0.2", "10.0.0.3"]}},
    {"set": {"family": "inet", "name": "peers6", "table": "typhoon_fabric",
             "type": "ipv6_addr", "handle": 3}},
    {"chain": {"family": "inet", "table": "typhoon_fabric", "name": "input", "handle": 1,
               "type": "filter", "hook": "input", "prio": -10, "policy": "accept"}},
    {"rule": {"family": "inet", "table": "typhoon_fabric", "chain": "input", "handle": 5,
              "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "udp",
                        "field": "dport"}}, "right": {"set": [4789, 6081]}}},
                       {"match": {"op": "==", "left": {"payload": {"protocol": "ip",
                        "field": "saddr"}}, "right": "@peers4"}}, {"accept": None}]}},
    {"rule": {"family": "inet", "table": "typhoon_fabric", "chain": "input", "handle": 9,
              "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "udp",
                        "field": "dport"}}, "right": {"set": [4789, 6081]}}},
                       {"counter": {"packets": 7, "bytes": 700}}, {"drop": None}]}},
]}  # fmt: skip


def test_the_ruleset_accepts_tunnel_udp_from_the_other_hosts_only():
    script = fabric_guard.ruleset(cluster(), "h2")
    assert script.splitlines()[:3] == [
        "add table inet typhoon_fabric",  # then deleted and made again: one transaction
        "delete table inet typhoon_fabric",
        "table inet typhoon_fabric {",
    ]
    assert "set peers4 { type ipv4_addr; elements = { 10.0.0.1, 10.0.0.3 }; }" in script
    assert "10.0.0.2" not in script  # not itself
    assert "udp dport { 4789, 6081 } ip saddr @peers4 accept" in script
    assert script.rstrip().splitlines()[-3:] == [
        "    udp dport { 4789, 6081 } counter drop", "  }", "}"
    ]  # fmt: skip
    assert fabric_guard.removal() == (
        "add table inet typhoon_fabric\ndelete table inet typhoon_fabric\n"
    )


def test_ipv6_peers_go_in_their_own_set():
    doc = copy.deepcopy(BASE)
    for i, h in enumerate(doc["hosts"].values(), 1):
        h["address"] = f"2001:db8::{i}"
    cf = parse_cluster_text(yaml.safe_dump(doc), "c.yaml")
    script = fabric_guard.ruleset(cf, "h1")
    assert "set peers6 { type ipv6_addr; elements = { 2001:db8::2, 2001:db8::3 }; }" in script
    assert "set peers4 { type ipv4_addr; }" in script


def test_the_listing_is_read_back_and_compared_with_the_file():
    state = fabric_guard.parse_listing(json.dumps(LISTING))
    assert (state.peers, state.hooked, state.drops, state.dropped) == (
        {"10.0.0.2", "10.0.0.3"}, True, True, 7
    )  # fmt: skip
    cf = cluster()
    assert fabric_guard.firewall_problems(cf, "h1", state, nft_found=True) == []
    assert fabric_guard.firewall_problems(cf, "h2", state, nft_found=True) == [
        "fabric firewall inet typhoon_fabric differs from the file (run apply)"
    ]
    assert fabric_guard.firewall_problems(cf, "h1", fabric_guard.FirewallState(), True) == [
        "fabric firewall missing: nftables table inet typhoon_fabric (run apply)"
    ]
    assert fabric_guard.firewall_problems(cf, "h1", None, nft_found=False) == [
        "the fabric firewall needs nftables (the nft command is not installed): install it, "
        "or set fabric.firewall: false in c.yaml to trust the underlay"
    ]
    assert fabric_guard.firewall_problems(cluster(firewall=False), "h1", None, False) == []


def test_check_says_which_protection_is_active():
    cf = cluster()
    assert fabric_guard.protection(cf, "h1", True, False, dropped=7) == (
        "fabric protection: nftables (tunnel UDP from the file's 2 peer(s) only, 7 dropped)"
    )
    assert fabric_guard.protection(cluster(firewall=False), "h1", False, False) == (
        "fabric protection: none: the underlay is trusted (fabric.firewall: false)"
    )
    ipsec = cluster(ipsec={"psk_file": "/etc/typhoon/fabric-psk"})
    assert fabric_guard.protection(ipsec, "h1", True, True).endswith(
        "; IPsec on every tunnel (pre-shared key)"
    )
    doc = copy.deepcopy(BASE)
    doc["hosts"]["h1"]["datapath"] = "netdev"
    netdev = parse_cluster_text(yaml.safe_dump(doc), "c.yaml")
    assert "datapath netdev tunnels bypass it" in fabric_guard.protection(netdev, "h1", True, False)
    assert fabric_guard.protection(netdev, "h2", True, False).startswith("fabric protection: nft")


@pytest.mark.parametrize(
    ("fabric", "message"),
    [
        ({"firewall": "yes"}, "fabric.firewall: must be true or false, not 'yes'"),
        ({"ipsec": {"psk": "x"}}, "fabric.ipsec: unknown key 'psk' (known: psk_file)"),
        ({"ipsec": {"psk_file": "psk"}}, "fabric.ipsec.psk_file: must be an absolute path"),
        ({"firewal": False}, "fabric: unknown key 'firewal'; did you mean 'firewall'?"),
    ],
)
def test_bad_protection_keys(fabric, message):
    with pytest.raises(ClusterFileError, match=re.escape(message)):
        cluster(**fabric)


def test_ipsec_needs_tunnels_and_the_kernel_datapath():
    doc = copy.deepcopy(BASE)
    doc["hosts"]["h3"]["datapath"] = "netdev"
    doc["fabric"]["ipsec"] = {"psk_file": "/k"}
    with pytest.raises(ClusterFileError, match="IPsec needs the kernel datapath; h3 use"):
        parse_cluster_text(yaml.safe_dump(doc), "c.yaml")
    doc = copy.deepcopy(BASE)
    doc["fabric"] = {"type": "ports", "mtu": 1500, "ipsec": {"psk_file": "/k"}}
    doc["links"] = [["h1:eth1", "h2:eth1"]]
    with pytest.raises(ClusterFileError, match="a ports fabric has no tunnels to encrypt"):
        parse_cluster_text(yaml.safe_dump(doc), "c.yaml")


def test_ipsec_tunnels_carry_the_key_which_is_never_shown():
    cf = cluster(ipsec={"psk_file": "/etc/typhoon/fabric-psk"})
    cmds = bridge_plan(cf, "h1", None, psk="s3cret-psk")
    tunnels = [c for c in cmds if "add-port" in c]
    assert all(c[-1] == "options:psk=s3cret-psk" for c in tunnels) and len(tunnels) == 2
    assert all("s3cret" not in " ".join(shown(c)) for c in cmds)
    assert shown(tunnels[0])[-1] == f"options:psk={HIDDEN}"
    state = BridgeState("br-ty", exists=True, dpid=1, fail_mode="secure",
                        protocols=["OpenFlow13"], controllers=list(cf.controllers))  # fmt: skip
    for name, port, ip in (("tyt2", 2, "10.0.0.2"), ("tyt3", 3, "10.0.0.3")):
        state.ports[name] = PortState(name, "vxlan", port, {"remote_ip": ip, "psk": "old"})
    assert problems(cf, "h1", state, psk="s3cret-psk") == [
        "tunnel tyt2 to h2 is not IPsec with the key of /etc/typhoon/fabric-psk (run apply)",
        "tunnel tyt3 to h3 is not IPsec with the key of /etc/typhoon/fabric-psk (run apply)",
    ]
    plain = cluster()
    assert problems(plain, "h1", state)[0] == (
        "tunnel tyt2 to h2 has an IPsec key the file does not set (run apply)"
    )
    off = [c for c in bridge_plan(plain, "h1", state) if c[1] == "remove"]
    assert off == [
        ["ovs-vsctl", "remove", "Interface", "tyt2", "options", "psk"],
        ["ovs-vsctl", "remove", "Interface", "tyt3", "options", "psk"],
    ]
