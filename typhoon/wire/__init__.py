"""Typhoon wire format: worker addresses, frames, tuples, control tuples, credits.

One module a part: ``addresses.py`` (the MACs), ``header.py`` (the frame
header's fields, declared once), ``frames.py`` (packing, segments, reassembly,
credits), ``rows.py`` (msgpack tuples), ``layout.py`` (a stream's declared
columns) and ``columns.py`` (column blocks; numpy, so not re-exported here),
``control.py`` (control tuples), ``checks.py`` (ranges, :class:`WireError`).  Callers import
from ``typhoon.wire``, which re-exports them all.

Tuples travel as Ethernet frames through Open vSwitch (paper §3.3.1, Fig. 5).  The
switch routes on the Ethernet addresses alone, so everything a flow rule needs is
in the MAC addresses; everything the receiving worker needs is in a small header.
This package is the single definition of those bytes: the scapy layer in
``typhoon.dissect`` and the ``tc`` classifier in ``typhoon.control_queue`` build
their fields and offsets from ``header.py``'s declaration.

Addresses (6 bytes)::

    byte 0     0x02 locally administered unicast, 0x03 = 0x02 + multicast bit
    bytes 1-2  application id, u16 big endian, 1..0xFFFE
    byte 3     address class: 0 worker, 1 controller, 2 load-balancer virtual,
               3 multicast group (only class with byte 0 = 0x03)
    bytes 4-5  u16: worker id (1..0xFFFE) | 0 (controller)
               | node_index << 8 | slot (load balancer) | stream id (multicast)

Frame (all integers big endian; this table is ``typhoon.wire.header.LAYOUT.table()``,
the one declaration every reader of the header derives from)::

    offset  size  field
    0       6     dst: Ethernet destination (address above)
    6       6     src: Ethernet source
    12      2     ethertype: EtherType, 0x88B5 by default (configurable)
    14      1     version: wire version (2)
    15      1     kind: 0 data, 1 control, 2 credit
    16      1     flags: 0x01 SEG, 0x02 SEG_FIRST, 0x04 SEG_LAST, 0x08 LB, 0x10 ACK_REQ, rest 0
    17      1     reserved: 0
    18      2     stream: stream id (of a credit frame: its kind, typhoon.runtime.links)
    20      4     seq: sequence number, +1 per frame on a link, wraps at 2**32
    24      2     count: count of entries
    26            entries (below)

Entries::

    unsegmented: count x (u16 length, length bytes)
    segment (SEG set, count = 1):
      [u32 total payload length, only if SEG_FIRST]
      u16 chunk length, chunk bytes

Each entry of a data frame is a *row batch*: one msgpack array of tuples (each a
msgpack array), encoded in one call (:func:`encode_rows`), so a frame costs one
serialization, not one per tuple; or, on a stream that declares its columns, a
*column block* (first byte 0xC1, ``header.BLOCK_MARK``, which no msgpack value
starts with): the same rows as typed columns, ``typhoon/wire/columns.py``; a
control frame's entry is one encoded control tuple ``[type, body]``, of a
credit frame a u32 (link id, counts, sequence numbers:
``typhoon.runtime.links``).  A *link* is the frames of one sender to one
destination address (a worker, or a stream's one-to-many address);
its sequence numbers let the receiver deliver in order, drop duplicates and ask
for what a gap lost.  ACK_REQ asks the receiver for a grant once it consumed the
frame.  A
payload too large for one frame is cut into SEG frames with consecutive sequence
numbers: SEG_FIRST on the first, SEG_LAST on the last, SEG alone in between.
LB marks a data frame that was sent to a load-balancer address (``sdn``
grouping): the switch rewrote its destination to the worker it chose, so only
this bit tells the receiver to return its credit to the sender's load-balancer
window rather than to the link's (``typhoon.runtime.lb_credits``); its sequence
number counts the sender's frames to the whole group, so a receiver sees gaps.
Nothing may follow the last entry except zero padding of a minimum-size (60 byte)
Ethernet frame, which NICs add on their own.  The frame length never exceeds
``14 + mtu``.
"""

from __future__ import annotations

from typhoon.wire.addresses import (
    LB_SLOTS,
    AddrClass,
    Address,
    controller_mac,
    lb_mac,
    mac_bytes,
    mac_str,
    multicast_mac,
    parse_mac,
    worker_mac,
)
from typhoon.wire.checks import WireError
from typhoon.wire.control import (
    POLICIES,
    URGENT_CONTROL,
    Control,
    ControlTuple,
    decode_control,
    encode_control,
    wire_metrics,
)
from typhoon.wire.frames import (
    ACK_REQ,
    DEFAULT_MTU,
    ETH_HLEN,
    ETH_ZLEN,
    ETHERTYPE,
    HEADER_LEN,
    LB,
    MIN_MTU,
    SEG,
    SEG_FIRST,
    SEG_LAST,
    Frame,
    Reassembler,
    decode_credit,
    decode_frame,
    encode_credit,
    encode_frame,
    entry_capacity,
    pack_frames,
    with_flags,
)
from typhoon.wire.header import FLAGS, LAYOUT, VERSION, Kind
from typhoon.wire.layout import ColumnLayout, block_rows, describe_block, is_block, parse_layout
from typhoon.wire.rows import (
    MAX_DEPTH,
    decode_rows,
    decode_tuple,
    decode_value,
    encode_rows,
    encode_tuple,
    unpack_rows,
)

__all__ = [
    "URGENT_CONTROL",
    "ACK_REQ",
    "DEFAULT_MTU",
    "ETH_HLEN",
    "ETH_ZLEN",
    "ETHERTYPE",
    "FLAGS",
    "LAYOUT",
    "HEADER_LEN",
    "LB",
    "MAX_DEPTH",
    "LB_SLOTS",
    "MIN_MTU",
    "POLICIES",
    "SEG",
    "SEG_FIRST",
    "SEG_LAST",
    "VERSION",
    "Address",
    "AddrClass",
    "ColumnLayout",
    "Control",
    "ControlTuple",
    "Frame",
    "Kind",
    "Reassembler",
    "WireError",
    "block_rows",
    "controller_mac",
    "decode_control",
    "describe_block",
    "decode_credit",
    "decode_frame",
    "decode_rows",
    "decode_tuple",
    "decode_value",
    "encode_control",
    "wire_metrics",
    "encode_credit",
    "encode_frame",
    "encode_rows",
    "encode_tuple",
    "entry_capacity",
    "is_block",
    "lb_mac",
    "mac_bytes",
    "mac_str",
    "multicast_mac",
    "pack_frames",
    "unpack_rows",
    "parse_layout",
    "parse_mac",
    "with_flags",
    "worker_mac",
]
