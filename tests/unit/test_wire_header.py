"""The frame header is declared once (typhoon/wire/header.py): golden frames pin its
bytes, and every reader (frames.py, the tc classifier, the scapy layer, the docs'
table) follows a change of the declaration."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scapy.layers.l2 import Ether

import typhoon.wire
from typhoon import control_queue as cq
from typhoon.dissect import Typhoon, decode_tuples
from typhoon.runtime import links as lk
from typhoon.wire import (
    ACK_REQ,
    ETH_HLEN,
    HEADER_LEN,
    LAYOUT,
    LB,
    MIN_MTU,
    SEG,
    SEG_FIRST,
    SEG_LAST,
    Control,
    ControlTuple,
    Kind,
    Reassembler,
    controller_mac,
    decode_frame,
    encode_control,
    encode_credit,
    encode_rows,
    pack_frames,
    with_flags,
    worker_mac,
)
from typhoon.wire.header import ETHERNET, TYPHOON, Field, Layout

ROOT = Path(__file__).resolve().parents[2]
APP = 0x0A
A, B, CTRL = worker_mac(APP, 1), worker_mac(APP, 2), controller_mac(APP)
ROWS = [[1, "a"], [2, "b"]]
SIGNAL = ControlTuple(Control.SIGNAL, {"version": 3})

# Each literal: dst | src | ethertype | version kind flags reserved | stream | seq | count,
# then the entries.  Changing these bytes is changing the wire format.
GOLDEN = {
    "data batch, ACK_REQ": (
        with_flags(pack_frames(B, A, Kind.DATA, 3, 7, [encode_rows(ROWS)])[0], ACK_REQ),
        "02000a000002 02000a000001 88b5 02 00 10 00 0003 00000007 0001 0009 9292 01a161 9202a162",
        dict(kind=Kind.DATA, flags=ACK_REQ, stream=3, seq=7, count=1, total=None),
        ROWS,
    ),
    "control tuple": (
        pack_frames(B, CTRL, Kind.CONTROL, 0, 1, [encode_control(SIGNAL)])[0],
        "02000a000002 02000a010000 88b5 02 01 00 00 0000 00000001 0001"
        " 000c 9202 81 a776657273696f6e 03",
        dict(kind=Kind.CONTROL, flags=0, stream=0, seq=1, count=1, total=None),
        [SIGNAL],
    ),
    "credit (GRANT)": (
        pack_frames(A, B, Kind.CREDIT, lk.GRANT, 9, [encode_credit(v) for v in (0, 5, 6)])[0],
        "02000a000001 02000a000002 88b5 02 02 00 00 0000 00000009 0003"
        " 0004 00000000 0004 00000005 0004 00000006",
        dict(kind=Kind.CREDIT, flags=0, stream=lk.GRANT, seq=9, count=3, total=None),
        [0, 5, 6],
    ),
}
BIG_ROW = [["segmented tuple", 7]]  # 19 bytes of row batch: three segments at this MTU
SEGMENTS = pack_frames(
    B, A, Kind.DATA, 1, 0xFFFFFFFF, [encode_rows(BIG_ROW)], MIN_MTU + 4, flags=LB
)
GOLDEN_SEGMENTS = [  # sequence numbers wrap; the first segment carries the total (0x13)
    "02000a000002 02000a000001 88b5 02 00 0b 00 0001 ffffffff 0001 00000013 0005 9192af7365",
    "02000a000002 02000a000001 88b5 02 00 09 00 0001 00000000 0001 0009 676d656e7465642074",
    "02000a000002 02000a000001 88b5 02 00 0d 00 0001 00000001 0001 0005 75706c6507",
]


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_frames_are_these_bytes(name):
    frame, golden, _, _ = GOLDEN[name]
    assert frame.hex() == bytes.fromhex(golden).hex()


def test_golden_segments_are_these_bytes():
    assert [f.hex() for f in SEGMENTS] == [bytes.fromhex(g).hex() for g in GOLDEN_SEGMENTS]
    assert [f[LAYOUT.offset["flags"]] for f in SEGMENTS] == [
        SEG | SEG_FIRST | LB,
        SEG | LB,
        SEG | SEG_LAST | LB,
    ]


@pytest.mark.parametrize("name", GOLDEN)
def test_scapy_reads_the_golden_frames_back_to_their_fields(name):
    _, golden, fields, decoded = GOLDEN[name]
    pkt = Ether(bytes.fromhex(golden))
    t = pkt[Typhoon]
    assert (t.version, t.reserved) == (typhoon.wire.VERSION, 0)
    assert {k: (int(getattr(t, k)) if k != "total" else t.total) for k in fields} == fields
    assert decode_tuples(pkt) == decoded
    frame = decode_frame(bytes.fromhex(golden))
    assert (frame.kind, frame.flags, frame.stream, frame.seq) == (
        fields["kind"],
        fields["flags"],
        fields["stream"],
        fields["seq"],
    )
    assert bytes(pkt) == bytes.fromhex(golden)  # scapy builds the same bytes back


def test_scapy_reads_the_golden_segments_back():
    layers = [Ether(bytes.fromhex(g))[Typhoon] for g in GOLDEN_SEGMENTS]
    assert [(int(t.flags), t.seq, t.total) for t in layers] == [
        (SEG | SEG_FIRST | LB, 0xFFFFFFFF, 19),
        (SEG | LB, 0, None),
        (SEG | SEG_LAST | LB, 1, None),
    ]
    r = Reassembler()
    assert [decode_tuples(Ether(bytes.fromhex(g)), r) for g in GOLDEN_SEGMENTS] == [[], [], BIG_ROW]
    assert b"".join(t.entries[0].data for t in layers) == encode_rows(BIG_ROW)


# ----- one declaration, every reader ------------------------------------------------


def test_frames_pack_with_the_declared_layout():
    assert LAYOUT.names == tuple(f.name for f in ETHERNET + TYPHOON)
    assert (ETH_HLEN, HEADER_LEN) == (LAYOUT.eth_len, LAYOUT.header_len) == (14, 12)
    frame = GOLDEN["credit (GRANT)"][0]
    values = dict(zip(LAYOUT.names, LAYOUT.struct.unpack_from(frame), strict=True))
    for name, value in values.items():
        at, size = LAYOUT.offset[name], LAYOUT.field[name].size
        raw = frame[at : at + size]
        assert raw == value or int.from_bytes(raw, "big") == value, name
    assert values["kind"] == Kind.CREDIT and values["stream"] == lk.GRANT


def test_the_control_queue_matches_where_frames_py_writes():
    """The tc filters' offsets and masks, applied to a frame frames.py built, find the
    EtherType, the kind and the stream, where the header declares them."""
    link = cq.LinkQueueing("s1-eth1", 100)
    frame = GOLDEN["credit (GRANT)"][0]
    matches = cq.control_matches(link, lk.GRANT)
    assert [(m[0], m[2], m[3]) for m in matches] == [
        ("u16", 0xFFFF, LAYOUT.offset["ethertype"] - ETH_HLEN),
        ("u8", 0xFF, LAYOUT.offset["kind"] - ETH_HLEN),
        ("u16", 0xFFFF, LAYOUT.offset["stream"] - ETH_HLEN),
    ]
    for size, value, mask, off in matches:  # what the kernel's u32 classifier does
        key, keymask, word = cq.tc_key(size, value, mask, off)
        at = ETH_HLEN + word
        assert int.from_bytes(frame[at : at + 4], "big") & keymask == key
    assert cq.is_urgent_frame(frame)
    assert not cq.is_urgent_frame(GOLDEN["data batch, ACK_REQ"][0])


def test_the_control_queue_refuses_a_field_tc_cannot_match(monkeypatch):
    odd = tuple(Field(f.name, "H", f.meaning) if f.name == "version" else f for f in TYPHOON)
    monkeypatch.setattr(cq, "LAYOUT", Layout(ETHERNET, odd))  # stream at 19: not aligned
    with pytest.raises(ValueError, match="tc cannot match 2 bytes"):
        cq.control_matches(cq.LinkQueueing("s1-eth1", 100), lk.GRANT)


def test_scapy_fields_are_the_declared_fields():
    declared = [(f.name, f.size) for f in TYPHOON]
    scapy = [(f.name, f.sz) for f in Typhoon.fields_desc[: len(TYPHOON)]]
    assert [n for n, _ in scapy] == [n for n, _ in declared]
    assert [s for n, s in scapy if n != "flags"] == [s for n, s in declared if n != "flags"]
    flags = Typhoon.fields_desc[[n for n, _ in declared].index("flags")]
    assert flags.size == 8 * LAYOUT.field["flags"].size
    assert flags.names == [n for n, _ in typhoon.wire.FLAGS]


def test_the_docs_table_is_the_declaration():
    assert textwrap.indent(LAYOUT.table(), "    ") in typhoon.wire.__doc__


def test_a_layout_refuses_repeated_names():
    with pytest.raises(ValueError, match="repeat"):
        Layout(ETHERNET, (*TYPHOON, Field("seq", "H", "again")))


def _run(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter whose header declaration it edits first."""
    prelude = textwrap.dedent(
        """
        import dataclasses, importlib.util, sys
        spec = importlib.util.spec_from_file_location(
            "typhoon.wire.header", "typhoon/wire/header.py")
        h = importlib.util.module_from_spec(spec)
        sys.modules["typhoon.wire.header"] = h
        spec.loader.exec_module(h)
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_wider_field_moves_every_reader():
    """Widen ``version`` and ``reserved`` to two bytes in the declaration alone: frames.py
    packs the longer header, the tc filters move to the new offsets, scapy dissects it."""
    done = _run(
        """
        wide = {"version", "reserved"}
        h.TYPHOON = tuple(dataclasses.replace(f, fmt="H") if f.name in wide else f
                          for f in h.TYPHOON)
        h.LAYOUT = h.Layout(h.ETHERNET, h.TYPHOON)
        from scapy.layers.l2 import Ether
        from typhoon import control_queue as cq, wire
        from typhoon.dissect import Typhoon, decode_tuples
        from typhoon.runtime import links as lk
        a, b = wire.worker_mac(10, 1), wire.worker_mac(10, 2)
        credits = [wire.encode_credit(v) for v in (0, 5, 6)]
        frame = wire.pack_frames(a, b, wire.Kind.CREDIT, lk.GRANT, 9, credits)[0]
        assert wire.HEADER_LEN == 14 and len(frame) == 14 + 14 + 3 * 6, len(frame)
        assert frame[14:16] == b"\\x00\\x02" and frame[16] == wire.Kind.CREDIT
        assert frame[20:22] == lk.GRANT.to_bytes(2, "big")
        assert wire.with_flags(frame, wire.ACK_REQ)[17] == wire.ACK_REQ
        f = wire.decode_frame(frame)
        assert (f.kind, f.stream, f.seq, f.payloads) == (wire.Kind.CREDIT, lk.GRANT, 9, credits)
        link = cq.LinkQueueing("s1-eth1", 100)
        offsets = [m[3] for m in cq.control_matches(link, lk.GRANT)]
        assert offsets == [-2, 2, 6], offsets
        assert cq.is_urgent_frame(frame)
        t = Ether(frame)[Typhoon]
        assert (t.version, t.kind, t.stream, t.seq, t.count) == (2, 2, lk.GRANT, 9, 3)
        assert decode_tuples(Ether(frame)) == [0, 5, 6] and bytes(Ether(frame)) == frame
        print("moved")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "moved", done.stderr


def test_a_reordered_declaration_stops_frames_py_at_import():
    """frames.py passes the fields positionally: a reorder it was not updated for is an
    ImportError naming both orders, never frames with swapped fields."""
    done = _run(
        """
        order = {f.name: f for f in h.TYPHOON}
        names = ["version", "flags", "kind", "reserved", "stream", "seq", "count"]
        h.LAYOUT = h.Layout(h.ETHERNET, tuple(order[n] for n in names))
        import typhoon.wire
        """
    )
    assert done.returncode != 0
    assert "ImportError: frames.py packs" in done.stderr
    assert "'version', 'flags', 'kind'" in done.stderr
