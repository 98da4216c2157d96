"""Control frames ahead of data on fabric links: which frames, and the queueing that does it.

Free of Ryu and of any host: this module says which frames on a fabric link are
control and builds the ``tc`` commands that give them a queue of their own on
the link's interface; the emulation (``mininet_env/network.py``) runs them on
its fabric veths.  Why ``tc`` and not OpenFlow ``set_queue`` with an OVS QoS
(``docs/flow_control.md``, "Control traffic apart from data"): the userspace
datapath hands frames to a veth through a packet socket without their
``skb_priority``, so every frame lands in the QoS's default queue whatever
``set_queue`` said; and no OpenFlow field tells a credit frame from a data frame
of the same link (same addresses, same EtherType).  The classifier reads the
Typhoon header instead.

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

from dataclasses import dataclass

from typhoon import wire
from typhoon.runtime import lb_credits as lb
from typhoon.runtime import links as lk

# credit frame kinds (the header's stream field of a CREDIT frame) that go first
URGENT_CREDIT_KINDS: tuple[int, ...] = (lk.GRANT, lk.NACK, lk.RESYNC, lb.LB_GRANT)
# byte offsets in the Ethernet frame (typhoon.wire's header: version, kind, flags,
# reserved, stream, seq, count after the 14-byte Ethernet header)
ETHERTYPE_AT = 12
KIND_AT = wire.ETH_HLEN + 1
STREAM_AT = wire.ETH_HLEN + 4
CONTROL_SHARE = 0.1  # of the link's rate guaranteed to the control class (credit frames are tiny)


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


def is_urgent_frame(frame: bytes) -> bool:
    """Does the classifier put ``frame`` in the control class?  (What the ``tc`` filters
    built by :func:`tc_commands` test, in Python: unit-testable.)"""
    if len(frame) < STREAM_AT + 2:
        return False
    if int.from_bytes(frame[ETHERTYPE_AT : ETHERTYPE_AT + 2], "big") != wire.ETHERTYPE:
        return False
    if frame[KIND_AT] != wire.Kind.CREDIT:
        return False
    return int.from_bytes(frame[STREAM_AT : STREAM_AT + 2], "big") in URGENT_CREDIT_KINDS


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
    userspace datapath: docs/flow_control.md), the EtherType at -2."""
    control, data = classes(link)
    rate = link.rate_mbit
    cmds = [
        ["tc", "class", "add", "dev", link.iface, "parent", link.parent, "classid", control,
         "htb", "rate", f"{rate * CONTROL_SHARE:g}mbit", "ceil", f"{rate:g}mbit", "prio", "0"],
        ["tc", "class", "add", "dev", link.iface, "parent", link.parent, "classid", data,
         "htb", "rate", f"{rate * (1 - CONTROL_SHARE):g}mbit", "ceil", f"{rate:g}mbit",
         "prio", "1"],
    ]  # fmt: skip
    nh = wire.ETH_HLEN
    for pref, kind in enumerate(URGENT_CREDIT_KINDS, start=1):
        cmds.append(
            ["tc", "filter", "add", "dev", link.iface, "parent", link.root, "prio", str(pref),
             "protocol", "all", "u32",
             "match", "u16", f"{ethertype:#06x}", "0xffff", "at", str(ETHERTYPE_AT - nh),
             "match", "u8", str(int(wire.Kind.CREDIT)), "0xff", "at", str(KIND_AT - nh),
             "match", "u16", str(kind), "0xffff", "at", str(STREAM_AT - nh),
             "flowid", control]
        )  # fmt: skip
    cmds.append(
        ["tc", "filter", "add", "dev", link.iface, "parent", link.root,
         "prio", str(len(URGENT_CREDIT_KINDS) + 1), "protocol", "all", "u32",
         "match", "u32", "0", "0", "flowid", data]
    )  # fmt: skip
    return cmds
