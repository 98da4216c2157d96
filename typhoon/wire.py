"""Typhoon wire format: worker addresses, frames, tuples, control tuples, credits.

Tuples travel as Ethernet frames through Open vSwitch (paper §3.3.1, Fig. 5).  The
switch routes on the Ethernet addresses alone, so everything a flow rule needs is
in the MAC addresses; everything the receiving worker needs is in a small header.
This module is the single definition of those bytes; the scapy layer in
``typhoon.dissect`` only mirrors it.

Addresses (6 bytes)::

    byte 0     0x02 locally administered unicast, 0x03 = 0x02 + multicast bit
    bytes 1-2  application id, u16 big endian, 1..0xFFFE
    byte 3     address class: 0 worker, 1 controller, 2 load-balancer virtual,
               3 multicast group (only class with byte 0 = 0x03)
    bytes 4-5  u16: worker id (1..0xFFFE) | 0 (controller)
               | node_index << 8 | slot (load balancer) | stream id (multicast)

Frame (all integers big endian)::

    offset  size  field
    0       6     Ethernet destination (address above)
    6       6     Ethernet source
    12      2     EtherType, 0x88B5 by default (configurable)
    14      1     version (2)
    15      1     kind: 0 data, 1 control, 2 credit
    16      1     flags: 0x01 SEG, 0x02 SEG_FIRST, 0x04 SEG_LAST, 0x08 LB, 0x10 ACK_REQ,
                  other bits 0
    17      1     reserved, 0
    18      2     stream id (of a credit frame: its kind, typhoon.runtime.links)
    20      4     sequence number, +1 per frame on a link, wraps at 2**32
    24      2     count of entries
    26            unsegmented: count x (u16 length, length bytes)
                  segment (SEG set, count = 1):
                    [u32 total payload length, only if SEG_FIRST]
                    u16 chunk length, chunk bytes

Each entry of a data frame is a *row batch*: one msgpack array of tuples (each a
msgpack array), encoded in one call (:func:`encode_rows`), so a frame costs one
serialization, not one per tuple; a control frame's entry is one encoded control
tuple ``[type, body]``, of a credit frame a u32 (link id, counts,
sequence numbers: ``typhoon.runtime.links``).  A *link* is the frames of one
sender to one destination address (a worker, or a stream's one-to-many address);
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

import math
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgpack

ETHERTYPE = 0x88B5
VERSION = 2  # 2: data entries are row batches (1: one tuple per entry)
HEADER_LEN = 12
ETH_HLEN = 14
ETH_ZLEN = 60  # minimum Ethernet frame without FCS; shorter frames get zero padding
DEFAULT_MTU = 9000
MIN_MTU = HEADER_LEN + 4 + 2 + 1  # room for a first segment carrying one byte
LB_SLOTS = 256

SEG = 0x01
SEG_FIRST = 0x02
SEG_LAST = 0x04
LB = 0x08
ACK_REQ = 0x10
_SEG_MASK = SEG | SEG_FIRST | SEG_LAST
_FLAG_MASK = _SEG_MASK | LB | ACK_REQ
_FLAGS_OFFSET = ETH_HLEN + 2

_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFFFFFF
_MAX_ID = 0xFFFE  # 0 and 0xFFFF are reserved for app ids and worker ids


class WireError(ValueError):
    """A frame, tuple or control tuple from the wire is malformed."""


class Kind(IntEnum):
    DATA = 0
    CONTROL = 1
    CREDIT = 2


class AddrClass(IntEnum):
    WORKER = 0
    CONTROLLER = 1
    LOAD_BALANCER = 2
    MULTICAST = 3


_KINDS = tuple(Kind)
_CLASSES = tuple(AddrClass)

# Ethernet header + Typhoon header in one struct: one call per frame.
_HDR = struct.Struct("!6s6sHBBBBHIH")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_MAC = struct.Struct("!BHBH")
_FULL_HLEN = ETH_HLEN + HEADER_LEN
assert _HDR.size == _FULL_HLEN


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    """Range-check an argument; bools are not ints here (True would be worker 1)."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
    return value


# --------------------------------------------------------------------------- addresses


def _mac(first: int, app_id: int, cls: AddrClass, value: int) -> bytes:
    _check_int("app_id", app_id, 1, _MAX_ID)
    return _MAC.pack(first, app_id, cls, value)


def worker_mac(app_id: int, worker_id: int) -> bytes:
    """Address of one worker's TAP port."""
    return _mac(0x02, app_id, AddrClass.WORKER, _check_int("worker_id", worker_id, 1, _MAX_ID))


def controller_mac(app_id: int) -> bytes:
    """Address the switch sends to OFPP_CONTROLLER (worker -> controller tuples)."""
    return _mac(0x02, app_id, AddrClass.CONTROLLER, 0)


def lb_mac(app_id: int, node_index: int, slot: int) -> bytes:
    """Virtual address of one load-balancer slot of a node (``sdn`` grouping)."""
    _check_int("node_index", node_index, 0, 0xFF)
    _check_int("slot", slot, 0, LB_SLOTS - 1)
    return _mac(0x02, app_id, AddrClass.LOAD_BALANCER, node_index << 8 | slot)


def multicast_mac(app_id: int, stream_id: int) -> bytes:
    """One-to-many group address: one frame, the switch copies it (``all`` grouping)."""
    return _mac(0x03, app_id, AddrClass.MULTICAST, _check_int("stream_id", stream_id, 0, _U16_MAX))


@dataclass(frozen=True)
class Address:
    """A parsed Typhoon MAC address."""

    app_id: int
    cls: AddrClass
    value: int


def parse_mac(mac: bytes) -> Address:
    """Split a Typhoon MAC into its parts; anything else is a :class:`WireError`."""
    if not isinstance(mac, (bytes, bytearray, memoryview)) or len(mac) != 6:
        raise WireError(f"not a 6-byte MAC: {mac!r}")
    first, app_id, cls, value = _MAC.unpack(bytes(mac))
    if first not in (0x02, 0x03):
        raise WireError(f"not a Typhoon address (first byte {first:#04x})")
    if not 1 <= app_id <= _MAX_ID:
        raise WireError(f"reserved application id {app_id:#06x}")
    if cls >= len(_CLASSES):
        raise WireError(f"unknown address class {cls}")
    if (first == 0x03) != (cls == AddrClass.MULTICAST):
        raise WireError("multicast bit does not match the address class")
    if cls == AddrClass.WORKER and not 1 <= value <= _MAX_ID:
        raise WireError(f"reserved worker id {value:#06x}")
    if cls == AddrClass.CONTROLLER and value != 0:
        raise WireError("controller address must have value 0")
    return Address(app_id, _CLASSES[cls], value)


_MAC_RE = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}")


def mac_str(mac: bytes) -> str:
    """Colon notation, as OVS and Ryu print addresses."""
    if len(mac) != 6:
        raise ValueError(f"MAC must be 6 bytes, got {len(mac)}")
    return bytes(mac).hex(":")


def mac_bytes(s: str) -> bytes:
    """Inverse of :func:`mac_str`."""
    if not isinstance(s, str) or not _MAC_RE.fullmatch(s):
        raise ValueError(f"not a MAC address: {s!r}")
    return bytes.fromhex(s.replace(":", ""))


# --------------------------------------------------------------------------- tuples

# A Packer is ~3x faster than packb (no per-call setup) but not thread-safe.
_local = threading.local()
_unpackb = msgpack.unpackb


def _reject_ext(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack extension type {code} is not allowed")


def _has_timestamp(value: Any) -> bool:
    if isinstance(value, msgpack.Timestamp):
        return True
    if isinstance(value, list):
        return any(_has_timestamp(v) for v in value)
    if isinstance(value, dict):
        return any(_has_timestamp(k) or _has_timestamp(v) for k, v in value.items())
    return False


def encode_tuple(values: list | tuple) -> bytes:
    """Serialize one tuple (a sequence of plain values) with msgpack; never pickle."""
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"a tuple must be a list or tuple, got {type(values).__name__}")
    try:
        pack = _local.pack
    except AttributeError:
        pack = _local.pack = msgpack.Packer(use_bin_type=True).pack
    return pack(values)  # the Packer resets its buffer if this raises


def decode_tuple(data: bytes) -> list:
    """Inverse of :func:`encode_tuple`; sequences come back as lists.

    Strict: plain msgpack types only (no extension types), and every failure is a
    WireError, whatever msgpack raised (ValueError, TypeError, StackError, ...).
    """
    if type(data) is not bytes:
        data = bytes(data)  # also makes the substring tests below meaningful
    try:
        value = _unpackb(data, raw=False, strict_map_key=False, ext_hook=_reject_ext)
    except WireError:
        raise
    except Exception as e:
        raise WireError(f"bad msgpack: {type(e).__name__}: {e}") from None
    if type(value) is not list:
        raise WireError(f"a tuple must be a msgpack array, got {type(value).__name__}")
    # msgpack turns ext type -1 into a Timestamp without asking ext_hook.  Only these
    # byte sequences can introduce one; the int test is a bare memchr (the cheapest
    # check CPython has) that spares most tuples the other three.
    if 0xFF in data and (b"\xd6\xff" in data or b"\xd7\xff" in data or b"\xc7\x0c\xff" in data):
        if _has_timestamp(value):
            raise WireError("msgpack timestamp extension is not allowed")
    return value


def encode_rows(rows: list) -> bytes:
    """Serialize a batch of tuples as one data entry (one msgpack array of arrays)."""
    try:
        pack = _local.pack
    except AttributeError:
        pack = _local.pack = msgpack.Packer(use_bin_type=True).pack
    return pack(rows)


def decode_rows(data: bytes) -> list[list]:
    """Inverse of :func:`encode_rows`, as strict as :func:`decode_tuple`.

    Every row must be a msgpack array; a batch with one bad row is rejected whole
    (it came from one sender's one serialization, so nothing in it is trusted).
    """
    value = decode_tuple(data)
    for row in value:
        if type(row) is not list:
            raise WireError(f"a row must be a msgpack array, got {type(row).__name__}")
    return value


def entry_capacity(mtu: int) -> int:
    """Largest entry that still travels unsegmented in one frame of ``mtu``."""
    return min(mtu - HEADER_LEN - 2, _U16_MAX)


# --------------------------------------------------------------------------- frames


@dataclass(slots=True)
class Frame:
    """One decoded frame.

    ``payloads`` holds the entries of an unsegmented frame, or the single chunk of a
    segment.  ``total`` is the full payload length, set only on SEG_FIRST frames.
    """

    dst: bytes
    src: bytes
    kind: Kind
    stream: int
    seq: int
    flags: int
    payloads: list[bytes]
    total: int = 0


def _check_flags(flags: int, count: int) -> str | None:
    """Why a flags/count combination is invalid, or None."""
    if flags & ~_FLAG_MASK:
        return f"unknown flag bits {flags:#04x}"
    if flags & SEG:
        if count != 1:
            return f"segment frame must have count 1, got {count}"
    elif flags & _SEG_MASK:
        return "SEG_FIRST/SEG_LAST without SEG"
    return None


def _check_addr_args(dst: bytes, src: bytes, ethertype: int) -> None:
    if len(dst) != 6 or len(src) != 6:
        raise ValueError("dst and src must be 6-byte MACs")
    _check_int("ethertype", ethertype, 0, _U16_MAX)


def encode_frame(frame: Frame, ethertype: int = ETHERTYPE) -> bytes:
    """Serialize one frame exactly as given (no batching, no MTU check)."""
    _check_addr_args(frame.dst, frame.src, ethertype)
    kind = Kind(frame.kind)
    _check_int("stream", frame.stream, 0, _U16_MAX)
    _check_int("seq", frame.seq, 0, _U32_MAX)
    flags = _check_int("flags", frame.flags, 0, 0xFF)
    payloads = frame.payloads
    count = len(payloads)
    problem = _check_flags(flags, count)
    if problem:
        raise ValueError(problem)
    if count > _U16_MAX:
        raise ValueError(f"too many payloads for one frame: {count}")
    parts = [
        _HDR.pack(
            frame.dst, frame.src, ethertype, VERSION, kind, flags, 0, frame.stream, frame.seq, count
        )
    ]
    if flags & SEG_FIRST:
        total = _check_int("total", frame.total, len(payloads[0]), _U32_MAX)
        if flags & SEG_LAST and total != len(payloads[0]):
            raise ValueError("single-segment payload: total must equal the chunk length")
        parts.append(_U32.pack(total))
    for p in payloads:
        if len(p) > _U16_MAX:
            raise ValueError(f"payload of {len(p)} bytes exceeds the u16 length prefix")
        parts.append(_U16.pack(len(p)))
        parts.append(p)
    return b"".join(parts)


def decode_frame(buf: bytes, ethertype: int = ETHERTYPE, mtu: int = DEFAULT_MTU) -> Frame:
    """Parse and validate one frame; any defect is a :class:`WireError`."""
    if type(buf) is not bytes:
        buf = bytes(buf)
    blen = len(buf)
    if blen < _FULL_HLEN:
        raise WireError(f"frame of {blen} bytes is shorter than the headers")
    if blen > ETH_HLEN + mtu:
        raise WireError(f"frame of {blen} bytes exceeds mtu {mtu}")
    dst, src, etype, version, kind, flags, reserved, stream, seq, count = _HDR.unpack_from(buf)
    if etype != ethertype:
        raise WireError(f"ethertype {etype:#06x} is not {ethertype:#06x}")
    if version != VERSION:
        raise WireError(f"unsupported version {version}")
    if kind >= len(_KINDS):
        raise WireError(f"unknown kind {kind}")
    if reserved:
        raise WireError("reserved header byte is not zero")
    problem = _check_flags(flags, count)
    if problem:
        raise WireError(problem)
    off = _FULL_HLEN
    total = 0
    if flags & SEG_FIRST:
        if blen < off + 4:
            raise WireError("segment total length past end of frame")
        (total,) = _U32.unpack_from(buf, off)
        off += 4
    payloads = []
    append = payloads.append
    unpack_len = _U16.unpack_from
    for _ in range(count):
        if off + 2 > blen:
            raise WireError("fewer entries than the header count")
        (n,) = unpack_len(buf, off)
        off += 2
        end = off + n
        if end > blen:
            raise WireError("entry length past end of frame")
        append(buf[off:end])
        off = end
    if off != blen and not (blen == ETH_ZLEN and buf[off:] == bytes(blen - off)):
        raise WireError(f"{blen - off} bytes of trailing garbage")
    if flags & SEG_FIRST:
        chunk_len = len(payloads[0])
        if total < chunk_len or (flags & SEG_LAST and total != chunk_len):
            raise WireError(f"segment total {total} inconsistent with chunk of {chunk_len}")
    return Frame(dst, src, _KINDS[kind], stream, seq, flags, payloads, total)


def pack_frames(
    dst: bytes,
    src: bytes,
    kind: Kind,
    stream: int,
    first_seq: int,
    payloads: list[bytes],
    mtu: int = DEFAULT_MTU,
    ethertype: int = ETHERTYPE,
    flags: int = 0,
) -> list[bytes]:
    """Batch payloads into as few frames as fit in ``mtu``, segmenting oversize ones.

    Payload order is kept.  Frame ``i`` gets sequence number ``first_seq + i`` modulo
    2**32 (``first_seq`` itself may be any int, so callers can just keep adding).
    ``flags`` may only be :data:`LB` (segment flags are set here; ACK_REQ is set on
    single frames with :func:`with_flags`).
    """
    _check_addr_args(dst, src, ethertype)
    if flags & ~LB:
        raise ValueError(f"pack_frames sets segment flags itself, got flags {flags:#04x}")
    kind = Kind(kind)
    _check_int("stream", stream, 0, _U16_MAX)
    _check_int("mtu", mtu, MIN_MTU, _U32_MAX)
    cap = mtu - HEADER_LEN  # bytes available after the Typhoon header
    # an entry fits unsegmented if its u16 prefix + body fit and the prefix can hold it
    max_single = min(cap - 2, _U16_MAX)
    pack_hdr = _HDR.pack
    pack_len = _U16.pack
    join = b"".join
    seq = first_seq & _U32_MAX
    frames: list[bytes] = []
    # [header slot, u16 length, payload, u16 length, payload, ...]: one join per frame
    parts: list[bytes] = [b""]
    used = 0
    max_parts = 1 + 2 * _U16_MAX
    for p in payloads:
        n = len(p)
        if len(parts) > 1 and (n > max_single or used + n + 2 > cap or len(parts) == max_parts):
            parts[0] = pack_hdr(
                dst, src, ethertype, VERSION, kind, flags, 0, stream, seq, len(parts) >> 1
            )
            frames.append(join(parts))
            seq = (seq + 1) & _U32_MAX
            parts = [b""]
            used = 0
        if n > max_single:
            seq = _segment(frames, p, cap, dst, src, ethertype, kind, stream, seq, flags)
            continue
        parts.append(pack_len(n))
        parts.append(p)
        used += n + 2
    if len(parts) > 1:
        parts[0] = pack_hdr(
            dst, src, ethertype, VERSION, kind, flags, 0, stream, seq, len(parts) >> 1
        )
        frames.append(join(parts))
    return frames


def _segment(
    frames: list[bytes],
    payload: bytes,
    cap: int,
    dst: bytes,
    src: bytes,
    ethertype: int,
    kind: Kind,
    stream: int,
    seq: int,
    extra_flags: int = 0,
) -> int:
    """Append the SEG frames of one oversize payload; return the next sequence number."""
    total = len(payload)
    if total > _U32_MAX:
        raise ValueError(f"payload of {total} bytes exceeds the u32 total length")
    view = memoryview(payload)
    first = min(cap - 6, _U16_MAX)  # after u32 total + u16 length
    rest = min(cap - 2, _U16_MAX)
    off = 0
    flags = SEG | SEG_FIRST | extra_flags
    while off < total:
        size = first if off == 0 else rest
        end = min(off + size, total)
        if end == total:
            flags |= SEG_LAST
        hdr = _HDR.pack(dst, src, ethertype, VERSION, kind, flags, 0, stream, seq, 1)
        if off == 0:
            hdr += _U32.pack(total)
        frames.append(b"".join((hdr, _U16.pack(end - off), view[off:end])))
        seq = (seq + 1) & _U32_MAX
        off = end
        flags = SEG | extra_flags
    return seq


def with_flags(frame: bytes, flags: int) -> bytes:
    """A copy of an encoded frame with ``flags`` (e.g. :data:`ACK_REQ`) set as well."""
    if flags & ~_FLAG_MASK or flags & _SEG_MASK:
        raise ValueError(f"with_flags sets only LB and ACK_REQ, got {flags:#04x}")
    i = _FLAGS_OFFSET
    return b"".join((frame[:i], bytes((frame[i] | flags,)), frame[i + 1 :]))


@dataclass(slots=True)
class _Partial:
    total: int
    next_seq: int
    received: int
    chunks: list[bytes] = field(default_factory=list)


class Reassembler:
    """Per-link reassembly of segmented payloads; yields complete payloads in order.

    State is kept per (src, dst, kind, stream): segments of one payload are sent as
    consecutive frames, so any gap in their sequence numbers means a lost segment.
    A frame that starts something new (unsegmented, or SEG_FIRST) while a payload is
    half done proves its tail was lost: the partial is dropped and counted in
    ``discarded`` but the new frame is still delivered, since it is intact.
    """

    def __init__(self, max_size: int = 64 * 1024 * 1024) -> None:
        self.max_size = max_size
        self.discarded = 0
        self._partial: dict[tuple[bytes, bytes, int, int], _Partial] = {}

    def pending(self) -> int:
        """Number of payloads currently half reassembled."""
        return len(self._partial)

    def feed(self, frame: Frame) -> list[bytes]:
        flags = frame.flags
        key = (frame.src, frame.dst, frame.kind, frame.stream)
        partials = self._partial
        if not flags & SEG:
            if partials and partials.pop(key, None) is not None:
                self.discarded += 1
            return frame.payloads
        if len(frame.payloads) != 1:
            raise WireError("segment frame must carry exactly one chunk")
        chunk = frame.payloads[0]
        if flags & SEG_FIRST:
            if partials.pop(key, None) is not None:
                self.discarded += 1
            total = frame.total
            if total > self.max_size:
                raise WireError(f"payload of {total} bytes exceeds max_size {self.max_size}")
            if flags & SEG_LAST:  # the whole payload in a single segment
                if len(chunk) != total:
                    raise WireError("single segment does not match its total length")
                return [chunk]
            if len(chunk) >= total:
                raise WireError("first segment is not shorter than its total length")
            partials[key] = _Partial(total, (frame.seq + 1) & _U32_MAX, len(chunk), [chunk])
            return []
        partial = partials.get(key)
        if partial is None:
            raise WireError(f"segment seq {frame.seq} without a first segment")
        if frame.seq != partial.next_seq:
            del partials[key]
            raise WireError(f"segment seq {frame.seq}, expected {partial.next_seq}: lost segment")
        received = partial.received + len(chunk)
        if received > partial.total or (flags & SEG_LAST and received != partial.total):
            del partials[key]
            raise WireError(f"segments carry {received} bytes, total says {partial.total}")
        partial.chunks.append(chunk)
        if flags & SEG_LAST:
            del partials[key]
            return [b"".join(partial.chunks)]
        partial.received = received
        partial.next_seq = (partial.next_seq + 1) & _U32_MAX
        return []


# --------------------------------------------------------------------------- control tuples


class Control(IntEnum):
    ROUTING = 1
    SIGNAL = 2
    METRIC_REQ = 3
    METRIC_RESP = 4
    INPUT_RATE = 5
    ACTIVATE = 6
    DEACTIVATE = 7
    BATCH_SIZE = 8
    DRAIN = 9
    UPSTREAM = 10  # the workers that send to this one changed (runtime reconfiguration)
    FLOW_CONTROL = 11  # the bytes this worker may have in flight (its share of the fabric)
    ROLLBACK = 12  # go back to a global checkpoint as a new generation (guaranteed processing)
    COMPLETE = 13  # every worker of the application finished: a finished worker may exit


# Control tuples a worker handles ahead of the data queued before them (docs/flow_control.md,
# "Control traffic apart from data"): each reads or sets a parameter of the worker's current
# state and means the same whatever data it overtakes.  Every other kind keeps its place in
# the arrival order: ROUTING, SIGNAL, UPSTREAM and DRAIN are steps of the stable update
# protocol (a SIGNAL flushes state only after the tuples that arrived before it), ROLLBACK
# and COMPLETE of the guarantee protocol, ACTIVATE and DEACTIVATE start and stop a spout
# in order with the ROUTING that precedes them.
URGENT_CONTROL = frozenset(
    {Control.METRIC_REQ, Control.FLOW_CONTROL, Control.BATCH_SIZE, Control.INPUT_RATE}
)


POLICIES = frozenset({"shuffle", "fields", "all", "global", "direct", "local_or_shuffle", "sdn"})


@dataclass(frozen=True)
class ControlTuple:
    """A control tuple (paper Table 2); ``body`` follows the schema of its type."""

    type: Control
    body: dict


_Check = Callable[[Any], Any]
_REQUIRED = object()
_OMITTED = object()  # optional key that stays absent when not given (no default filled in)
_MAX_U64 = 2**64 - 1


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(lo: int, hi: int) -> _Check:
    def check(v: Any) -> int:
        if not _is_int(v) or not lo <= v <= hi:
            raise ValueError(f"expected an int in {lo}..{hi}, got {v!r}")
        return int(v)

    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def _nonneg_float(v: Any) -> float:
    if not (_is_int(v) or isinstance(v, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"expected a finite number >= 0, got {v!r}")
    return float(v)


def _choice(options: frozenset[str]) -> _Check:
    def check(v: Any) -> str:
        if not isinstance(v, str) or v not in options:
            raise ValueError(f"expected one of {sorted(options)}, got {v!r}")
        return v

    return check


def _list_of(item: _Check) -> _Check:
    def check(v: Any) -> list:
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"expected a list, got {type(v).__name__}")
        return [item(x) for x in v]

    return check


def _str_key_dict(value: _Check) -> _Check:
    def check(v: Any) -> dict:
        if not isinstance(v, dict):
            raise ValueError(f"expected a dict, got {type(v).__name__}")
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise ValueError(f"dict keys must be str, got {k!r}")
            out[k] = value(x)
        return out

    return check


_worker_id = _int(1, _MAX_ID)
_u64 = _int(0, _MAX_U64)
_metric_int = _int(-(2**63), _MAX_U64)  # what msgpack can carry


def _metric_value(v: Any) -> Any:
    if isinstance(v, dict):
        return _metrics(v)
    if isinstance(v, (str, float)):
        return v
    return _metric_int(v)


_metrics = _str_key_dict(_metric_value)

_SCHEMAS: dict[Control, dict[str, tuple[_Check, Any]]] = {
    Control.ROUTING: {
        "stream": (_int(0, _U16_MAX), _REQUIRED),
        "policy": (_choice(POLICIES), _REQUIRED),
        "next_hops": (_list_of(_worker_id), _REQUIRED),
        "fields": (_list_of(_int(0, _U16_MAX)), []),
        "table": (_str_key_dict(_worker_id), {}),
        "version": (_u64, _REQUIRED),
        "local": (_list_of(_worker_id), []),
        "lb_node": (_int(0, 0xFF), 0),
        # receivers this sender will never send to again: end of stream goes to each of
        # them right after the route is installed (stable removal, docs/design.md §5)
        "release": (_list_of(_worker_id), _OMITTED),
        # sdn policy: true = frames go to the node's load-balancer address and the switch
        # picks the worker; absent = keep the stream's current mode (the LB app sets it)
        "balanced": (_bool, _OMITTED),
    },
    Control.SIGNAL: {"version": (_u64, _REQUIRED)},
    Control.METRIC_REQ: {"request_id": (_u64, _REQUIRED)},
    Control.METRIC_RESP: {
        "request_id": (_u64, _REQUIRED),
        "worker": (_worker_id, _REQUIRED),
        "metrics": (_metrics, _REQUIRED),
    },
    Control.INPUT_RATE: {"rate": (_nonneg_float, _REQUIRED)},
    Control.ACTIVATE: {},
    Control.DEACTIVATE: {},
    Control.BATCH_SIZE: {
        "size": (_int(1, _U32_MAX), _REQUIRED),
        "max_delay_ms": (_nonneg_float, _REQUIRED),
    },
    Control.DRAIN: {"version": (_u64, _REQUIRED)},
    # bytes of truesize the worker may have in flight (typhoon.topology.budgets)
    Control.FLOW_CONTROL: {"budget": (_int(0, _U32_MAX), _REQUIRED)},
    # a recovery: restore the global checkpoint ``epoch`` (-1: the start) as ``generation``
    Control.ROLLBACK: {
        "generation": (_int(1, _U32_MAX), _REQUIRED),
        "epoch": (_int(-1, 2**62), _REQUIRED),
    },
    Control.COMPLETE: {},
    # senders that start (add) or stopped without end of stream (remove) sending to a worker
    Control.UPSTREAM: {
        "add": (_list_of(_worker_id), []),
        "remove": (_list_of(_worker_id), []),
        "version": (_u64, _REQUIRED),
        # false: a sender in ``add`` whose end of stream already came stays finished
        # (a replacement told who sends to it, not a sender routing to it again)
        "reopen": (_bool, True),
    },
}


def _normalize(ctype: Control, body: Any) -> dict:
    """Validated copy of ``body`` with defaults filled in; ValueError if invalid."""
    if not isinstance(body, dict):
        raise ValueError(f"{ctype.name} body must be a dict, got {type(body).__name__}")
    schema = _SCHEMAS[ctype]
    unknown = [k for k in body if k not in schema]
    if unknown:
        raise ValueError(f"{ctype.name}: unknown keys {unknown!r}")
    out = {}
    for key, (check, default) in schema.items():
        if key in body:
            try:
                out[key] = check(body[key])
            except ValueError as e:
                raise ValueError(f"{ctype.name}.{key}: {e}") from None
        elif default is _REQUIRED:
            raise ValueError(f"{ctype.name}: missing key {key!r}")
        elif default is not _OMITTED:
            out[key] = type(default)(default)  # fresh copy of a mutable default
    return out


def encode_control(ct: ControlTuple) -> bytes:
    """Validate, then serialize as msgpack ``[type, body]`` (defaults filled in)."""
    ctype = Control(ct.type)
    return msgpack.packb([int(ctype), _normalize(ctype, ct.body)], use_bin_type=True)


def decode_control(data: bytes) -> ControlTuple:
    """Inverse of :func:`encode_control`; malformed or invalid bodies are WireErrors."""
    value = decode_tuple(data)
    if len(value) != 2:
        raise WireError("a control tuple must be a 2-element msgpack array")
    ctype, body = value
    try:
        if not _is_int(ctype):
            raise ValueError(f"control tuple type must be an int, got {ctype!r}")
        ctype = Control(ctype)
        return ControlTuple(ctype, _normalize(ctype, body))
    except ValueError as e:
        raise WireError(str(e)) from None


# --------------------------------------------------------------------------- credits


def encode_credit(credits: int) -> bytes:
    """One u32 entry of a CREDIT frame (a link id, a count or a sequence number)."""
    return _U32.pack(_check_int("credits", credits, 0, _U32_MAX))


def decode_credit(data: bytes) -> int:
    if len(data) != 4:
        raise WireError(f"credit body must be 4 bytes, got {len(data)}")
    return _U32.unpack(data)[0]
