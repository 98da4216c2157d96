"""Frames: the Typhoon header, segmentation and reassembly, credit entries.

The header's fields are declared once, in ``typhoon/wire/header.py``; this module
packs and parses frames with the struct built there (once, at import).  The byte
layout is documented in ``typhoon/wire/__init__.py``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from typhoon.wire.checks import U32_MAX, WireError, check_int
from typhoon.wire.header import ENTRY_LENGTH, LAYOUT, SEGMENT_TOTAL, VERSION, Kind, flag_bit

ETHERTYPE = 0x88B5
HEADER_LEN = LAYOUT.header_len
ETH_HLEN = LAYOUT.eth_len
ETH_ZLEN = 60  # minimum Ethernet frame without FCS; shorter frames get zero padding
DEFAULT_MTU = 9000
# room for a first segment carrying one byte
MIN_MTU = HEADER_LEN + SEGMENT_TOTAL.size + ENTRY_LENGTH.size + 1

# The pack and unpack calls below pass the fields positionally, in this order: a
# header change that adds, drops or reorders a field must change them too.
_PACKED = ("dst", "src", "ethertype", "version", "kind", "flags", "reserved", "stream", "seq",
           "count")  # fmt: skip
if LAYOUT.names != _PACKED:
    raise ImportError(f"frames.py packs {_PACKED}, the header declares {LAYOUT.names}")

SEG = flag_bit("SEG")
SEG_FIRST = flag_bit("SEG_FIRST")
SEG_LAST = flag_bit("SEG_LAST")
LB = flag_bit("LB")
ACK_REQ = flag_bit("ACK_REQ")
_SEG_MASK = SEG | SEG_FIRST | SEG_LAST
_FLAG_MASK = _SEG_MASK | LB | ACK_REQ
_FLAGS_OFFSET = LAYOUT.offset["flags"]
_FLAGS_MAX = LAYOUT.field["flags"].max
_STREAM_MAX = LAYOUT.field["stream"].max
_SEQ_MAX = LAYOUT.field["seq"].max
_COUNT_MAX = LAYOUT.field["count"].max
_ETHERTYPE_MAX = LAYOUT.field["ethertype"].max
_ENTRY_MAX = ENTRY_LENGTH.max
_TOTAL_MAX = SEGMENT_TOTAL.max

_KINDS = tuple(Kind)

# Ethernet header + Typhoon header in one struct: one call per frame.
_HDR = LAYOUT.struct
_ENTRY_LEN = struct.Struct("!" + ENTRY_LENGTH.fmt)
_TOTAL = struct.Struct("!" + SEGMENT_TOTAL.fmt)
_U32 = struct.Struct("!I")  # a credit entry
_FULL_HLEN = _HDR.size


def entry_capacity(mtu: int) -> int:
    """Largest entry that still travels unsegmented in one frame of ``mtu``."""
    return min(mtu - HEADER_LEN - _ENTRY_LEN.size, _ENTRY_MAX)


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
    check_int("ethertype", ethertype, 0, _ETHERTYPE_MAX)


def encode_frame(frame: Frame, ethertype: int = ETHERTYPE) -> bytes:
    """Serialize one frame exactly as given (no batching, no MTU check)."""
    _check_addr_args(frame.dst, frame.src, ethertype)
    kind = Kind(frame.kind)
    check_int("stream", frame.stream, 0, _STREAM_MAX)
    check_int("seq", frame.seq, 0, _SEQ_MAX)
    flags = check_int("flags", frame.flags, 0, _FLAGS_MAX)
    payloads = frame.payloads
    count = len(payloads)
    problem = _check_flags(flags, count)
    if problem:
        raise ValueError(problem)
    if count > _COUNT_MAX:
        raise ValueError(f"too many payloads for one frame: {count}")
    parts = [
        _HDR.pack(
            frame.dst, frame.src, ethertype, VERSION, kind, flags, 0, frame.stream, frame.seq, count
        )
    ]
    if flags & SEG_FIRST:
        total = check_int("total", frame.total, len(payloads[0]), _TOTAL_MAX)
        if flags & SEG_LAST and total != len(payloads[0]):
            raise ValueError("single-segment payload: total must equal the chunk length")
        parts.append(_TOTAL.pack(total))
    for p in payloads:
        if len(p) > _ENTRY_MAX:
            raise ValueError(f"payload of {len(p)} bytes exceeds the u16 length prefix")
        parts.append(_ENTRY_LEN.pack(len(p)))
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
        if blen < off + _TOTAL.size:
            raise WireError("segment total length past end of frame")
        (total,) = _TOTAL.unpack_from(buf, off)
        off += _TOTAL.size
    payloads: list[bytes] = []
    append = payloads.append
    unpack_len = _ENTRY_LEN.unpack_from
    elen = _ENTRY_LEN.size
    for _ in range(count):
        if off + elen > blen:
            raise WireError("fewer entries than the header count")
        (n,) = unpack_len(buf, off)
        off += elen
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
    check_int("stream", stream, 0, _STREAM_MAX)
    check_int("mtu", mtu, MIN_MTU, U32_MAX)
    cap = mtu - HEADER_LEN  # bytes available after the Typhoon header
    # an entry fits unsegmented if its length prefix + body fit and the prefix can hold it
    elen = _ENTRY_LEN.size
    max_single = min(cap - elen, _ENTRY_MAX)
    pack_hdr = _HDR.pack
    pack_len = _ENTRY_LEN.pack
    join = b"".join
    seq = first_seq & _SEQ_MAX
    frames: list[bytes] = []
    # [header slot, length, payload, length, payload, ...]: one join per frame
    parts: list[bytes] = [b""]
    used = 0
    max_parts = 1 + 2 * _COUNT_MAX
    for p in payloads:
        n = len(p)
        if len(parts) > 1 and (n > max_single or used + n + elen > cap or len(parts) == max_parts):
            parts[0] = pack_hdr(
                dst, src, ethertype, VERSION, kind, flags, 0, stream, seq, len(parts) >> 1
            )
            frames.append(join(parts))
            seq = (seq + 1) & _SEQ_MAX
            parts = [b""]
            used = 0
        if n > max_single:
            seq = _segment(frames, p, cap, dst, src, ethertype, kind, stream, seq, flags)
            continue
        parts.append(pack_len(n))
        parts.append(p)
        used += n + elen
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
    if total > _TOTAL_MAX:
        raise ValueError(f"payload of {total} bytes exceeds the u32 total length")
    view = memoryview(payload)
    first = min(cap - _TOTAL.size - _ENTRY_LEN.size, _ENTRY_MAX)  # after total + length
    rest = min(cap - _ENTRY_LEN.size, _ENTRY_MAX)
    off = 0
    flags = SEG | SEG_FIRST | extra_flags
    while off < total:
        size = first if off == 0 else rest
        end = min(off + size, total)
        if end == total:
            flags |= SEG_LAST
        hdr = _HDR.pack(dst, src, ethertype, VERSION, kind, flags, 0, stream, seq, 1)
        if off == 0:
            hdr += _TOTAL.pack(total)
        frames.append(b"".join((hdr, _ENTRY_LEN.pack(end - off), view[off:end])))
        seq = (seq + 1) & _SEQ_MAX
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
            partials[key] = _Partial(total, (frame.seq + 1) & _SEQ_MAX, len(chunk), [chunk])
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
        partial.next_seq = (partial.next_seq + 1) & _SEQ_MAX
        return []


# --------------------------------------------------------------------------- credits


def encode_credit(credits: int) -> bytes:
    """One u32 entry of a CREDIT frame (a link id, a count or a sequence number)."""
    return _U32.pack(check_int("credits", credits, 0, U32_MAX))


def decode_credit(data: bytes) -> int:
    if len(data) != 4:
        raise WireError(f"credit body must be 4 bytes, got {len(data)}")
    value: int = _U32.unpack(data)[0]
    return value
