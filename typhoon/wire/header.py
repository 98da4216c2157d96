"""The frame header, declared once as a field list: every reader derives from it.

A field is a name, a ``struct`` code and what it means.  ``frames.py`` packs and
unpacks with :data:`LAYOUT`'s struct (built here once, at import, so a frame costs
what it did), ``typhoon/control_queue.py`` reads its ``tc`` match offsets and widths
from :data:`LAYOUT`, and ``typhoon/dissect.py`` builds its scapy fields from the same
list; the table in ``typhoon/wire/__init__.py`` is :meth:`Layout.table`'s text (a
unit test compares them).  Changing the header is one edit here (plus
``frames.py``'s pack calls, which pass the fields in this order and check it at
import).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

VERSION = 2  # 2: data entries are row batches (1: one tuple per entry)


class Kind(IntEnum):
    """The header's ``kind`` field."""

    DATA = 0
    CONTROL = 1
    CREDIT = 2


# the header's ``flags`` field: bit i is FLAGS[i] (the scapy layer shows these names)
FLAGS: tuple[tuple[str, str], ...] = (
    ("SEG", "a segment of a payload too large for one frame"),
    ("SEG_FIRST", "its first segment (a u32 total length precedes the chunk)"),
    ("SEG_LAST", "its last segment"),
    ("LB", "sent to a load-balancer address (credit to the group's window)"),
    ("ACK_REQ", "the sender asks for a grant once the frame is consumed"),
)


def flag_bit(name: str) -> int:
    """The bit of flag ``name`` in the ``flags`` field."""
    return 1 << [n for n, _ in FLAGS].index(name)


@dataclass(frozen=True)
class Field:
    """One fixed-width, big-endian field: ``fmt`` is one ``struct`` code (``6s``, ``B``,
    ``H``, ``I``, ``Q``)."""

    name: str
    fmt: str
    meaning: str

    @property
    def size(self) -> int:
        return struct.calcsize("!" + self.fmt)

    @property
    def max(self) -> int:
        """Largest value an integer field holds."""
        if self.fmt.endswith("s"):
            raise ValueError(f"{self.name} is bytes, not an integer")
        return (1 << (8 * self.size)) - 1


ETHERNET: tuple[Field, ...] = (
    Field("dst", "6s", "Ethernet destination (address above)"),
    Field("src", "6s", "Ethernet source"),
    Field("ethertype", "H", "EtherType, 0x88B5 by default (configurable)"),
)

TYPHOON: tuple[Field, ...] = (
    Field("version", "B", f"wire version ({VERSION})"),
    Field("kind", "B", ", ".join(f"{k.value} {k.name.lower()}" for k in Kind)),
    Field(
        "flags",
        "B",
        ", ".join(f"{1 << i:#04x} {n}" for i, (n, _) in enumerate(FLAGS)) + ", rest 0",
    ),
    Field("reserved", "B", "0"),
    Field("stream", "H", "stream id (of a credit frame: its kind, typhoon.runtime.links)"),
    Field("seq", "I", "sequence number, +1 per frame on a link, wraps at 2**32"),
    Field("count", "H", "count of entries"),
)

# after the header: the total length a SEG_FIRST frame carries, then each entry's length
SEGMENT_TOTAL = Field("total", "I", "a segmented payload's whole length (SEG_FIRST only)")
ENTRY_LENGTH = Field("len", "H", "length of the entry that follows")
# A data entry that starts with this byte is a column block (typhoon/wire/columns.py), not a
# msgpack row batch: 0xC1 is the one byte msgpack never uses, so no msgpack value starts so.
BLOCK_MARK = b"\xc1"


class Layout:
    """Offsets, sizes and the packing struct of an Ethernet + Typhoon header."""

    def __init__(self, ethernet: tuple[Field, ...], typhoon: tuple[Field, ...]) -> None:
        fields = ethernet + typhoon
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"header field names repeat: {names}")
        self.ethernet = ethernet
        self.typhoon = typhoon
        self.fields = fields
        self.names = tuple(names)
        self.struct = struct.Struct("!" + "".join(f.fmt for f in fields))
        self.eth_len = struct.calcsize("!" + "".join(f.fmt for f in ethernet))
        self.header_len = self.struct.size - self.eth_len  # the Typhoon header alone
        self.field = {f.name: f for f in fields}
        self.offset: dict[str, int] = {}
        at = 0
        for f in fields:
            self.offset[f.name] = at
            at += f.size

    def table(self) -> str:
        """The layout as ``typhoon/wire/__init__.py`` prints it (offsets in the frame)."""
        rows = ["offset  size  field"]
        rows += [
            f"{self.offset[f.name]:<8}{f.size:<6}{f.name}: {f.meaning}".rstrip()
            for f in self.fields
        ]
        rows.append(f"{self.struct.size:<8}      entries (below)")
        return "\n".join(rows)


LAYOUT = Layout(ETHERNET, TYPHOON)
