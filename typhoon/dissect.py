"""Scapy layer and pcap reader for Typhoon frames.

tcpdump and Wireshark show Typhoon traffic as an opaque EtherType; this module
lets scapy print the header and the length-prefixed entries, and turns a capture
of a switch port back into tuples.  The byte layout is declared once, in
:mod:`typhoon.wire.header`: the scapy fields are built from that field list (so a
header change reaches this layer with no edit here), and every decode goes through
``typhoon.wire`` so there is one parser to trust.

Captures may come from scapy (``wrpcap``/``wrpcapng``) or tcpdump, on an Ethernet
port (optionally VLAN tagged) or on ``-i any`` (Linux cooked v1/v2, where the
destination address is not recorded and is reported as ``None``).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

from scapy.fields import (
    ConditionalField,
    EnumField,
    Field,
    FieldLenField,
    FlagsField,
    PacketListField,
    StrLenField,
)
from scapy.layers.l2 import CookedLinux, CookedLinuxV2, Dot1AD, Dot1Q, Ether
from scapy.packet import Packet, bind_layers
from scapy.utils import RawPcapReader

from typhoon.wire import (
    ETH_ZLEN,
    ETHERTYPE,
    SEG,
    SEG_FIRST,
    VERSION,
    Kind,
    Reassembler,
    WireError,
    decode_control,
    decode_credit,
    decode_frame,
    describe_block,
    header,
    is_block,
    mac_bytes,
    mac_str,
)
from typhoon.wire.columns import entry_rows

DLT_EN10MB = 1
DLT_LINUX_SLL = 113
DLT_LINUX_SLL2 = 276
_VLAN_TPIDS = frozenset({0x8100, 0x88A8, 0x9100})
_NO_MAC = bytes(6)
_ANY_MTU = 1 << 24  # captures are not bound by a worker's MTU
_U16 = struct.Struct("!H")


class TyphoonEntry(Packet):
    """One length-prefixed entry: a row batch, a control tuple, a credit, or a chunk."""

    name = "TyphoonEntry"
    fields_desc = [
        FieldLenField("len", None, length_of="data", fmt="!" + header.ENTRY_LENGTH.fmt),
        StrLenField("data", b"", length_from=lambda p: p.len),
    ]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s  # the next entry follows, not a payload of this one

    def mysummary(self) -> str:
        """A data entry that is a column block says so (its types and rows), since its
        bytes are not msgpack; any other entry shows its length."""
        data = bytes(self.data)
        if is_block(data):
            return f"TyphoonEntry {describe_block(data)}"
        return f"TyphoonEntry {len(data)} bytes"


def header_fields(fields: tuple[header.Field, ...]) -> list[Field[Any, Any]]:
    """Scapy fields of the Typhoon header, one per declared field, in order: ``kind``
    shows its :class:`Kind` names, ``flags`` its flag names, ``count`` is counted from
    the entries; any other field is a plain big-endian integer."""
    out: list[Field[Any, Any]] = []
    for f in fields:
        fmt = "!" + f.fmt
        if f.name == "kind":
            out.append(EnumField("kind", Kind.DATA, {k.value: k.name for k in Kind}, fmt=fmt))
        elif f.name == "flags":
            out.append(FlagsField("flags", 0, 8 * f.size, [n for n, _ in header.FLAGS]))
        elif f.name == "count":
            out.append(FieldLenField("count", None, count_of="entries", fmt=fmt))
        else:
            out.append(Field(f.name, VERSION if f.name == "version" else 0, fmt))
    return out


class Typhoon(Packet):
    """Typhoon header (declared in :mod:`typhoon.wire.header`) and its entries."""

    name = "Typhoon"
    fields_desc = [
        *header_fields(header.LAYOUT.typhoon),
        ConditionalField(
            Field("total", 0, "!" + header.SEGMENT_TOTAL.fmt), lambda p: int(p.flags) & SEG_FIRST
        ),
        PacketListField("entries", [], TyphoonEntry, count_from=lambda p: p.count),
    ]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s  # anything after the entries is Ethernet padding (or garbage)

    def mysummary(self) -> str:
        return self.sprintf(
            "Typhoon %Typhoon.kind% stream=%Typhoon.stream% seq=%Typhoon.seq% "
            "flags=%Typhoon.flags% count=%Typhoon.count%"
        )


def bind_ethertype(ethertype: int) -> None:
    """Make scapy dissect Typhoon under ``ethertype`` (the default one is bound on import)."""
    bind_layers(Ether, Typhoon, type=ethertype)
    bind_layers(Dot1Q, Typhoon, type=ethertype)
    bind_layers(Dot1AD, Typhoon, type=ethertype)
    bind_layers(CookedLinux, Typhoon, proto=ethertype)
    bind_layers(CookedLinuxV2, Typhoon, proto=ethertype)


bind_ethertype(ETHERTYPE)


def _decode_payloads(kind: Kind, payloads: list[bytes]) -> list[Any]:
    if kind == Kind.DATA:  # each entry a row batch or a column block: the frame's tuples
        return [row for p in payloads for row in entry_rows(p)]
    if kind == Kind.CONTROL:
        return [decode_control(p) for p in payloads]
    return [decode_credit(p) for p in payloads]


def _rebuild(dst: bytes, src: bytes, ethertype: int, body: bytes, wire_len: int) -> bytes:
    """Plain Ethernet frame for ``decode_frame`` from a capture's link-layer parts.

    If stripping a VLAN tag made a minimum-size (padded) frame shorter than 60
    bytes, restore the length so the padding is still recognised as padding.
    """
    frame = b"".join((dst, src, _U16.pack(ethertype), body))
    if len(frame) < ETH_ZLEN <= wire_len:
        frame += bytes(ETH_ZLEN - len(frame))
    return frame


def decode_tuples(pkt: Packet, reassembler: Reassembler | None = None) -> list[Any]:
    """Decoded entries of one scapy packet: tuple values, ControlTuples or credits.

    A segment of a larger payload needs ``reassembler`` (fed in capture order); it
    returns ``[]`` until the last segment arrives.
    """
    layer = pkt.getlayer(Typhoon)
    if layer is None:
        raise WireError("not a Typhoon frame")
    if Ether in pkt:
        dst, src = mac_bytes(pkt[Ether].dst), mac_bytes(pkt[Ether].src)
    else:
        cooked = pkt.getlayer(CookedLinux) or pkt.getlayer(CookedLinuxV2)
        src = bytes(cooked.src[:6]) if cooked is not None and cooked.lladdrlen == 6 else _NO_MAC
        dst = _NO_MAC
    frame = decode_frame(_rebuild(dst, src, ETHERTYPE, bytes(layer), len(pkt)), mtu=_ANY_MTU)
    if reassembler is not None:
        payloads = reassembler.feed(frame)
    elif frame.flags & SEG:
        raise WireError("segment of a larger payload: pass a Reassembler")
    else:
        payloads = frame.payloads
    return _decode_payloads(frame.kind, payloads)


class PcapTuple(NamedTuple):
    """What :func:`read_pcap_tuples` yields per Typhoon frame."""

    src_mac: str | None
    dst_mac: str | None
    kind: Kind
    stream: int
    seq: int
    decoded: list[Any]


def _split_link(
    data: bytes, linktype: int, ethertype: int
) -> tuple[bytes | None, bytes | None, bytes] | None:
    """(dst, src, Typhoon header + entries) of a captured frame, or None if not Typhoon."""
    if linktype == DLT_EN10MB:
        pos = 12
        while len(data) >= pos + 2:
            etype = _U16.unpack_from(data, pos)[0]
            if etype not in _VLAN_TPIDS:
                break
            pos += 4
        else:
            return None
        return (data[:6], data[6:12], data[pos + 2 :]) if etype == ethertype else None
    if linktype == DLT_LINUX_SLL:
        if len(data) < 16 or _U16.unpack_from(data, 14)[0] != ethertype:
            return None
        src = data[6:12] if _U16.unpack_from(data, 4)[0] == 6 else None
        return None, src, data[16:]
    if linktype == DLT_LINUX_SLL2:
        if len(data) < 20 or _U16.unpack_from(data, 0)[0] != ethertype:
            return None
        src = data[12:18] if data[11] == 6 else None
        return None, src, data[20:]
    raise ValueError(f"unsupported pcap link type {linktype}")


def read_pcap_tuples(
    path: str | os.PathLike[str], ethertype: int = ETHERTYPE, strict: bool = True
) -> Iterator[PcapTuple]:
    """Yield one :class:`PcapTuple` per Typhoon frame of a pcap/pcapng file, in order.

    Segmented payloads are reassembled: their segments yield ``decoded == []``
    except the last, which yields the whole payload.  Other traffic is skipped.
    With ``strict`` a malformed or truncated (snaplen) frame raises
    :class:`WireError`; otherwise it is skipped.
    """
    reassembler = Reassembler()
    with RawPcapReader(os.fspath(path)) as reader:
        for data, meta in reader:
            linktype = getattr(meta, "linktype", None)
            if linktype is None:
                linktype = reader.linktype
            try:
                parts = _split_link(data, linktype, ethertype)
            except ValueError:
                if strict:
                    raise
                continue
            if parts is None:
                continue
            dst, src, body = parts
            try:
                if meta.wirelen > len(data):
                    raise WireError(
                        f"frame captured {len(data)} of {meta.wirelen} bytes: raise the snaplen"
                    )
                frame_bytes = _rebuild(dst or _NO_MAC, src or _NO_MAC, ethertype, body, len(data))
                frame = decode_frame(frame_bytes, ethertype, mtu=_ANY_MTU)
                decoded = _decode_payloads(frame.kind, reassembler.feed(frame))
            except WireError:
                if strict:
                    raise
                continue
            yield PcapTuple(
                mac_str(src) if src is not None else None,
                mac_str(dst) if dst is not None else None,
                frame.kind,
                frame.stream,
                frame.seq,
                decoded,
            )
