"""Control frames ahead of data on fabric links: which frames, and the queueing that does it.

Free of Ryu and of any host: this module says which frames on a fabric link are
control and builds the ``tc`` commands that give them a queue of their own on
the link's interface; the emulation (``mininet_env/network.py``) runs them on
its fabric veths, ``typhoon cluster apply`` (``typhoon/host_setup.py``) on a real
host's underlay interface, where the frames travel inside VXLAN or Geneve
(:func:`tunnel_queueing`), and ``typhoon cluster check`` compares what ``tc``
lists with the same commands (:func:`problems`).  Why ``tc`` and not OpenFlow
``set_queue`` with an OVS QoS (``docs/flow_control.md``, "Control traffic apart
from data"): the userspace datapath hands frames to a veth through a packet
socket without their ``skb_priority``, so every frame lands in the QoS's
default queue whatever ``set_queue`` said; and no OpenFlow field tells a credit
frame from a data frame of the same link (same addresses, same EtherType).  The
classifier reads the Typhoon header instead.

Which frames go first: the credit frames a *receiver* sends (GRANT, NACK,
RESYNC, and LB_GRANT of load-balanced streams).  They refer to what has
arrived, so they can only be early, never ahead of what they describe.  A
sender's SYNC (and LB_SYNC) stays in the data queue: it names the next
sequence number of its link, and overtaking the link's data frames would make
the receiver NACK frames that are still on their way (a spurious resend).
Data frames and their in-band punctuation (end of stream, checkpoint anchors,
generation marks, all DATA frames on stream 0) keep their order on the link.
Controller <-> worker control tuples do not cross fabric links at all: the
controller writes them to the worker's own port (PacketOut) and gets the
replies from the worker's own bridge (PacketIn).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from typhoon import wire
from typhoon.runtime import lb_credits as lb
from typhoon.runtime import links as lk
from typhoon.wire.header import LAYOUT

# credit frame kinds (the header's stream field of a CREDIT frame) that go first
URGENT_CREDIT_KINDS: tuple[int, ...] = (lk.GRANT, lk.NACK, lk.RESYNC, lb.LB_GRANT)
# the header fields the classifier reads (declared in typhoon/wire/header.py): their
# byte offsets in the Ethernet frame, widths and masks come from that one declaration
CLASSIFIED = ("ethertype", "kind", "stream")
_CLASSIFIED_END = max(LAYOUT.offset[n] + LAYOUT.field[n].size for n in CLASSIFIED)
_U32_SIZES = {1: "u8", 2: "u16", 4: "u32"}  # what a tc u32 match can test
CONTROL_SHARE = 0.1  # of the link's rate guaranteed to the control class (credit frames are tiny)
# what a tunnel adds between the outer IP header and the worker frame: UDP + the tunnel
# header (Geneve without options), and the tunnel's UDP destination port
TUNNEL_UDP_PORT = {"vxlan": 4789, "geneve": 6081}
UDP_HLEN, TUNNEL_HLEN = 8, 8
_IFNAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}$")
Match = tuple[str, int, int, int]  # (u8|u16|u32, value, mask, offset)


@dataclass(frozen=True)
class LinkQueueing:
    """A shaped fabric interface as Mininet's ``TCLink`` leaves it: an htb qdisc
    ``root`` (handle ``5:``) whose class ``parent`` (``5:1``) holds the link's rate.

    An unshaped veth never queues (its transmit hands every frame to the peer at
    once; the queue is the far bridge's packet-socket buffer, which no qdisc
    orders), so only shaped links get a control class.
    """

    iface: str
    rate_mbit: float
    root: str = "5:"
    parent: str = "5:1"
    # where the worker frame's Ethernet header starts, counted from where u32 offsets
    # count (the end of the outer Ethernet header): a bare frame's is -14
    frame_at: int = -wire.ETH_HLEN
    outer: tuple[Match, ...] = ()  # what else a frame must match (the tunnel's own headers)

    def __post_init__(self) -> None:
        if not valid_iface(self.iface):
            raise ValueError(f"not an interface name: {self.iface!r}")
        if not self.rate_mbit > 0:
            raise ValueError(f"the control class needs a positive rate, not {self.rate_mbit}")


def valid_iface(name: str) -> bool:
    """A Linux interface name (at most 15 characters, no ``/``, blank or leading ``-``):
    the only string from outside that reaches a ``tc`` argument list."""
    return bool(_IFNAME.match(name))


def tunnel_queueing(
    iface: str, rate_mbit: float, fabric_type: str, ip_version: int
) -> LinkQueueing:
    """The control class of a real host's underlay interface ``iface``, whose worker
    frames leave inside ``fabric_type`` tunnels over IPv``ip_version``: the same classes
    and filters as an emulated link, the offsets moved past the outer IP, UDP and tunnel
    headers, and the outer headers matched too (IPv4 without options, or IPv6 with UDP
    as its next header; the tunnel's UDP port)."""
    port = TUNNEL_UDP_PORT[fabric_type]
    if ip_version == 4:
        outer: tuple[Match, ...] = (("u8", 0x45, 0xFF, 0), ("u8", 17, 0xFF, 9),
                                    ("u16", port, 0xFFFF, 22))  # fmt: skip
        ip_hlen = 20
    elif ip_version == 6:
        outer = (("u8", 17, 0xFF, 6), ("u16", port, 0xFFFF, 42))
        ip_hlen = 40
    else:
        raise ValueError(f"IP version {ip_version}")
    return LinkQueueing(iface, rate_mbit, frame_at=ip_hlen + UDP_HLEN + TUNNEL_HLEN,
                        outer=outer)  # fmt: skip


def header_match(name: str, value: int, frame_at: int) -> Match:
    """A ``tc`` u32 match of header field ``name`` equal to ``value``, the worker frame
    starting at ``frame_at``: the field's offset, width and mask as the header declares."""
    f = LAYOUT.field[name]
    off = frame_at + LAYOUT.offset[name]
    if f.size not in _U32_SIZES:
        raise ValueError(f"header field {name} of {f.size} bytes: tc u32 matches 1, 2 or 4")
    if off % f.size:  # tc packs a u16 or u32 match into an aligned 32-bit word
        raise ValueError(f"header field {name} at {off}: tc cannot match {f.size} bytes there")
    return (_U32_SIZES[f.size], value, f.max, off)


def _field(frame: bytes, name: str) -> int:
    at = LAYOUT.offset[name]
    return int.from_bytes(frame[at : at + LAYOUT.field[name].size], "big")


def is_urgent_frame(frame: bytes) -> bool:
    """Does the classifier put ``frame`` in the control class?  (What the ``tc`` filters
    built by :func:`tc_commands` test, in Python: unit-testable.)"""
    if len(frame) < _CLASSIFIED_END:
        return False
    if _field(frame, "ethertype") != wire.ETHERTYPE:
        return False
    if _field(frame, "kind") != wire.Kind.CREDIT:
        return False
    return _field(frame, "stream") in URGENT_CREDIT_KINDS


def classes(link: LinkQueueing) -> tuple[str, str]:
    """The (control, data) class ids under the link's rate class."""
    major = link.root.rstrip(":")
    return f"{major}:10", f"{major}:20"


def tc_commands(link: LinkQueueing, ethertype: int = wire.ETHERTYPE) -> list[list[str]]:
    """``tc`` argument lists that split ``link``'s rate class into a control class
    (priority 0, ``CONTROL_SHARE`` of the rate guaranteed, the whole rate as ceiling)
    and a data class (priority 1, the rest guaranteed, the whole rate as ceiling),
    each with its own FIFO, and classify: the urgent credit frames
    (:func:`is_urgent_frame`) to the control class, every other frame to the data class.

    u32 offsets count from the end of the Ethernet header (measured on OVS 3.1's
    userspace datapath: docs/flow_control.md), the worker frame at ``link.frame_at``."""
    control, data = classes(link)
    rate = link.rate_mbit
    cmds = [
        ["tc", "class", "add", "dev", link.iface, "parent", link.parent, "classid", control,
         "htb", "rate", f"{rate * CONTROL_SHARE:g}mbit", "ceil", f"{rate:g}mbit", "prio", "0"],
        ["tc", "class", "add", "dev", link.iface, "parent", link.parent, "classid", data,
         "htb", "rate", f"{rate * (1 - CONTROL_SHARE):g}mbit", "ceil", f"{rate:g}mbit",
         "prio", "1"],
    ]  # fmt: skip
    for pref, kind in enumerate(URGENT_CREDIT_KINDS, start=1):
        cmds.append(
            ["tc", "filter", "add", "dev", link.iface, "parent", link.root, "prio", str(pref),
             "protocol", "all", "u32", *_match_args(control_matches(link, kind)),
             "flowid", control]
        )  # fmt: skip
    cmds.append(
        ["tc", "filter", "add", "dev", link.iface, "parent", link.root,
         "prio", str(len(URGENT_CREDIT_KINDS) + 1), "protocol", "all", "u32",
         "match", "u32", "0", "0", "flowid", data]
    )  # fmt: skip
    return cmds


def control_matches(link: LinkQueueing, kind: int, ethertype: int = wire.ETHERTYPE) -> list[Match]:
    """What a filter of the control class matches for credit ``kind``: the tunnel's
    headers, then the worker frame's EtherType, kind and stream fields."""
    at = link.frame_at
    return [
        *link.outer,
        header_match("ethertype", ethertype, at),
        header_match("kind", int(wire.Kind.CREDIT), at),
        header_match("stream", kind, at),
    ]


def _match_args(matches: list[Match]) -> list[str]:
    out = []
    for size, value, mask, off in matches:
        shown = f"{value:#06x}" if size == "u16" and value > 0xFF else str(value)
        out += ["match", size, shown, f"{mask:#x}", "at", str(off)]
    return out


def host_commands(link: LinkQueueing) -> list[list[str]]:
    """``tc`` argument lists for a host interface nobody shapes: an htb root (``link.root``,
    unclassified frames to the data class) with one class holding the link's rate
    (``link.parent``), as Mininet's ``TCLink`` leaves an emulated link, then
    :func:`tc_commands`."""
    control, data = classes(link)
    rate = f"{link.rate_mbit:g}mbit"
    return [
        ["tc", "qdisc", "add", "dev", link.iface, "root", "handle", link.root, "htb",
         "default", data.split(":")[1]],
        ["tc", "class", "add", "dev", link.iface, "parent", link.root, "classid", link.parent,
         "htb", "rate", rate, "ceil", rate],
        *tc_commands(link),
    ]  # fmt: skip


def removal(link: LinkQueueing) -> list[str]:
    """Back to the interface's default qdisc (every class and filter goes with the root)."""
    return ["tc", "qdisc", "del", "dev", link.iface, "root"]


# ----- what tc lists, against what the commands install ----------------------------------

_CLASS = re.compile(r"^class htb (\S+) (?:parent (\S+)|root) .*?\bceil (\S+)", re.M)
_SENT = re.compile(r"^class htb (\S+) .*?\n\s*Sent \d+ bytes (\d+) pkt", re.M)
_FILTER = re.compile(r"\bflowid (\S+)")
_KEY = re.compile(r"^\s*match ([0-9a-f]{8})/([0-9a-f]{8}) at (-?\d+)", re.M)


def tc_key(size: str, value: int, mask: int, off: int) -> tuple[int, int, int]:
    """A match as the kernel keeps it and ``tc filter show`` prints it: a 32-bit word at a
    4-aligned offset (tc's pack_key8/16/32)."""
    width = {"u8": 8, "u16": 16, "u32": 32}[size]
    shift = 32 - width - 8 * (off & 3)
    return value << shift, mask << shift, off & ~3


def tc_keys(matches: list[Match]) -> frozenset[tuple[int, int, int]]:
    """The keys of one filter as the kernel keeps them: matches in the same word are one
    key (tc's pack_key merges them)."""
    words: dict[int, tuple[int, int]] = {}
    for m in matches:
        value, mask, off = tc_key(*m)
        v, k = words.get(off, (0, 0))
        words[off] = (v | value, k | mask)
    return frozenset((v, k, off) for off, (v, k) in words.items())


def class_packets(listing: str) -> dict[str, int]:
    """Packets sent per htb class in ``tc -s class show``."""
    return {m.group(1): int(m.group(2)) for m in _SENT.finditer(listing)}


def problems(link: LinkQueueing, qdiscs: str, class_listing: str, filters: str) -> list[str]:
    """What differs between ``tc qdisc show`` / ``tc class show`` / ``tc filter show dev
    IFACE parent ROOT`` and what :func:`host_commands` installs, one sentence each."""
    where = f"control class on {link.iface}"
    if not re.search(rf"^qdisc htb {re.escape(link.root)} root\b", qdiscs, re.M):
        return [f"{where} missing: no htb root {link.root} (run apply)"]
    control, data = classes(link)
    found = {m.group(1): (m.group(2), m.group(3)) for m in _CLASS.finditer(class_listing)}
    out = []
    for cls, name in ((control, "control"), (data, "data")):
        if found.get(cls, (None,))[0] != link.parent:
            out.append(f"{where}: {name} class {cls} under {link.parent} missing (run apply)")
    have = _filters(filters)
    for kind in URGENT_CREDIT_KINDS:
        want = tc_keys(control_matches(link, kind))
        if (control, want) not in have:
            out.append(f"{where}: no filter sends credit kind {kind} to {control} (run apply)")
    if (data, frozenset({(0, 0, 0)})) not in have:
        out.append(f"{where}: no filter sends the other frames to {data} (run apply)")
    return out


def _filters(listing: str) -> set[tuple[str, frozenset[tuple[int, int, int]]]]:
    """(flowid, its match keys) of each u32 filter in ``tc filter show``."""
    out = set()
    for block in re.split(r"^(?=filter )", listing, flags=re.M):
        flow = _FILTER.search(block)
        if flow is not None:
            keys = frozenset((int(v, 16), int(m, 16), int(o)) for v, m, o in _KEY.findall(block))
            out.add((flow.group(1), keys))
    return out
