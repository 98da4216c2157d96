"""The tcp transport's frame size: a setting (``config: {tcp: {mtu: N}}``) that defaults to
the sdn workers' frame size, so that the tcp baseline is measured with the same frames,
and the receiver's bound on what it decodes: a 64 KB frame is taken whole, a frame over
the receiver's size is a counted drop (``malformed_frame``), never a crash.

Real loopback sockets; fake coordinators (tests/unit/test_tcp_peers_generation.py)."""

from __future__ import annotations

import time

import pytest
from test_tcp_peers_generation import APP, SECRET, Coordinator

from typhoon import wire
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.tcp import MAX_MTU, MIN_MTU, TcpTransport
from typhoon.runtime.transport import Inbound
from typhoon.runtime.worker import make_transport
from typhoon.topology import TopologyError, load_topology_text, schedule
from typhoon.topology.config import TCP_DEFAULTS, TcpConfig, TopologyConfig, config_schema
from typhoon.worker_specs import TCP_MTU, WORKER_MTU, tcp_mtu, worker_mtu

STREAM = 7
TEXT = (
    "name: t\nconfig: CONFIG\n"
    "spouts: [{id: s, operator: sequence_source}]\n"
    "bolts: [{id: k, operator: sequence_check}]\n"
    "streams: [{from: s, to: k, grouping: shuffle}]\n"
)


def test_tcp_frames_follow_the_sdn_default_unless_the_topology_asks() -> None:
    assert TCP_MTU == WORKER_MTU == worker_mtu({}, None) == tcp_mtu({}) == 64000
    assert tcp_mtu({"tcp": {"mtu": 9000}}) == 9000
    assert tcp_mtu({"tcp": None}) == tcp_mtu({"tcp": {}}) == TCP_MTU
    # sdn's own setting (or its fabric) says nothing about a tcp stream, and back
    assert tcp_mtu({"sdn": {"mtu": 1500}}) == TCP_MTU
    assert worker_mtu({"tcp": {"mtu": 9000}}, None) == WORKER_MTU
    assert TCP_DEFAULTS.mtu is None


def test_the_file_declares_tcp_mtu_within_what_a_tcp_worker_accepts() -> None:
    config = TopologyConfig.of(
        load_topology_text(TEXT.replace("CONFIG", "{tcp: {mtu: 9000}}")).config
    )
    assert config.tcp == TcpConfig(mtu=9000)
    bounds = config_schema(TopologyConfig)["properties"]["tcp"]["properties"]["mtu"]
    assert (bounds["minimum"], bounds["maximum"]) == (MIN_MTU, MAX_MTU)
    assert MIN_MTU >= wire.MIN_MTU
    for bad in ("{tcp: {mtu: 65536}}", "{tcp: {mtu: 10}}", "{tcp: {mtu: big}}", "{tcp: {size: 1}}"):
        with pytest.raises(TopologyError):
            load_topology_text(TEXT.replace("CONFIG", bad))


@pytest.mark.parametrize("mtu", [MIN_MTU - 1, MAX_MTU + 1])
def test_a_tcp_worker_refuses_a_frame_size_it_cannot_use(mtu: int) -> None:
    with pytest.raises(ValueError, match="tcp frames"):
        TcpTransport(1, APP, ("127.0.0.1", 1), mtu=mtu, secret=SECRET)


def transport_of(**extra: object) -> TcpTransport:
    """The transport ``make_transport`` builds for a tcp spec with ``extra`` settings."""
    topology = load_topology_text(TEXT.replace("CONFIG", "{}"))
    physical = schedule(topology, ["h1"], APP, first_port=10)
    c = Coordinator()
    spec = WorkerSpec(
        topology,
        physical,
        physical.workers[0].worker_id,
        transport={"kind": "tcp", "control": list(c.address), "secret": SECRET, **extra},
    )
    try:
        t = make_transport(spec)  # it reads the coordinator's challenge, then needs it no more
    finally:
        c.close()
    assert isinstance(t, TcpTransport)
    return t


@pytest.mark.parametrize("mtu", [9000, 64000])
def test_the_spec_s_frame_size_reaches_the_worker_s_transport(mtu: int) -> None:
    t = transport_of(mtu=mtu)
    try:
        assert t.mtu == mtu
    finally:
        t.close()


def test_a_tcp_spec_without_a_frame_size_gets_the_tcp_default() -> None:
    """What a run writes when the topology asks for none (64,000), not the wire's 9,000."""
    t = transport_of()
    try:
        assert t.mtu == tcp_mtu({}) == TCP_MTU != wire.DEFAULT_MTU
    finally:
        t.close()


def exchange(
    tx_mtu: int, rx_mtu: int, payloads: list[bytes]
) -> tuple[list[bytes], TcpTransport, TcpTransport]:
    """``payloads`` sent from a worker with ``tx_mtu`` frames to one with ``rx_mtu``: what
    the receiver handed on, once it read every frame sent."""
    c1, c2 = Coordinator(), Coordinator()
    tx = TcpTransport(1, APP, c1.address, mtu=tx_mtu, secret=SECRET)
    rx = TcpTransport(2, APP, c2.address, mtu=rx_mtu, secret=SECRET)
    got: list[bytes] = []
    tx.on_wait = lambda: got.extend(
        p for i in rx.poll(0) if isinstance(i, Inbound) for p in i.payloads
    )
    try:
        c1.peers(0, {2: (rx.listener.getsockname()[1], 1)})
        tx.send(2, STREAM, payloads)
        deadline = time.monotonic() + 20
        while rx.frames_delivered(1) != tx.frames_sent(2) and time.monotonic() < deadline:
            tx.on_wait()
        assert rx.frames_delivered(1) == tx.frames_sent(2), "not every frame was read"
        return got, tx, rx
    finally:
        tx.close()
        rx.close()
        c1.close()
        c2.close()


PAYLOADS = [i.to_bytes(4, "big") * 25 for i in range(5000)]  # 100-byte tuples, 500 KB


def test_64_kb_frames_arrive_whole_and_in_order() -> None:
    got, tx, rx = exchange(64000, 64000, PAYLOADS)
    assert got == PAYLOADS
    frames = tx.stats.frames_out
    assert rx.stats.frames_in == frames and rx.stats.drops == {}
    # the frames are 64 KB ones: far fewer than 9,000-byte framing takes
    assert (
        len(wire.pack_frames(b"\0" * 6, b"\0" * 6, wire.Kind.DATA, 0, 0, PAYLOADS, 64000)) == frames
    )
    assert (
        len(wire.pack_frames(b"\0" * 6, b"\0" * 6, wire.Kind.DATA, 0, 0, PAYLOADS, 9000))
        > 6 * frames
    )
    assert rx.stats.bytes_in / frames > 60000


@pytest.mark.parametrize(("tx_mtu", "rx_mtu"), [(64000, 9000), (MAX_MTU, 64000)])
def test_a_frame_over_the_receiver_s_size_is_a_counted_drop(tx_mtu: int, rx_mtu: int) -> None:
    got, tx, rx = exchange(tx_mtu, rx_mtu, PAYLOADS)
    frames = tx.stats.frames_out
    assert rx.stats.frames_in == frames
    # every full frame was over the bound and dropped, counted; the short last one came
    dropped = rx.stats.drops.get("malformed_frame", 0)
    assert frames - 1 <= dropped <= frames and set(rx.stats.drops) == {"malformed_frame"}
    assert len(got) < len(PAYLOADS) and got == PAYLOADS[len(PAYLOADS) - len(got) :]
