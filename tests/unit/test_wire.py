"""Wire format: addresses, tuples, frames, segmentation, control tuples, credits."""

from __future__ import annotations

import math
import random
import struct

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from typhoon import wire
from typhoon.wire import (
    DEFAULT_MTU,
    ETH_HLEN,
    ETHERTYPE,
    HEADER_LEN,
    MIN_MTU,
    SEG,
    SEG_FIRST,
    SEG_LAST,
    AddrClass,
    Address,
    Control,
    ControlTuple,
    Frame,
    Kind,
    Reassembler,
    WireError,
    controller_mac,
    decode_control,
    decode_credit,
    decode_frame,
    decode_rows,
    decode_tuple,
    encode_control,
    encode_credit,
    encode_frame,
    encode_rows,
    encode_tuple,
    entry_capacity,
    lb_mac,
    mac_bytes,
    mac_str,
    multicast_mac,
    pack_frames,
    parse_mac,
    worker_mac,
)

SRC = worker_mac(7, 1)
DST = worker_mac(7, 2)
SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

app_ids = st.integers(1, 0xFFFE)
worker_ids = st.integers(1, 0xFFFE)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)


def raises_exactly(exc_type: type[BaseException], fn, *args, **kwargs) -> BaseException:
    """Like pytest.raises, but a subclass or any other exception fails the test."""
    try:
        fn(*args, **kwargs)
    except BaseException as e:  # the precise type is asserted below
        assert type(e) is exc_type, f"expected {exc_type.__name__}, got {type(e).__name__}: {e}"
        return e
    raise AssertionError(f"expected {exc_type.__name__}, nothing raised")


def decodes_or_wire_error(fn, data):
    """Garbage in: either a result or exactly WireError, never anything else."""
    try:
        return fn(data)
    except WireError as e:
        assert type(e) is WireError
        return None


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


# ------------------------------------------------------------------ addresses


def test_constants() -> None:
    assert (ETHERTYPE, wire.VERSION, HEADER_LEN, ETH_HLEN, DEFAULT_MTU) == (0x88B5, 2, 12, 14, 9000)
    assert (SEG, SEG_FIRST, SEG_LAST) == (1, 2, 4)
    assert issubclass(WireError, ValueError)
    assert [k.value for k in Kind] == [0, 1, 2]
    assert [c.value for c in Control] == list(range(1, 17))


@given(app_ids, worker_ids)
def test_worker_mac_roundtrip(app: int, wid: int) -> None:
    mac = worker_mac(app, wid)
    assert len(mac) == 6 and mac[0] == 0x02
    assert parse_mac(mac) == Address(app, AddrClass.WORKER, wid)
    assert mac_bytes(mac_str(mac)) == mac


@given(app_ids)
def test_controller_mac_roundtrip(app: int) -> None:
    mac = controller_mac(app)
    assert mac[0] == 0x02
    assert parse_mac(mac) == Address(app, AddrClass.CONTROLLER, 0)


@given(app_ids, st.integers(0, 255), st.integers(0, wire.LB_SLOTS - 1))
def test_lb_mac_roundtrip(app: int, node: int, slot: int) -> None:
    mac = lb_mac(app, node, slot)
    assert mac[0] == 0x02
    assert parse_mac(mac) == Address(app, AddrClass.LOAD_BALANCER, node << 8 | slot)


@given(app_ids, u16)
def test_multicast_mac_roundtrip(app: int, stream: int) -> None:
    mac = multicast_mac(app, stream)
    assert mac[0] == 0x03 and mac[0] & 1  # the Ethernet group bit is what OVS keys on
    assert parse_mac(mac) == Address(app, AddrClass.MULTICAST, stream)


def test_addresses_of_different_apps_and_classes_differ() -> None:
    macs = {
        worker_mac(1, 1),
        worker_mac(2, 1),
        controller_mac(1),
        lb_mac(1, 0, 1),
        multicast_mac(1, 1),
    }
    assert len(macs) == 5


def test_mac_str_format() -> None:
    assert mac_str(worker_mac(1, 5)) == "02:00:01:00:00:05"
    assert mac_bytes("02:00:01:00:00:05") == worker_mac(1, 5)
    assert mac_bytes("03:AB:cd:03:00:01") == bytes.fromhex("03abcd030001")


@pytest.mark.parametrize(
    "bad", ["", "02:00:01:00:00", "02:00:01:00:00:05:06", "0200.0100.0005", "02:00:01:00:00:0g", 5]
)
def test_mac_bytes_rejects(bad) -> None:
    raises_exactly(ValueError, mac_bytes, bad)


def test_mac_str_rejects_wrong_length() -> None:
    raises_exactly(ValueError, mac_str, b"\x02\x00")


@pytest.mark.parametrize(
    "fn,args",
    [
        (worker_mac, (0, 1)),
        (worker_mac, (0xFFFF, 1)),
        (worker_mac, (1, 0)),
        (worker_mac, (1, 0xFFFF)),
        (worker_mac, (1, -1)),
        (worker_mac, (True, 1)),
        (worker_mac, (1, 2.0)),
        (controller_mac, (0,)),
        (lb_mac, (1, 256, 0)),
        (lb_mac, (1, 0, 256)),
        (lb_mac, (1, -1, 0)),
        (multicast_mac, (1, 0x10000)),
        (multicast_mac, (1, -1)),
    ],
)
def test_address_arguments_out_of_range(fn, args) -> None:
    raises_exactly(ValueError, fn, *args)


@pytest.mark.parametrize(
    "mac",
    [
        bytes.fromhex("000001000005"),  # not locally administered
        bytes.fromhex("ffffffffffff"),  # broadcast
        bytes.fromhex("020000000005"),  # app 0
        bytes.fromhex("02ffff000005"),  # app 0xFFFF
        bytes.fromhex("020001040005"),  # unknown class
        bytes.fromhex("020001000000"),  # worker 0
        bytes.fromhex("02000100ffff"),  # worker 0xFFFF
        bytes.fromhex("020001010001"),  # controller with a value
        bytes.fromhex("030001000005"),  # multicast bit on a worker
        bytes.fromhex("020001030005"),  # multicast class without the bit
        b"\x02\x00\x01\x00\x00",
        b"",
        "02:00:01:00:00:05",
    ],
)
def test_parse_mac_rejects(mac) -> None:
    raises_exactly(WireError, parse_mac, mac)


@given(st.binary(min_size=0, max_size=8))
def test_parse_mac_garbage(mac: bytes) -> None:
    addr = decodes_or_wire_error(parse_mac, mac)
    if addr is not None:
        rebuilt = {
            AddrClass.WORKER: lambda: worker_mac(addr.app_id, addr.value),
            AddrClass.CONTROLLER: lambda: controller_mac(addr.app_id),
            AddrClass.LOAD_BALANCER: lambda: lb_mac(addr.app_id, addr.value >> 8, addr.value & 255),
            AddrClass.MULTICAST: lambda: multicast_mac(addr.app_id, addr.value),
        }[addr.cls]()
        assert rebuilt == mac


# ------------------------------------------------------------------ tuples

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5) | st.integers(-5, 5), inner, max_size=4)
    ),
    max_leaves=12,
)


def normalized(v):
    """What msgpack gives back: tuples become lists."""
    if isinstance(v, (list, tuple)):
        return [normalized(x) for x in v]
    if isinstance(v, dict):
        return {k: normalized(x) for k, x in v.items()}
    return v


@given(st.lists(values, max_size=8) | st.tuples(values, values))
def test_tuple_roundtrip(tup) -> None:
    assert decode_tuple(encode_tuple(tup)) == normalized(tup)


def test_tuple_with_timestamp_like_bytes_is_fine() -> None:
    tup = [b"\xd6\xff\x00\x00\x00\x01", "x\xff", b"\xc7\x0c\xff"]
    assert decode_tuple(encode_tuple(tup)) == tup


@pytest.mark.parametrize("bad", [5, "ab", {"a": 1}, None, b"xx"])
def test_encode_tuple_rejects_non_sequences(bad) -> None:
    raises_exactly(TypeError, encode_tuple, bad)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        msgpack.packb(5),
        msgpack.packb({"a": 1}),
        msgpack.packb("text"),
        msgpack.packb([1, msgpack.ExtType(5, b"xyz")]),
        msgpack.packb(msgpack.ExtType(1, b"")),
        msgpack.packb([1, {"t": msgpack.Timestamp(1, 5)}]),
        msgpack.packb([msgpack.Timestamp(2**40, 0)]),
        b"\x91\xa1\xff",  # invalid UTF-8
        b"\x91\x81\x91\x01\x02",  # list as a map key
        b"\x92\x01",  # truncated
        msgpack.packb([1]) + b"\x01",  # trailing data
        b"\x91" * 100_000 + b"\x01",  # nesting too deep
        b"\xc1",  # reserved byte
        b"\xdd\xff\xff\xff\xff",  # array claiming 4G items
    ],
)
def test_decode_tuple_rejects(data: bytes) -> None:
    raises_exactly(WireError, decode_tuple, data)


@given(st.binary(max_size=64))
def test_decode_tuple_garbage(data: bytes) -> None:
    result = decodes_or_wire_error(decode_tuple, data)
    assert result is None or isinstance(result, list)


rows_strategy = st.lists(
    st.lists(st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8) | st.binary(max_size=8)),
    max_size=30,
)


@given(rows_strategy)
def test_row_batch_roundtrip(rows: list[list]) -> None:
    data = encode_rows(rows)
    assert data == msgpack.packb(rows, use_bin_type=True)  # one msgpack array of arrays
    assert decode_rows(data) == rows


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb([[1], 2]),  # a row that is not an array
        msgpack.packb([[1], {"a": 1}]),
        msgpack.packb({"a": [1]}),  # not an array of rows
        msgpack.packb([[msgpack.Timestamp(1, 0)]]),
        msgpack.packb([[1]]) + b"\x01",
    ],
)
def test_decode_rows_rejects(data: bytes) -> None:
    raises_exactly(WireError, decode_rows, data)


def test_entry_capacity_is_what_travels_unsegmented() -> None:
    for mtu in (MIN_MTU, 1500, DEFAULT_MTU, 65535):
        cap = entry_capacity(mtu)
        frames = pack_frames(DST, SRC, Kind.DATA, 1, 0, [b"x" * cap], mtu)
        assert len(frames) == 1 and not decode_frame(frames[0], mtu=mtu).flags & SEG
        if cap < 0xFFFF:
            assert len(pack_frames(DST, SRC, Kind.DATA, 1, 0, [b"x" * (cap + 1)], mtu)) == 2


# ------------------------------------------------------------------ frames

macs = st.builds(worker_mac, app_ids, worker_ids) | st.builds(multicast_mac, app_ids, u16)
small_payloads = st.lists(st.binary(max_size=300), max_size=20)


@given(macs, macs, st.sampled_from(Kind), u16, u32, small_payloads)
def test_frame_roundtrip(dst, src, kind, stream, seq, payloads) -> None:
    f = Frame(dst, src, kind, stream, seq, 0, payloads)
    buf = encode_frame(f)
    assert len(buf) == ETH_HLEN + HEADER_LEN + sum(2 + len(p) for p in payloads)
    assert decode_frame(buf) == f


def test_frame_layout_is_documented_layout() -> None:
    f = Frame(DST, SRC, Kind.CONTROL, 0x0102, 0x03040506, 0, [b"ab", b""])
    assert encode_frame(f) == (
        DST + SRC + b"\x88\xb5" + b"\x02\x01\x00\x00" + b"\x01\x02" + b"\x03\x04\x05\x06"
        b"\x00\x02" + b"\x00\x02ab" + b"\x00\x00"
    )
    seg = Frame(DST, SRC, Kind.DATA, 1, 9, SEG | SEG_FIRST, [b"xyz"], total=10)
    assert encode_frame(seg)[ETH_HLEN + HEADER_LEN :] == b"\x00\x00\x00\x0a\x00\x03xyz"


def test_custom_ethertype() -> None:
    frames = pack_frames(DST, SRC, Kind.DATA, 1, 0, [b"abc"], ethertype=0xFFFF)
    assert frames[0][12:14] == b"\xff\xff"
    assert decode_frame(frames[0], ethertype=0xFFFF).payloads == [b"abc"]
    raises_exactly(WireError, decode_frame, frames[0])


def test_decode_frame_accepts_buffers() -> None:
    buf = pack_frames(DST, SRC, Kind.DATA, 1, 0, [b"abc", b"de"])[0]
    for b in (bytearray(buf), memoryview(buf)):
        f = decode_frame(b)
        assert f.payloads == [b"abc", b"de"] and all(type(p) is bytes for p in f.payloads)


payload_sizes = st.integers(0, 150) | st.integers(150, 3000) | st.integers(3000, 70_000)
big_mix = st.lists(st.builds(payload, payload_sizes, st.integers(0, 2**32)), max_size=12)
mtus = st.integers(200, 9000) | st.sampled_from([MIN_MTU, 64, 1500, 9000, 70_000])


def check_frames(frames: list[bytes], first_seq: int, mtu: int) -> list[Frame]:
    decoded = []
    for i, buf in enumerate(frames):
        assert len(buf) <= ETH_HLEN + mtu
        f = decode_frame(buf, mtu=mtu)
        assert f.seq == (first_seq + i) % 2**32
        decoded.append(f)
    return decoded


@SLOW
@given(big_mix, mtus, u32, st.sampled_from(Kind), u16)
def test_pack_reassemble_roundtrip(payloads, mtu, first_seq, kind, stream) -> None:
    frames = pack_frames(DST, SRC, kind, stream, first_seq, payloads, mtu=mtu)
    r = Reassembler()
    out = []
    for f in check_frames(frames, first_seq, mtu):
        assert f.kind == kind and f.stream == stream and (f.dst, f.src) == (DST, SRC)
        out.extend(r.feed(f))
    assert out == payloads
    assert r.pending() == 0 and r.discarded == 0


@SLOW
@given(st.lists(st.binary(max_size=400), min_size=1, max_size=300), st.integers(200, 9000))
def test_batching_is_greedy_and_within_mtu(payloads, mtu) -> None:
    frames = pack_frames(DST, SRC, Kind.DATA, 1, 0, payloads, mtu=mtu)
    decoded = check_frames(frames, 0, mtu)
    assert [p for f in decoded for p in f.payloads] == payloads  # all fit unsegmented
    for buf, nxt in zip(frames, decoded[1:], strict=False):
        # the next frame's first payload would not have fitted into this one
        assert len(buf) + 2 + len(nxt.payloads[0]) > ETH_HLEN + mtu


def test_batching_many_small_tuples() -> None:
    payloads = [bytes([i % 256]) * 100 for i in range(1000)]
    frames = pack_frames(DST, SRC, Kind.DATA, 1, 0, payloads)
    per_frame = (DEFAULT_MTU - HEADER_LEN) // 102
    assert per_frame == 88
    assert len(frames) == math.ceil(1000 / per_frame)
    assert [len(decode_frame(f).payloads) for f in frames[:-1]] == [per_frame] * (len(frames) - 1)


def test_pack_sequence_wraps() -> None:
    payloads = [b"x" * 100] * 5
    frames = pack_frames(DST, SRC, Kind.DATA, 1, 2**32 - 2, payloads, mtu=120)
    assert [decode_frame(f).seq for f in frames] == [2**32 - 2, 2**32 - 1, 0, 1, 2]
    # callers may keep adding without masking
    nxt = pack_frames(DST, SRC, Kind.DATA, 1, 2**32 - 2 + len(frames), payloads[:1])
    assert decode_frame(nxt[0]).seq == 3


def test_pack_edge_cases() -> None:
    assert pack_frames(DST, SRC, Kind.DATA, 1, 0, []) == []
    frames = pack_frames(DST, SRC, 1, 1, 0, [b"", b""])  # plain int kind is accepted
    f = decode_frame(frames[0])
    assert f.payloads == [b"", b""] and f.kind is Kind.CONTROL
    # exactly fills the frame, then one byte more needs a second frame
    exact = b"y" * (DEFAULT_MTU - HEADER_LEN - 2)
    assert len(pack_frames(DST, SRC, Kind.DATA, 1, 0, [exact])) == 1
    assert len(pack_frames(DST, SRC, Kind.DATA, 1, 0, [exact + b"y"])) == 2
    cap = DEFAULT_MTU - HEADER_LEN
    for extra, n_frames in ((0, 1), (1, 2), (2, 2)):
        pair = [b"a" * 1000, b"b" * (cap - 1004 + extra)]
        frames = pack_frames(DST, SRC, Kind.DATA, 1, 0, pair)
        assert len(frames) == n_frames and all(len(f) <= ETH_HLEN + DEFAULT_MTU for f in frames)
    # a payload longer than the u16 length prefix is segmented even with a huge mtu
    segs = pack_frames(DST, SRC, Kind.DATA, 1, 0, [b"z" * 70_000], mtu=200_000)
    assert len(segs) == 2 and decode_frame(segs[0], mtu=200_000).flags == SEG | SEG_FIRST


def test_segment_frames_fill_the_mtu() -> None:
    data = payload(20_000, 1)
    frames = pack_frames(DST, SRC, Kind.DATA, 1, 0, [b"a", data, b"b"], mtu=1500)
    flags = [decode_frame(f, mtu=1500).flags for f in frames]
    assert flags[0] == 0 and flags[-1] == 0
    assert flags[1] == SEG | SEG_FIRST and flags[-2] == SEG | SEG_LAST
    assert set(flags[2:-2]) == {SEG}
    assert all(len(f) == ETH_HLEN + 1500 for f in frames[1:-2])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mtu": MIN_MTU - 1},
        {"dst": b"\x02\x00"},
        {"src": b""},
        {"stream": 0x10000},
        {"stream": -1},
        {"kind": 3},
        {"ethertype": 0x10000},
    ],
)
def test_pack_frames_rejects_bad_arguments(kwargs) -> None:
    args = {"dst": DST, "src": SRC, "kind": Kind.DATA, "stream": 1, "first_seq": 0}
    args.update(kwargs)
    raises_exactly(ValueError, pack_frames, payloads=[b"x"], **args)


@pytest.mark.parametrize(
    "frame",
    [
        Frame(DST, SRC, Kind.DATA, 1, 0, SEG | SEG_FIRST, [b"abc"]),  # total missing
        Frame(DST, SRC, Kind.DATA, 1, 0, SEG | SEG_FIRST | SEG_LAST, [b"abc"], total=4),
        Frame(DST, SRC, Kind.DATA, 1, 0, SEG, [b"a", b"b"]),
        Frame(DST, SRC, Kind.DATA, 1, 0, SEG_LAST, [b"a"]),
        Frame(DST, SRC, Kind.DATA, 1, 0, 0x20, [b"a"]),
        Frame(DST, SRC, Kind.DATA, 1, 2**32, 0, [b"a"]),
        Frame(DST, SRC, Kind.DATA, 0x10000, 0, 0, [b"a"]),
        Frame(DST, SRC, 7, 1, 0, 0, [b"a"]),
        Frame(DST, SRC, Kind.DATA, 1, 0, 0, [b"a" * 0x10000]),
        Frame(DST[:5], SRC, Kind.DATA, 1, 0, 0, [b"a"]),
    ],
)
def test_encode_frame_rejects(frame: Frame) -> None:
    raises_exactly(ValueError, encode_frame, frame)


GOOD = encode_frame(Frame(DST, SRC, Kind.DATA, 3, 77, 0, [b"hello", b"", b"world!"]))
FIRST = encode_frame(Frame(DST, SRC, Kind.DATA, 3, 77, SEG | SEG_FIRST, [b"hel"], total=10))


def patched(buf: bytes, offset: int, fmt: str, value: int) -> bytes:
    b = bytearray(buf)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


@pytest.mark.parametrize(
    "buf",
    [
        patched(GOOD, 12, "!H", 0x0800),  # wrong ethertype
        patched(GOOD, 14, "!B", 1),  # wrong version (1: one tuple per entry)
        patched(GOOD, 14, "!B", 0),
        patched(GOOD, 15, "!B", 3),  # unknown kind
        patched(GOOD, 17, "!B", 1),  # reserved byte set
        patched(GOOD, 16, "!B", 0x20),  # unknown flag
        patched(FIRST, 16, "!B", SEG | SEG_FIRST | 0x80),
        patched(GOOD, 16, "!B", SEG_FIRST),  # segment flags without SEG
        patched(GOOD, 16, "!B", SEG_LAST),
        patched(GOOD, 16, "!B", SEG),  # segment with count 3
        patched(GOOD, 24, "!H", 4),  # count larger than the entries
        patched(GOOD, 24, "!H", 2),  # count smaller: trailing bytes
        patched(GOOD, 24, "!H", 0),
        patched(GOOD, 26, "!H", 0xFFFF),  # length prefix past end
        patched(GOOD, len(GOOD) - 8, "!H", 7),  # last length one too long
        GOOD + b"\x00",  # trailing garbage
        GOOD + b"junk",
        patched(FIRST, 26, "!I", 2),  # total shorter than the first chunk
        patched(FIRST, 16, "!B", SEG | SEG_FIRST | SEG_LAST),  # single segment, total != chunk
        FIRST[:28],  # total cut short
        b"",
        GOOD[:25],
    ],
)
def test_decode_frame_rejects(buf: bytes) -> None:
    raises_exactly(WireError, decode_frame, buf)


def test_decode_frame_rejects_every_truncation() -> None:
    for buf in (GOOD, FIRST, *pack_frames(DST, SRC, Kind.DATA, 1, 0, [payload(5000, 3)], mtu=900)):
        for n in range(len(buf)):
            raises_exactly(WireError, decode_frame, buf[:n])


def test_decode_frame_rejects_oversize() -> None:
    big = pack_frames(DST, SRC, Kind.DATA, 1, 0, [b"x" * 1000] * 8)[0]
    assert decode_frame(big).payloads == [b"x" * 1000] * 8
    raises_exactly(WireError, decode_frame, big, mtu=len(big) - ETH_HLEN - 1)
    raises_exactly(WireError, decode_frame, big + bytes(DEFAULT_MTU))


def test_minimum_size_padding_is_accepted() -> None:
    short = encode_frame(Frame(DST, SRC, Kind.CREDIT, 0, 5, 0, [encode_credit(3)]))
    assert len(short) < wire.ETH_ZLEN
    padded = short + bytes(wire.ETH_ZLEN - len(short))
    assert decode_frame(padded) == decode_frame(short)
    raises_exactly(WireError, decode_frame, padded[:-1] + b"\x01")  # not padding: garbage
    raises_exactly(WireError, decode_frame, padded + b"\x00")  # longer than minimum size


@given(st.binary(max_size=200))
def test_decode_frame_garbage(data: bytes) -> None:
    decodes_or_wire_error(decode_frame, data)


@given(st.sampled_from([GOOD, FIRST]), st.integers(14, 30), st.binary(max_size=60))
def test_decode_frame_garbage_after_valid_prefix(base: bytes, cut: int, tail: bytes) -> None:
    decodes_or_wire_error(decode_frame, base[:cut] + tail)


@given(st.binary(min_size=len(GOOD), max_size=len(GOOD)))
def test_decode_frame_bitflips(mask: bytes) -> None:
    decodes_or_wire_error(decode_frame, bytes(a ^ b for a, b in zip(GOOD, mask, strict=True)))


# ------------------------------------------------------------------ reassembly


def segmented(size: int, seed: int = 0, mtu: int = 300, first_seq: int = 0, src: bytes = SRC):
    data = payload(size, seed)
    frames = [decode_frame(f, mtu=mtu) for f in pack_frames(DST, src, 0, 1, first_seq, [data], mtu)]
    assert len(frames) > 2
    return data, frames


def feed_all(r: Reassembler, frames: list[Frame]) -> list[bytes]:
    return [p for f in frames for p in r.feed(f)]


def test_reassembler_missing_middle_segment() -> None:
    data, frames = segmented(2000)
    r = Reassembler()
    assert feed_all(r, frames[:2]) == []
    raises_exactly(WireError, r.feed, frames[3])
    assert r.pending() == 0  # partial discarded
    raises_exactly(WireError, r.feed, frames[4])  # no partial any more
    # the link recovers with the next payload
    data2, frames2 = segmented(1000, seed=1, first_seq=frames[-1].seq + 1)
    assert feed_all(r, frames2) == [data2]


def test_reassembler_out_of_order() -> None:
    _, frames = segmented(2000)
    r = Reassembler()
    r.feed(frames[0])
    raises_exactly(WireError, r.feed, frames[2])
    raises_exactly(WireError, r.feed, frames[1])


def test_reassembler_segment_without_first() -> None:
    _, frames = segmented(2000)
    raises_exactly(WireError, Reassembler().feed, frames[1])
    raises_exactly(WireError, Reassembler().feed, frames[-1])


def test_reassembler_oversize() -> None:
    data, frames = segmented(2000)
    r = Reassembler(max_size=1999)
    raises_exactly(WireError, r.feed, frames[0])
    assert r.pending() == 0
    raises_exactly(WireError, r.feed, frames[1])
    assert feed_all(Reassembler(max_size=2000), frames) == [data]


def test_reassembler_total_mismatch() -> None:
    first = Frame(DST, SRC, Kind.DATA, 1, 0, SEG | SEG_FIRST, [b"abcd"], total=10)
    short_last = Frame(DST, SRC, Kind.DATA, 1, 1, SEG | SEG_LAST, [b"efg"])
    r = Reassembler()
    r.feed(first)
    raises_exactly(WireError, r.feed, short_last)
    long_mid = Frame(DST, SRC, Kind.DATA, 1, 1, SEG, [b"efghijk"])
    r.feed(first)
    raises_exactly(WireError, r.feed, long_mid)
    assert r.pending() == 0


def test_reassembler_single_segment_payload() -> None:
    only = Frame(DST, SRC, Kind.DATA, 1, 0, SEG | SEG_FIRST | SEG_LAST, [b"abc"], total=3)
    assert decode_frame(encode_frame(only)) == only
    assert Reassembler().feed(only) == [b"abc"]


def test_reassembler_interrupted_by_new_payload() -> None:
    data, frames = segmented(2000)
    r = Reassembler()
    feed_all(r, frames[:2])
    plain = decode_frame(pack_frames(DST, SRC, 0, 1, frames[2].seq, [b"tuple"])[0])
    assert r.feed(plain) == [b"tuple"]  # intact frame is still delivered
    assert r.discarded == 1 and r.pending() == 0
    feed_all(r, frames[:2])
    assert feed_all(r, frames) == [data]  # a new first segment restarts
    assert r.discarded == 2


def test_reassembler_links_are_independent() -> None:
    other = worker_mac(7, 9)
    d1, f1 = segmented(3000, seed=1)
    d2, f2 = segmented(2500, seed=2, src=other)
    interleaved = [f for pair in zip(f1, f2, strict=False) for f in pair]
    interleaved += f1[len(f2) :] + f2[len(f1) :]
    r = Reassembler()
    assert sorted(feed_all(r, interleaved)) == sorted([d1, d2])


@SLOW
@given(st.data())
def test_reassembler_never_delivers_corrupt_payloads(data) -> None:
    payloads = data.draw(big_mix)
    frames = [decode_frame(f, mtu=700) for f in pack_frames(DST, SRC, 0, 1, 0, payloads, 700)]
    assume(frames)
    # lose, duplicate and reorder frames
    ops = data.draw(st.lists(st.integers(0, len(frames) - 1), max_size=6))
    mangled = list(frames)
    for i in ops:
        j = min(i, len(mangled) - 1)
        kind = data.draw(st.sampled_from(["drop", "dup", "swap"]))
        if kind == "drop" and len(mangled) > 1:
            del mangled[j]
        elif kind == "dup":
            mangled.insert(j, mangled[j])
        elif kind == "swap" and j + 1 < len(mangled):
            mangled[j], mangled[j + 1] = mangled[j + 1], mangled[j]
    r = Reassembler()
    for f in mangled:
        try:
            out = r.feed(f)
        except WireError as e:
            assert type(e) is WireError
            continue
        for p in out:
            assert p in payloads


# ------------------------------------------------------------------ control tuples

worker_lists = st.lists(worker_ids, max_size=5)
u64 = st.integers(0, 2**64 - 1)
nonneg = st.floats(0, 1e9) | st.integers(0, 10**6)
metric_values = st.recursive(
    st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
routing = st.fixed_dictionaries(
    {
        "stream": u16,
        "policy": st.sampled_from(sorted(wire.POLICIES)),
        "next_hops": worker_lists,
        "version": u64,
    },
    optional={
        "fields": st.lists(u16, max_size=3),
        "table": st.dictionaries(st.text(max_size=6), worker_ids, max_size=4),
        "local": worker_lists,
        "lb_node": st.integers(0, 255),
        "release": worker_lists,
        "groups": worker_lists,
        "handoff": u64,
    },
)
bodies = {
    Control.ROUTING: routing,
    Control.SIGNAL: st.fixed_dictionaries({"version": u64}),
    Control.METRIC_REQ: st.fixed_dictionaries({"request_id": u64}),
    Control.METRIC_RESP: st.fixed_dictionaries(
        {
            "request_id": u64,
            "worker": worker_ids,
            "metrics": st.dictionaries(st.text(max_size=8), metric_values, max_size=4),
        }
    ),
    Control.INPUT_RATE: st.fixed_dictionaries({"rate": nonneg}),
    Control.ACTIVATE: st.just({}),
    Control.DEACTIVATE: st.just({}),
    Control.BATCH_SIZE: st.fixed_dictionaries(
        {"size": st.integers(1, 2**32 - 1), "max_delay_ms": nonneg}
    ),
    Control.DRAIN: st.fixed_dictionaries({"version": u64}),
    Control.UPSTREAM: st.fixed_dictionaries(
        {"add": worker_lists, "remove": worker_lists, "version": u64, "reopen": st.booleans()}
    ),
    Control.FLOW_CONTROL: st.fixed_dictionaries({"budget": st.integers(0, 2**32 - 1)}),
    Control.ROLLBACK: st.fixed_dictionaries(
        {"generation": st.integers(1, 2**32 - 1), "epoch": st.integers(-1, 2**62)}
    ),
    Control.COMPLETE: st.just({}),
    Control.KEYGROUPS: st.fixed_dictionaries(
        {
            "version": u64,
            "migration": u64,
            "phase": st.sampled_from(["prepare", "finish"]),
            "out": st.dictionaries(st.integers(0, 127).map(str), worker_ids, max_size=4),
            "in": st.dictionaries(st.integers(0, 127).map(str), worker_ids, max_size=4),
            "expect": st.lists(st.lists(st.integers(0, 65535), min_size=2, max_size=2)),
            "keys_out": st.dictionaries(st.text(max_size=6), worker_ids, max_size=3),
            "keys_in": st.dictionaries(st.text(max_size=6), worker_ids, max_size=3),
        }
    ),
    Control.CHAIN: st.fixed_dictionaries(
        {"version": u64, "receiver": worker_ids, "chained": st.booleans()}
    ),
    Control.SWAP: st.fixed_dictionaries(
        {
            "version": u64,
            "operator": st.text(min_size=1, max_size=20),
            "args": st.dictionaries(
                st.text(max_size=6),
                st.none()
                | st.booleans()
                | st.integers(-(2**63), 2**64 - 1)
                | st.text()
                | st.lists(st.integers(0, 9), max_size=3),
                max_size=3,
            ),
        }
    ),
}
ROUTING_DEFAULTS = {"fields": [], "table": {}, "local": [], "lb_node": 0, "groups": []}


@pytest.mark.parametrize("ctype", list(Control))
@given(data=st.data())
def test_control_roundtrip(ctype: Control, data) -> None:
    body = data.draw(bodies[ctype])
    got = decode_control(encode_control(ControlTuple(ctype, body)))
    expected = {**ROUTING_DEFAULTS, **body} if ctype == Control.ROUTING else body
    assert got == ControlTuple(ctype, expected)
    assert got.type is ctype and set(got.body) == set(expected)
    # a control tuple also travels inside a frame
    frame = decode_frame(pack_frames(DST, SRC, Kind.CONTROL, 0, 0, [encode_control(got)])[0])
    assert decode_control(frame.payloads[0]) == got


def test_control_defaults_and_float_normalisation() -> None:
    ct = decode_control(
        encode_control(
            ControlTuple(
                Control.ROUTING, {"stream": 1, "policy": "shuffle", "next_hops": [2], "version": 1}
            )
        )
    )
    assert ct.body == {
        "stream": 1,
        "policy": "shuffle",
        "next_hops": [2],
        "version": 1,
        **ROUTING_DEFAULTS,
    }
    rate = decode_control(encode_control(ControlTuple(Control.INPUT_RATE, {"rate": 0})))
    assert rate.body == {"rate": 0.0} and type(rate.body["rate"]) is float


ROUTE = {"stream": 1, "policy": "fields", "next_hops": [1, 2], "version": 3}
BAD_BODIES = [
    (Control.ROUTING, {**ROUTE, "extra": 1}),
    (Control.ROUTING, {k: v for k, v in ROUTE.items() if k != "policy"}),
    (Control.ROUTING, {**ROUTE, "policy": "random"}),
    (Control.ROUTING, {**ROUTE, "policy": 1}),
    (Control.ROUTING, {**ROUTE, "next_hops": [0]}),
    (Control.ROUTING, {**ROUTE, "next_hops": [0xFFFF]}),
    (Control.ROUTING, {**ROUTE, "next_hops": [True]}),
    (Control.ROUTING, {**ROUTE, "next_hops": 5}),
    (Control.ROUTING, {**ROUTE, "next_hops": ["1"]}),
    (Control.ROUTING, {**ROUTE, "stream": 0x10000}),
    (Control.ROUTING, {**ROUTE, "version": -1}),
    (Control.ROUTING, {**ROUTE, "version": 1.0}),
    (Control.ROUTING, {**ROUTE, "fields": [-1]}),
    (Control.ROUTING, {**ROUTE, "table": {"k": 0}}),
    (Control.ROUTING, {**ROUTE, "table": {1: 2}}),
    (Control.ROUTING, {**ROUTE, "table": [1]}),
    (Control.ROUTING, {**ROUTE, "local": [None]}),
    (Control.ROUTING, {**ROUTE, "lb_node": 256}),
    (Control.ROUTING, [1, 2]),
    (Control.SIGNAL, {}),
    (Control.SIGNAL, {"version": "1"}),
    (Control.SIGNAL, {"version": 1, "x": 2}),
    (Control.METRIC_REQ, {"request_id": None}),
    (Control.METRIC_RESP, {"request_id": 1, "worker": 0, "metrics": {}}),
    (Control.METRIC_RESP, {"request_id": 1, "worker": 1, "metrics": {1: 2}}),
    (Control.METRIC_RESP, {"request_id": 1, "worker": 1, "metrics": {"a": [1]}}),
    (Control.METRIC_RESP, {"request_id": 1, "worker": 1, "metrics": {"a": {"b": None}}}),
    (Control.METRIC_RESP, {"request_id": 1, "worker": 1, "metrics": {"a": True}}),
    (Control.METRIC_RESP, {"request_id": 1, "worker": 1}),
    (Control.INPUT_RATE, {"rate": -1.0}),
    (Control.INPUT_RATE, {"rate": float("nan")}),
    (Control.INPUT_RATE, {"rate": float("inf")}),
    (Control.INPUT_RATE, {"rate": "fast"}),
    (Control.INPUT_RATE, {"rate": False}),
    (Control.ACTIVATE, {"now": True}),
    (Control.DEACTIVATE, None),
    (Control.BATCH_SIZE, {"size": 0, "max_delay_ms": 1.0}),
    (Control.BATCH_SIZE, {"size": 10, "max_delay_ms": -0.5}),
    (Control.BATCH_SIZE, {"size": 10}),
    (Control.DRAIN, {"version": 2**64}),
    (Control.FLOW_CONTROL, {}),
    (Control.FLOW_CONTROL, {"budget": -1}),
    (Control.FLOW_CONTROL, {"budget": 2**32}),
    (Control.FLOW_CONTROL, {"budget": 1.5}),
    (Control.SWAP, {"version": 1, "operator": ""}),
    (Control.SWAP, {"version": 1}),
    (Control.SWAP, {"version": 1, "operator": "busy", "args": [1]}),
    (Control.SWAP, {"version": 1, "operator": "busy", "args": {"a": {1: 2}}}),
    (Control.SWAP, {"version": 1, "operator": "busy", "args": {"a": [[[[[[[[[[1]]]]]]]]]]}}),
]


@pytest.mark.parametrize("ctype,body", BAD_BODIES)
def test_encode_control_rejects_invalid_bodies(ctype, body) -> None:
    raises_exactly(ValueError, encode_control, ControlTuple(ctype, body))


def _packable(value) -> bool:
    try:
        msgpack.packb(value)
    except (OverflowError, TypeError):
        return False
    return True


@pytest.mark.parametrize(
    "ctype,body",
    [(t, b) for t, b in BAD_BODIES if _packable(b)],  # 2**64 cannot be sent
)
def test_decode_control_rejects_invalid_bodies(ctype, body) -> None:
    raw = msgpack.packb([int(ctype), body], use_bin_type=True)
    raises_exactly(WireError, decode_control, raw)


def test_encode_control_rejects_unknown_type() -> None:
    raises_exactly(ValueError, encode_control, ControlTuple(42, {}))


@pytest.mark.parametrize(
    "value",
    [
        5,
        [],
        [1],
        [6, {}, 1],
        [0, {}],
        [10, {}],
        [True, {"stream": 1}],  # bools are not type codes
        [2.0, {"version": 1}],
        ["SIGNAL", {"version": 1}],
        [2, [("version", 1)]],
        [2, None],
        {"type": 2, "body": {"version": 1}},
    ],
)
def test_decode_control_rejects_bad_shapes(value) -> None:
    raises_exactly(WireError, decode_control, msgpack.packb(value))


def test_decode_control_rejects_ext_types() -> None:
    raw = msgpack.packb([2, {"version": msgpack.ExtType(3, b"x")}])
    raises_exactly(WireError, decode_control, raw)


@given(st.binary(max_size=80))
def test_decode_control_garbage(data: bytes) -> None:
    result = decodes_or_wire_error(decode_control, data)
    assert result is None or isinstance(result, ControlTuple)


@given(st.integers(0, 12), st.dictionaries(st.text(max_size=12), values, max_size=5))
def test_decode_control_random_bodies(ctype: int, body: dict) -> None:
    result = decodes_or_wire_error(decode_control, msgpack.packb([ctype, body]))
    if result is not None:  # only schema-valid bodies pass, e.g. ACTIVATE {}
        assert decode_control(encode_control(result)) == result


# ------------------------------------------------------------------ credits


@given(u32)
def test_credit_roundtrip(n: int) -> None:
    assert decode_credit(encode_credit(n)) == n
    assert len(encode_credit(n)) == 4


@pytest.mark.parametrize("bad", [-1, 2**32, 1.0, True])
def test_encode_credit_rejects(bad) -> None:
    raises_exactly(ValueError, encode_credit, bad)


@pytest.mark.parametrize("data", [b"", b"\x00" * 3, b"\x00" * 5])
def test_decode_credit_rejects(data: bytes) -> None:
    raises_exactly(WireError, decode_credit, data)


def test_with_flags_sets_ack_req_on_a_copy() -> None:
    frame = pack_frames(DST, SRC, Kind.DATA, 3, 9, [b"a", b"bc"])[0]
    marked = wire.with_flags(frame, wire.ACK_REQ)
    f = decode_frame(marked)
    assert f.flags == wire.ACK_REQ and f.payloads == [b"a", b"bc"] and f.seq == 9
    assert decode_frame(frame).flags == 0  # the original is untouched
    seg = pack_frames(DST, SRC, Kind.DATA, 3, 0, [b"x" * 20000])[1]
    assert decode_frame(wire.with_flags(seg, wire.ACK_REQ)).flags == SEG | wire.ACK_REQ
    with pytest.raises(ValueError):
        wire.with_flags(frame, SEG)
