"""The control class on a real host's underlay: the spec ``typhoon cluster apply`` installs
(typhoon/control_queue.py), what ``check`` reads back, and the cluster file's key."""

from __future__ import annotations

import copy
import ipaddress
import struct

import pytest
import yaml

from typhoon import control_queue as cq
from typhoon import wire
from typhoon.cluster_file import ClusterFileError, parse_cluster_text
from typhoon.runtime import lb_credits as lb
from typhoon.runtime import links as lk
from typhoon.wire import Kind

A, B = wire.worker_mac(7, 1), wire.worker_mac(7, 2)


def credit(kind: int) -> bytes:
    grants = [wire.encode_credit(v) for v in (0, 5, 6)]
    return wire.pack_frames(B, A, Kind.CREDIT, kind, 3, grants)[0]


def data() -> bytes:
    return wire.pack_frames(B, A, Kind.DATA, 3, 0, [b"\x91\x91\x01"])[0]


def tunnelled(frame: bytes, version: int = 4, port: int = 4789, options: bool = False) -> bytes:
    """``frame`` in a VXLAN (or Geneve) packet as the underlay interface's qdisc sees it,
    from the outer IP header on (where u32 offsets count from)."""
    udp = struct.pack("!HHHH", 50000, port, 8 + 8 + len(frame), 0)
    payload = udp + b"\x08\0\0\0" + (4242 << 8).to_bytes(4, "big") + frame
    if version == 4:
        opts = b"\x01\x01\x01\x01" if options else b""
        ihl = 5 + len(opts) // 4
        hdr = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, 20 + len(opts) + len(payload), 0, 0,
                          64, 17, 0, bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])) + opts  # fmt: skip
    else:
        hdr = struct.pack("!IHBB", 6 << 28, len(payload), 17, 64)
        hdr += ipaddress.ip_address("fd00::1").packed + ipaddress.ip_address("fd00::2").packed
    return hdr + payload


def matches(packet: bytes, keys: list[cq.Match]) -> bool:
    """What the kernel's u32 does with the keys tc packs: 32-bit words at 4-aligned offsets."""
    for size, value, mask, off in keys:
        v, m, at = cq.tc_key(size, value, mask, off)
        if at < 0 or at + 4 > len(packet):
            return False
        if int.from_bytes(packet[at : at + 4], "big") & m != v:
            return False
    return True


def classified(link: cq.LinkQueueing, packet: bytes) -> list[int]:
    """The credit kinds whose control filter matches ``packet``."""
    return [k for k in cq.URGENT_CREDIT_KINDS if matches(packet, cq.control_matches(link, k))]


@pytest.mark.parametrize(("ftype", "version"), [("vxlan", 4), ("vxlan", 6), ("geneve", 4)])
def test_a_receivers_credit_frames_inside_a_tunnel_take_the_control_class(ftype, version):
    link = cq.tunnel_queueing("eth0", 900, ftype, version)
    port = cq.TUNNEL_UDP_PORT[ftype]
    for kind in cq.URGENT_CREDIT_KINDS:
        assert classified(link, tunnelled(credit(kind), version, port)) == [kind]
    for other in (credit(lk.SYNC), credit(lb.LB_SYNC), data()):
        assert classified(link, tunnelled(other, version, port)) == []


def test_the_outer_headers_must_be_the_tunnels():
    link = cq.tunnel_queueing("eth0", 900, "vxlan", 4)
    grant = credit(lk.GRANT)
    assert classified(link, tunnelled(grant, port=6081)) == []  # Geneve's port on a VXLAN fabric
    assert classified(link, tunnelled(grant, options=True)) == []  # IP options move the frame
    assert classified(link, tunnelled(grant)[:40]) == []  # cut short
    # the bare frame's offsets (an emulated link) do not read a tunnelled one
    bare = cq.LinkQueueing("s1-eth1", 100)
    assert classified(bare, tunnelled(grant)) == []


def test_tc_packs_matches_into_aligned_words_as_tc_filter_show_prints_them():
    # printed by iproute2 6.1 for: match u8 0x45 0xff at 0, match u16 0x88b5 0xffff at 48,
    # match u16 3 0xffff at 54
    assert cq.tc_key("u8", 0x45, 0xFF, 0) == (0x45000000, 0xFF000000, 0)
    assert cq.tc_key("u16", 0x88B5, 0xFFFF, 48) == (0x88B50000, 0xFFFF0000, 48)
    assert cq.tc_key("u16", 3, 0xFFFF, 54) == (3, 0xFFFF, 52)
    assert cq.tc_key("u8", 2, 0xFF, 51) == (2, 0xFF, 48)  # the word's last byte
    assert cq.tc_key("u8", 2, 0xFF, 9) == (0x20000, 0xFF0000, 8)
    # one word, one key: the EtherType and the kind of a tunnelled frame
    keys = cq.tc_keys([("u16", 0x88B5, 0xFFFF, 48), ("u8", 2, 0xFF, 51)])
    assert keys == {(0x88B50002, 0xFFFF00FF, 48)}


def test_the_host_commands_shape_the_interface_then_split_it_as_the_emulation_does():
    link = cq.tunnel_queueing("eth0", 900, "vxlan", 4)
    cmds = cq.host_commands(link)
    assert cmds[0] == ["tc", "qdisc", "add", "dev", "eth0", "root", "handle", "5:", "htb",
                       "default", "20"]  # fmt: skip
    assert cmds[1] == ["tc", "class", "add", "dev", "eth0", "parent", "5:", "classid", "5:1",
                       "htb", "rate", "900mbit", "ceil", "900mbit"]  # fmt: skip
    assert cmds[2:] == cq.tc_commands(link)
    first = " ".join(cmds[4])
    assert "match u8 69 0xff at 0 match u8 17 0xff at 9 match u16 0x12b5 0xffff at 22" in first
    assert f"match u16 {wire.ETHERTYPE:#06x} 0xffff at 48" in first
    assert f"match u8 {int(Kind.CREDIT)} 0xff at 51 match u16 {lk.GRANT} 0xffff at 54" in first
    assert cq.removal(link) == ["tc", "qdisc", "del", "dev", "eth0", "root"]
    assert all(isinstance(a, str) for c in cmds for a in c)


@pytest.mark.parametrize("name", ["", "-rf", "eth0;reboot", "a b", "x" * 16, "../eth0", "e/0"])
def test_only_interface_names_reach_tc(name):
    with pytest.raises(ValueError, match="not an interface name"):
        cq.LinkQueueing(name, 100)


@pytest.mark.parametrize("rate", [0, -5])
def test_a_class_needs_a_rate(rate):
    with pytest.raises(ValueError, match="positive rate"):
        cq.LinkQueueing("eth0", rate)


def listing(link: cq.LinkQueueing, drop_filter: int | None = None) -> tuple[str, str, str]:
    """``tc qdisc/class/filter show`` of an interface with the control class, in tc's format."""
    control, data_cls = cq.classes(link)
    qdiscs = "qdisc htb 5: root refcnt 2 r2q 10 default 0x20 direct_packets_stat 0\n"
    classes = "".join(
        f"class htb {c} {p} prio 0 rate 90Mbit ceil 900Mbit burst 1600b cburst 1575b \n"
        f" Sent 4000 bytes {n} pkt (dropped 0, overlimits 0 requeues 0) \n backlog 0b 0p\n\n"
        for c, p, n in (("5:1", "root", 19), (control, "parent 5:1", 7),
                        (data_cls, "parent 5:1", 12))
    )  # fmt: skip
    filters = ""
    rules = [(control, cq.control_matches(link, k)) for k in cq.URGENT_CREDIT_KINDS]
    rules.append((data_cls, [("u32", 0, 0, 0)]))
    for pref, (flow, keys) in enumerate(rules, start=1):
        if pref == drop_filter:
            continue
        filters += (f"filter protocol all pref {pref} u32 chain 0 \n"
                    f"filter protocol all pref {pref} u32 chain 0 fh 80{pref}: ht divisor 1 \n"
                    f"filter protocol all pref {pref} u32 chain 0 fh 80{pref}::800 order 2048 "
                    f"key ht 80{pref} bkt 0 *flowid {flow} not_in_hw \n")  # fmt: skip
        for v, m, at in sorted(cq.tc_keys(keys), key=lambda k: k[2]):
            filters += f"  match {v:08x}/{m:08x} at {at}\n"
    return qdiscs, classes, filters


def test_check_finds_nothing_wrong_with_what_apply_installs():
    link = cq.tunnel_queueing("eth0", 900, "vxlan", 4)
    qd, cl, fi = listing(link)
    assert cq.problems(link, qd, cl, fi) == []
    assert cq.class_packets(cl) == {"5:1": 19, "5:10": 7, "5:20": 12}


def test_check_names_what_is_missing():
    link = cq.tunnel_queueing("eth0", 900, "vxlan", 4)
    qd, cl, fi = listing(link, drop_filter=2)
    assert cq.problems(link, qd, cl, fi) == [
        f"control class on eth0: no filter sends credit kind {lk.NACK} to 5:10 (run apply)"
    ]
    assert cq.problems(link, "qdisc fq_codel 0: root refcnt 2\n", "", "") == [
        "control class on eth0 missing: no htb root 5: (run apply)"
    ]
    no_data = "\n\n".join(b for b in cl.split("\n\n") if "5:20" not in b)
    assert cq.problems(link, qd, no_data, listing(link)[2]) == [
        "control class on eth0: data class 5:20 under 5:1 missing (run apply)"
    ]
    # the same filters with the bare frame's offsets are not the tunnel's
    bare = listing(cq.LinkQueueing("eth0", 900))[2]
    assert len(cq.problems(link, qd, cl, bare)) == len(cq.URGENT_CREDIT_KINDS)


BASE = {
    "controller": "tcp:10.0.0.1:6653",
    "coordinator": "zk://10.0.0.1:2181/typhoon",
    "fabric": {"type": "vxlan", "mtu": 1500, "control_class": {"rate_mbit": 900}},
    "hosts": {
        "h1": {"address": "10.0.0.1", "bridge": "br-ty", "dpid": 1},
        "h2": {"address": "10.0.0.2", "bridge": "br-ty", "dpid": 2},
    },
}


def parse(**fabric):
    doc = copy.deepcopy(BASE)
    doc["fabric"].update(fabric)
    return parse_cluster_text(yaml.safe_dump(doc), "c.yaml")


def test_the_cluster_file_asks_for_the_control_class():
    assert parse().control_rate_mbit == 900.0
    assert parse(control_class={"rate_mbit": 2.5}).control_rate_mbit == 2.5
    assert parse_cluster_text(yaml.safe_dump({**BASE, "fabric": {"type": "vxlan", "mtu": 1500}}),
                              "c.yaml").control_rate_mbit is None  # fmt: skip
    assert parse().ip_version() == 4


@pytest.mark.parametrize(
    ("fabric", "message"),
    [
        ({"control_class": {"rate_mbit": 0}}, "control_class.rate_mbit: must be a number"),
        ({"control_class": {"rate_mbit": True}}, "control_class.rate_mbit: must be a number"),
        ({"control_class": {"rate_mbit": "1g"}}, "control_class.rate_mbit: must be a number"),
        ({"control_class": {"rate": 9}}, "unknown key 'rate'; did you mean 'rate_mbit'?"),
        ({"control_class": {"rate_mbit": 9}, "ipsec": {"psk_file": "/etc/k"}},
         "cannot tell credit frames from data inside IPsec"),
    ],
)  # fmt: skip
def test_a_control_class_the_fabric_cannot_have_is_refused(fabric, message):
    with pytest.raises(ClusterFileError, match=message):
        parse(**fabric)
