"""Scapy layer and pcap reader: frames built by typhoon.wire, read back from captures."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, CookedLinux, CookedLinuxV2, Dot1Q, Ether
from scapy.packet import Padding, Raw
from scapy.utils import wrpcap, wrpcapng

from typhoon.dissect import (
    DLT_LINUX_SLL,
    DLT_LINUX_SLL2,
    PcapTuple,
    Typhoon,
    TyphoonEntry,
    decode_tuples,
    read_pcap_tuples,
)
from typhoon.wire import (
    ETH_HLEN,
    ETHERTYPE,
    SEG,
    SEG_FIRST,
    SEG_LAST,
    Control,
    ControlTuple,
    Frame,
    Kind,
    Reassembler,
    WireError,
    controller_mac,
    decode_frame,
    encode_control,
    encode_credit,
    encode_frame,
    encode_rows,
    mac_str,
    multicast_mac,
    pack_frames,
    worker_mac,
)

APP = 0x0A
SRC = worker_mac(APP, 1)
DST = worker_mac(APP, 2)
GROUP = multicast_mac(APP, 4)
CTRL = controller_mac(APP)
SIGNAL = ControlTuple(Control.SIGNAL, {"version": 3})
RATE = ControlTuple(Control.INPUT_RATE, {"rate": 250.0})
BIG = ["blob", random.Random(5).randbytes(30_000)]


def traffic(mtu: int = 1500, ethertype: int = ETHERTYPE) -> tuple[list[bytes], list[PcapTuple]]:
    """A little capture's worth of frames and what read_pcap_tuples should make of them."""
    frames: list[bytes] = []
    expected: list[PcapTuple] = []

    def add(dst, src, kind, stream, payloads, values, seq):
        new = pack_frames(dst, src, kind, stream, seq, payloads, mtu=mtu, ethertype=ethertype)
        for i, _ in enumerate(new):
            done = values if i == len(new) - 1 else []
            expected.append(PcapTuple(mac_str(src), mac_str(dst), kind, stream, seq + i, done))
        frames.extend(new)
        return seq + len(new)

    small = [[i, f"word{i}", i / 2] for i in range(40)]
    seq = add(DST, SRC, Kind.DATA, 1, [encode_rows([t]) for t in small[:20]], small[:20], 0)
    seq = add(DST, SRC, Kind.DATA, 1, [encode_rows([BIG])], [BIG], seq)
    add(DST, SRC, Kind.DATA, 1, [encode_rows([t]) for t in small[20:]], small[20:], seq)
    add(GROUP, SRC, Kind.DATA, 4, [encode_rows([["all", 1]])], [["all", 1]], 100)
    controls = [encode_control(SIGNAL), encode_control(RATE)]
    add(DST, CTRL, Kind.CONTROL, 0, controls, [SIGNAL, RATE], 7)
    add(SRC, DST, Kind.CREDIT, 1, [encode_credit(64)], [64], 0)
    return frames, expected


# ------------------------------------------------------------------ the scapy layer


def test_layer_dissects_header_and_entries() -> None:
    payloads = [encode_rows([[1, "a"]]), b"", encode_rows([[2.5]])]
    buf = pack_frames(DST, SRC, Kind.DATA, 9, 1234, payloads)[0]
    pkt = Ether(buf)
    t = pkt[Typhoon]
    assert (t.version, t.kind, int(t.flags), t.reserved) == (2, Kind.DATA, 0, 0)
    assert (t.stream, t.seq, t.count, t.total) == (9, 1234, 3, None)
    assert [e.data for e in t.entries] == payloads
    assert [e.len for e in t.entries] == [len(p) for p in payloads]
    assert Padding not in pkt and Raw not in pkt
    assert "Typhoon DATA stream=9 seq=1234" in pkt.summary()


def test_layer_dissects_segments() -> None:
    frames = [Ether(f)[Typhoon] for f in pack_frames(DST, SRC, 0, 1, 0, [bytes(5000)], mtu=1500)]
    assert [int(t.flags) for t in frames] == [SEG | SEG_FIRST, SEG, SEG, SEG | SEG_LAST]
    assert frames[0].flags.SEG_FIRST and frames[-1].flags.SEG_LAST
    assert frames[0].total == 5000 and frames[1].total is None
    assert sum(len(t.entries[0].data) for t in frames) == 5000


def test_layer_shows_padding_separately() -> None:
    short = pack_frames(SRC, DST, Kind.CREDIT, 1, 0, [encode_credit(8)])[0]
    pkt = Ether(short + bytes(60 - len(short)))
    assert pkt[TyphoonEntry].data == encode_credit(8)
    assert pkt[Padding].load == bytes(60 - len(short))
    assert decode_tuples(pkt) == [8]


def test_scapy_built_frame_is_wire_format() -> None:
    body = encode_control(SIGNAL)
    pkt = Ether(dst=mac_str(DST), src=mac_str(CTRL)) / Typhoon(
        kind=Kind.CONTROL, stream=2, seq=3, entries=[TyphoonEntry(data=body)]
    )
    assert bytes(pkt) == encode_frame(Frame(DST, CTRL, Kind.CONTROL, 2, 3, 0, [body]))
    assert decode_tuples(Ether(bytes(pkt))) == [SIGNAL]
    seg = Ether(dst=mac_str(DST), src=mac_str(SRC)) / Typhoon(
        flags="SEG+SEG_FIRST", total=10, entries=[TyphoonEntry(data=b"abc")]
    )
    assert decode_frame(bytes(seg)).total == 10


@given(
    st.sampled_from(Kind),
    st.integers(0, 0xFFFF),
    st.integers(0, 2**32 - 1),
    st.lists(st.binary(max_size=200), max_size=10),
)
def test_layer_rebuilds_identical_bytes(kind, stream, seq, payloads) -> None:
    buf = encode_frame(Frame(DST, SRC, kind, stream, seq, 0, payloads))
    pkt = Ether(buf)
    assert bytes(pkt) == buf
    assert [e.data for e in pkt[Typhoon].entries] == payloads


# ------------------------------------------------------------------ decode_tuples


def test_decode_tuples_all_kinds() -> None:
    frames, expected = traffic()
    unsegmented = [(f, e) for f, e in zip(frames, expected, strict=True) if not f[16] & SEG]
    for buf, exp in unsegmented:
        assert decode_tuples(Ether(buf)) == exp.decoded


def test_decode_tuples_segments_need_a_reassembler() -> None:
    frames = pack_frames(DST, SRC, 0, 1, 0, [encode_rows([BIG])], mtu=1500)
    pkts = [Ether(f) for f in frames]
    with pytest.raises(WireError):
        decode_tuples(pkts[0])
    r = Reassembler()
    results = [decode_tuples(p, r) for p in pkts]
    assert results[:-1] == [[]] * (len(pkts) - 1) and results[-1] == [BIG]


def test_decode_tuples_rejects_other_and_malformed_packets() -> None:
    with pytest.raises(WireError):
        decode_tuples(Ether() / IP() / UDP())
    bad = bytearray(pack_frames(DST, SRC, 0, 1, 0, [encode_rows([[1]])])[0])
    bad[14] = 9  # version
    with pytest.raises(WireError):
        decode_tuples(Ether(bytes(bad)))
    garbage = pack_frames(DST, SRC, 0, 1, 0, [b"\xc1"])[0]  # not msgpack
    e = pytest.raises(WireError, decode_tuples, Ether(garbage))
    assert type(e.value) is WireError


# ------------------------------------------------------------------ pcaps


def write(path: Path, frames: list[bytes], others: bool = True) -> None:
    pkts = [Ether(f) for f in frames]
    if others:  # unrelated traffic is skipped
        pkts.insert(0, Ether() / ARP())
        pkts.insert(3, Ether() / IP() / UDP() / b"x")
    wrpcap(str(path), pkts)


def test_read_pcap_tuples(tmp_path: Path) -> None:
    frames, expected = traffic()
    write(tmp_path / "t.pcap", frames)
    got = list(read_pcap_tuples(tmp_path / "t.pcap"))  # a Path works as well as a str
    assert got == expected
    assert any(len(r.decoded) > 1 for r in got)  # batching happened
    assert sum(1 for r in got if r.decoded == [BIG]) == 1


def test_read_pcapng(tmp_path: Path) -> None:
    frames, expected = traffic(mtu=9000)
    wrpcapng(str(tmp_path / "t.pcapng"), [Ether(f) for f in frames])
    assert list(read_pcap_tuples(str(tmp_path / "t.pcapng"))) == expected


def test_read_custom_ethertype(tmp_path: Path) -> None:
    frames, expected = traffic(ethertype=0xFFFF)
    write(tmp_path / "t.pcap", frames)
    assert list(read_pcap_tuples(str(tmp_path / "t.pcap"), ethertype=0xFFFF)) == expected
    assert list(read_pcap_tuples(str(tmp_path / "t.pcap"))) == []


def test_read_vlan_tagged(tmp_path: Path) -> None:
    frames, expected = traffic()
    tagged = [
        Ether(dst=mac_str(f[:6]), src=mac_str(f[6:12]), type=0x8100)
        / Dot1Q(vlan=5, type=ETHERTYPE)
        / Raw(f[ETH_HLEN:])
        for f in frames
    ]
    wrpcap(str(tmp_path / "v.pcap"), tagged)
    assert list(read_pcap_tuples(str(tmp_path / "v.pcap"))) == expected
    assert Typhoon in Ether(bytes(tagged[0]))  # scapy dissects through the tag too


@pytest.mark.parametrize("linktype", [DLT_LINUX_SLL, DLT_LINUX_SLL2])
def test_read_linux_cooked(tmp_path: Path, linktype: int) -> None:
    """``tcpdump -i any`` records only the source address."""
    frames, expected = traffic()
    cooked = CookedLinux if linktype == DLT_LINUX_SLL else CookedLinuxV2
    pkts = [
        cooked(lladdrtype=1, lladdrlen=6, src=f[6:12] + b"\0\0", proto=ETHERTYPE) / Raw(f[14:])
        for f in frames
    ]
    wrpcap(str(tmp_path / "c.pcap"), pkts, linktype=linktype)
    got = list(read_pcap_tuples(str(tmp_path / "c.pcap")))
    assert got == [e._replace(dst_mac=None) for e in expected]
    assert decode_tuples(pkts[-1].__class__(bytes(pkts[-1]))) == [64]


def test_truncated_capture(tmp_path: Path) -> None:
    frames, expected = traffic()
    pkts = [Ether(f[:64]) if i == 0 else Ether(f) for i, f in enumerate(frames)]
    pkts[0].wirelen = len(frames[0])  # what tcpdump -s 64 records
    wrpcap(str(tmp_path / "s.pcap"), pkts)
    with pytest.raises(WireError, match="snaplen"):
        list(read_pcap_tuples(str(tmp_path / "s.pcap")))
    lenient = list(read_pcap_tuples(str(tmp_path / "s.pcap"), strict=False))
    assert lenient == expected[1:]


def test_malformed_frame_in_capture(tmp_path: Path) -> None:
    frames, expected = traffic()
    bad = bytearray(frames[0])
    bad[15] = 7  # unknown kind
    write(tmp_path / "m.pcap", [bytes(bad), *frames[1:]])
    e = pytest.raises(WireError, lambda: list(read_pcap_tuples(str(tmp_path / "m.pcap"))))
    assert type(e.value) is WireError
    assert list(read_pcap_tuples(str(tmp_path / "m.pcap"), strict=False)) == expected[1:]


def test_lost_segment_in_capture(tmp_path: Path) -> None:
    frames, expected = traffic()
    first_seg = next(i for i, f in enumerate(frames) if f[16] & SEG)
    del frames[first_seg + 1]
    write(tmp_path / "l.pcap", frames)
    with pytest.raises(WireError, match="lost segment"):
        list(read_pcap_tuples(str(tmp_path / "l.pcap")))
    got = list(read_pcap_tuples(str(tmp_path / "l.pcap"), strict=False))
    assert [BIG] not in [r.decoded for r in got]
    assert got[-1] == expected[-1]


def test_pcap_rewritten_by_tcpdump(tmp_path: Path) -> None:
    # tcpdump is in scripts/setup.sh's APT_REQUIRED: missing is a failure, not a skip
    assert shutil.which("tcpdump"), "tcpdump not found: run `make setup`"
    frames, expected = traffic()
    write(tmp_path / "in.pcap", frames)
    subprocess.run(
        ["tcpdump", "-r", str(tmp_path / "in.pcap"), "-w", str(tmp_path / "out.pcap")],
        check=True,
        capture_output=True,
    )
    assert list(read_pcap_tuples(str(tmp_path / "out.pcap"))) == expected


@pytest.mark.integration
@pytest.mark.parametrize("iface", ["lo", "any"])
def test_live_capture_by_tcpdump(tmp_path: Path, iface: str) -> None:
    """Frames sent on loopback through an AF_PACKET socket, captured by tcpdump."""
    # like every integration test: without tcpdump or root it fails, it does not skip
    assert shutil.which("tcpdump"), "tcpdump not found: run `make setup`"
    assert os.geteuid() == 0, "needs root (AF_PACKET socket, capture): run as root"
    ethertype = 0x88B6  # keep clear of anything else using the default on this host
    frames, expected = traffic(mtu=9000, ethertype=ethertype)
    out = tmp_path / "live.pcap"
    # -Z root: tcpdump would otherwise drop to its own user and fail to write tmp_path;
    # -c: exit once every frame is on disk; -B: bursts of jumbo frames overrun the
    # default ring of "-i any" (the kernel drops them)
    cmd = ["tcpdump", "-i", iface, "-Z", "root", "-B", "16384", "-U", "--immediate-mode", "-n"]
    cmd += ["-c", str(len(frames)), "-w", str(out), f"ether proto {ethertype:#06x}"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        while "listening on" not in (line := proc.stderr.readline()):
            assert line, f"tcpdump failed: {proc.stderr.read()}"
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.bind(("lo", 0))
            for f in frames:
                s.send(f)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
    got = list(read_pcap_tuples(str(out), ethertype=ethertype))
    if iface == "any":  # cooked capture: the destination address is not recorded
        expected = [e._replace(dst_mac=None) for e in expected]
    assert got == expected
