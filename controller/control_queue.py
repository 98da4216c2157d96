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
HANDLE = "7:"  # the prio qdisc's handle: band 7:1 control, 7:2 everything else


@dataclass(frozen=True)
class LinkQueueing:
    """How one fabric interface is already queued, so the priority goes in the right place.

    ``parent``: the class the link's leaf queue hangs from (Mininet's shaped
    links: ``5:1`` for a rate only, ``10:1`` under a delay's netem), or None for an
    unshaped link (the priority qdisc becomes the root).
    """

    iface: str
    parent: str | None = None


def is_urgent_frame(frame: bytes) -> bool:
    """Does the classifier put ``frame`` in the control band?  (What the ``tc`` filters
    built by :func:`tc_commands` test, in Python: unit-testable.)"""
    if len(frame) < STREAM_AT + 2:
        return False
    if int.from_bytes(frame[ETHERTYPE_AT : ETHERTYPE_AT + 2], "big") != wire.ETHERTYPE:
        return False
    if frame[KIND_AT] != wire.Kind.CREDIT:
        return False
    return int.from_bytes(frame[STREAM_AT : STREAM_AT + 2], "big") in URGENT_CREDIT_KINDS


def tc_commands(link: LinkQueueing, ethertype: int = wire.ETHERTYPE) -> list[list[str]]:
    """``tc`` argument lists that give ``link`` a two-band strict-priority qdisc whose
    first band takes the urgent credit frames (:func:`is_urgent_frame`).

    The second band takes everything else (every priomap entry points to it, so a
    frame the filters do not match keeps its place among the data)."""
    where = ["parent", link.parent] if link.parent else ["root"]
    cmds = [
        ["tc", "qdisc", "replace", "dev", link.iface, *where, "handle", HANDLE,
         "prio", "bands", "2", "priomap", *(["1"] * 16)],
    ]  # fmt: skip
    for pref, kind in enumerate(URGENT_CREDIT_KINDS, start=1):
        ematch = (
            f"cmp(u16 at {ETHERTYPE_AT} layer link mask 0xffff eq {ethertype}) and "
            f"cmp(u8 at {KIND_AT} layer link mask 0xff eq {int(wire.Kind.CREDIT)}) and "
            f"cmp(u16 at {STREAM_AT} layer link mask 0xffff eq {kind})"
        )
        cmds.append(
            ["tc", "filter", "add", "dev", link.iface, "parent", HANDLE, "prio", str(pref),
             "protocol", "all", "basic", "match", ematch, "flowid", f"{HANDLE}1"]
        )  # fmt: skip
    return cmds


def mininet_parent(shaped: bool, delayed: bool) -> str | None:
    """Where Mininet's ``TCLink`` (htb rate at ``5:1``, netem delay at ``10:``) leaves
    the leaf queue of a fabric interface."""
    if delayed:
        return "10:1"
    if shaped:
        return "5:1"
    return None
