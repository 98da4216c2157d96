"""Hostile bytes against every decoder a worker, the debug worker and the controller run
on what they receive: the seed corpus of crafted frames (tests/unit/wire_corpus.py),
nested values built by hypothesis, and mutations of valid encodings.

Each decoder either returns plain values (no msgpack extension type, at most
``MAX_DEPTH`` deep) or fails with exactly WireError (the wire functions) or a
counted drop (the receivers); nothing else may escape, RecursionError least of all.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from socketport import Port
from wire_corpus import APP, CORPUS, DST, SRC, TS32, control_frame, data_frame, reply_frame

from controller.control_channel import ControlChannel
from typhoon import wire
from typhoon.debug.records import MirrorDecoder
from typhoon.operators.base import Bolt
from typhoon.runtime.checkpoints import punctuation
from typhoon.runtime.framework import Framework
from typhoon.runtime.sdn import SdnTransport
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound, Transport
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import MAX_DEPTH, WireError
from typhoon.wire import rows as wire_rows

PAIR = """
name: pair
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: sink
    operator: sequence_check
streams:
  - {from: source, to: sink, grouping: shuffle}
"""

FILES = sorted(CORPUS.glob("*.bin"))
PLAIN = (type(None), bool, int, float, str, bytes, list, dict)


def depth(value) -> int:
    """Nesting depth of a decoded value (iterative: the values may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, list):
            stack += [(x, d + 1) for x in v if isinstance(x, (list, dict))]
        elif isinstance(v, dict):
            stack += [(x, d + 1) for x in v.values() if isinstance(x, (list, dict))]
    return deepest


def plain(value) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) not in PLAIN:
            return False
        if isinstance(v, list):
            stack += v
        elif isinstance(v, dict):
            stack += [*v.keys(), *v.values()]
    return True


def check_value(fn, data: bytes):
    """``fn(data)`` returns a plain value within MAX_DEPTH or raises exactly WireError."""
    try:
        value = fn(data)
    except WireError as e:
        assert type(e) is WireError
        return None
    except BaseException as e:  # anything else escaped the decoder
        raise AssertionError(f"{fn.__name__} raised {type(e).__name__}: {e}"[:300]) from None
    return value


def check_payload_decoders(data: bytes) -> None:
    for fn in (wire.decode_value, wire.decode_tuple, wire.decode_rows):
        value = check_value(fn, data)
        if value is not None:
            assert plain(value) and depth(value) <= MAX_DEPTH, fn.__name__
    ct = check_value(wire.decode_control, data)
    if ct is not None:
        assert plain(ct.body) and depth(ct.body) <= MAX_DEPTH
    value = check_value(wire.unpack_rows, data)
    if value is not None:
        rows, n = value
        assert n == sum(type(r) is list for r in rows)
        assert plain(rows) and depth(rows) <= MAX_DEPTH


class Quiet(Transport):
    def poll(self, timeout):
        return []

    def send(self, dst, stream, payloads):
        pass

    def reply(self, ct):
        pass


class Sink(Bolt):
    def process(self, values, emit):
        pass


@pytest.fixture(scope="module")
def sink() -> Framework:
    """The framework of a sink worker: its hot-path decoder of data entries."""
    topo = load_topology_text(PAIR)
    physical = schedule(topo, ["h1"], APP)
    wid = physical.of_node("sink")[0].worker_id
    return Framework(WorkerSpec(topo, physical, wid), Sink(), Quiet())


def check_framework(fw: Framework, data: bytes) -> None:
    kind, a, b = punctuation(data)  # stream 0: end of stream, anchors, marks
    assert kind in ("", "eos", "anchor", "mark") and type(a) is int and type(b) is int
    before = sum(fw.io.stats.drops.values())
    rows = fw._decode_entry(data)
    if rows is None:
        assert sum(fw.io.stats.drops.values()) > before  # a counted drop, never silent
        return
    assert all(type(r) is list for r in rows)
    assert plain(rows) and depth(rows) <= MAX_DEPTH


def check_frame_receivers(frame: bytes, fw: Framework) -> None:
    """The controller's packet-in path, the debug worker's decoder, a worker's sdn port."""
    ch = ControlChannel()
    replies = ch.receive(frame, {APP: "app"}.get)
    for r in replies:
        assert plain(r.metrics) and depth(r.metrics) <= MAX_DEPTH
    records = MirrorDecoder(APP, {SRC: ("source", 0), DST: ("sink", 0)}, {}).feed(frame, 0.0)
    for rec in records:
        assert plain(rec.get("values", []))
    inside, end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    t = SdnTransport(APP, DST, mtu=64000, device=Port(inside))
    try:
        end.send(frame)
        for item in t.poll(0.05):
            if isinstance(item, Inbound):
                for p in item.payloads:
                    check_framework(fw, p)
            else:
                assert plain(item.body) and depth(item.body) <= MAX_DEPTH
    finally:
        t.dev.close()
        end.close()


# ----- the seed corpus -------------------------------------------------------------------


def test_the_seed_corpus_is_there():
    assert len(FILES) >= 16, "run python tests/unit/wire_corpus.py"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_seed_corpus_every_decoder(path: Path, sink: Framework):
    frame = path.read_bytes()
    check_payload_decoders(frame)
    try:
        payloads = wire.decode_frame(frame, mtu=64000).payloads
    except WireError:
        payloads = []
    for p in payloads:
        check_payload_decoders(p)
        check_framework(sink, p)
    check_frame_receivers(frame, sink)


@pytest.mark.parametrize(
    "path",
    [p for p in FILES if "deep" in p.stem or "ext" in p.stem or "timestamp" in p.stem],
    ids=lambda p: p.stem,
)
def test_crafted_payloads_are_refused(path: Path, sink: Framework):
    """The issue's case and its relatives: too deep, or an extension type, is a WireError
    in every wire decoder and a counted drop on the worker's hot path."""
    (payload,) = wire.decode_frame(path.read_bytes(), mtu=64000).payloads
    for fn in (wire.decode_value, wire.decode_tuple, wire.decode_rows, wire.decode_control):
        with pytest.raises(WireError):
            fn(payload)
    drops = dict(sink.io.stats.drops)
    assert sink._decode_entry(payload) is None
    assert sum(sink.io.stats.drops.values()) == sum(drops.values()) + 1


def test_receivers_count_the_deep_control_tuples():
    """A METRIC_RESP 400 maps deep at the controller, the same as a control tuple at a
    worker: dropped and counted as malformed control."""
    deep = (CORPUS / "reply_deep_metrics_timestamp.bin").read_bytes()
    ch = ControlChannel()
    assert ch.receive(deep, {APP: "app"}.get) == []
    assert ch.drops == {"malformed_control": 1}
    inside, end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    t = SdnTransport(APP, DST, mtu=64000, device=Port(inside))
    try:
        end.send((CORPUS / "control_deep_metrics_timestamp.bin").read_bytes())
        assert t.poll(0.5) == []
        assert t.stats.drops == {"malformed_control": 1}
    finally:
        t.dev.close()
        end.close()


def nested_lists(d: int) -> list:
    value: list = [1]
    for _ in range(d - 1):
        value = [value]
    return value


def nested_maps(d: int) -> dict:
    value: dict = {"k": 1}
    for _ in range(d - 1):
        value = {"k": value, "x": [2]}
    return value


def test_depth_limit_is_exact():
    ok = b"\x91" * MAX_DEPTH + b"\x01"
    assert depth(wire.decode_value(ok)) == MAX_DEPTH
    assert depth(wire.decode_rows(ok)) == MAX_DEPTH
    with pytest.raises(WireError):
        wire.decode_value(b"\x91" + ok)
    with pytest.raises(WireError):
        wire.decode_rows(b"\x91" + ok)
    # the cheap bound of unpack_rows: many flat rows and one row just too deep
    many = b"\xdc" + struct.pack("!H", 300) + b"\x91\x01" * 299 + b"\x91" * MAX_DEPTH + b"\x01"
    with pytest.raises(WireError):
        wire.unpack_rows(many)
    # the exact walk (taken when the cheap bound does not settle it) at the boundary
    for make in (nested_lists, nested_maps):
        for d in (1, 2, MAX_DEPTH - 1, MAX_DEPTH):
            wire_rows._check_depth(make(d))
            with pytest.raises(WireError):
                wire_rows._check_depth(make(d), d - 1)
        with pytest.raises(WireError):
            wire_rows._check_depth(make(MAX_DEPTH + 1))
    rows, n = wire.unpack_rows(many[: -MAX_DEPTH - 1] + b"\x91" * (MAX_DEPTH - 1) + b"\x01")
    assert n == 300 and depth(rows) == MAX_DEPTH


def test_flat_rows_whose_bytes_look_like_headers_skip_the_walk_and_deep_ones_do_not(
    monkeypatch,
):
    # floats and ints whose bytes are in the container-header ranges: the bound fails
    rows = [[1, 0x9C9D9E9F + i, 0x9D9D9D9D9D9D9D9D + i / 1e9, b"\x9a" * 20] for i in range(200)]
    data = wire.encode_rows(rows)
    assert wire_rows._heads(data) - 199 > MAX_DEPTH
    walked: list[int] = []
    real = wire_rows._check_depth
    monkeypatch.setattr(wire_rows, "_check_depth", lambda v, *a: walked.append(1) or real(v, *a))
    assert wire.unpack_rows(data) == (rows, 200) and walked == []
    # the same bytes with one row nested too deep: not flat, walked, refused
    deep: list = [1]
    for _ in range(MAX_DEPTH):
        deep = [deep]
    with pytest.raises(WireError):
        wire.unpack_rows(wire.encode_rows([*rows, deep]))
    assert walked == [1]
    # a row holding a map among flat rows is walked too (and is fine)
    assert wire.unpack_rows(wire.encode_rows([*rows, [{"k": [1]}]]))[1] == 201
    assert walked == [1, 1]


# ----- nested values and mutated encodings (hypothesis) ----------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
VALUES = st.recursive(
    SCALARS,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids, max_size=3)
    ),
    max_leaves=30,
)
HEADS = st.sampled_from(
    [
        b"\x91",
        b"\x81\xa1k",
        b"\xdc\x00\x01",
        b"\xdd\x00\x00\x00\x01",
        b"\xde\x00\x01\xa1k",
        b"\x92\x01",
        b"\x82\xa1a\x01\xa1b",
    ]
)
LEAVES = st.sampled_from(
    [
        b"\x01",
        b"\xc0",
        TS32,
        b"\xd7\xff" + bytes(8),
        b"\xc7\x0c\xff" + bytes(12),
        b"\xd4\x05\x00",
        b"\xc7\x00\x05",
        b"\x91\x01",
        b"\xa3abc",
    ]
)


@st.composite
def deep_chains(draw) -> bytes:
    """A chain of up to 1200 containers (arrays, maps, 16/32-bit headers, with siblings)
    around one leaf: extension types, timestamps, plain values."""
    n = draw(st.integers(1, 1200))
    heads = draw(st.lists(HEADS, min_size=1, max_size=4))
    leaf = draw(LEAVES)
    return b"".join(heads[i % len(heads)] for i in range(n)) + leaf


@st.composite
def mutated(draw) -> bytes:
    """A valid encoding of a nested value (as a tuple or a row batch), then mutated:
    bytes flipped, a timestamp or deep chain spliced in, cut short."""
    value = draw(VALUES)
    data = bytearray(
        msgpack.packb(draw(st.sampled_from([[value], [[value], [1]]])), use_bin_type=True)
    )
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "splice", "cut", "deep"]))
        at = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            i = min(at, len(data) - 1)
            data[i] = draw(st.integers(0, 255))
        elif op == "splice":
            data[at:at] = draw(LEAVES)
        elif op == "cut":
            del data[at:]
        else:
            data[at:at] = draw(deep_chains())
    return bytes(data)


def every_decoder(data: bytes, fw: Framework) -> None:
    check_payload_decoders(data)
    check_framework(fw, data)
    for frame in (data_frame(data), control_frame(data), reply_frame(data)):
        check_frame_receivers(frame, fw)


HOSTILE = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@HOSTILE
@given(data=deep_chains())
def test_nested_chains_every_decoder(data: bytes, sink: Framework):
    every_decoder(data, sink)


@HOSTILE
@given(data=mutated())
def test_mutated_encodings_every_decoder(data: bytes, sink: Framework):
    every_decoder(data, sink)


@HOSTILE
@given(
    value=st.recursive(
        SCALARS.filter(lambda v: v == v),
        lambda kids: (
            st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids, max_size=3)
        ),
        max_leaves=30,
    )
)
def test_plain_nested_values_round_trip(value, sink: Framework):
    """What a worker may send comes back unchanged through every decoder."""
    data = wire.encode_rows([[value]])
    assert wire.decode_rows(data) == [[value]]
    assert wire.decode_tuple(wire.encode_tuple([value])) == [value]
    rows = sink._decode_entry(data)
    assert rows == [[value]]
