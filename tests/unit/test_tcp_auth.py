"""The tcp engine's authentication on real loopback sockets, without worker processes:
the coordinator's hello gate, the proofs, and the spec file that carries the secret."""

from __future__ import annotations

import select
import socket
import stat
import struct
import threading
import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from typhoon.runtime import tcp_auth as auth
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.tcp_framing import MAX_BOOT, MessageReader, encode_boot
from typhoon.tcp_gate import HelloGate
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import WireError

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


@pytest.fixture
def server():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s
    s.close()


def hello(
    addr, secret: str, wid: int, claim_port: int = 4000, tamper: bool = False
) -> socket.socket:
    s = socket.create_connection(addr, timeout=10)
    nonce, _ = auth.read_challenge(s, MessageReader(MAX_BOOT), 10)
    proof = auth.proof(secret, auth.HELLO, nonce, wid, "127.0.0.1", claim_port)
    port = claim_port + 1 if tamper else claim_port  # the proof no longer covers the port
    s.sendall(encode_boot({"hello": wid, "host": "127.0.0.1", "port": port, "proof": proof}))
    return s


def raw(addr, data: bytes, challenge: bool = True) -> socket.socket:
    s = socket.create_connection(addr, timeout=10)
    if challenge:
        auth.read_challenge(s, MessageReader(MAX_BOOT), 10)
    s.sendall(data)
    return s


def test_only_proven_expected_hellos_pass_the_gate(server):
    secret = auth.new_secret()
    gate = HelloGate(server, secret)
    addr = server.getsockname()
    socks: list[socket.socket] = []

    def refused(s: socket.socket) -> None:
        s.settimeout(10)
        assert s.recv(100) == b""  # the gate hung up: it has dealt with this one
        socks.append(s)

    def clients() -> None:
        refused(hello(addr, auth.new_secret(), 1))  # another run's secret
        refused(hello(addr, secret, 1, tamper=True))  # a proof for another port
        refused(hello(addr, secret, 7))  # not a worker of ours
        refused(raw(addr, struct.pack(">I", 0xFFFFFFF0)))  # oversize length
        refused(raw(addr, struct.pack(">I", 3) + b"\x01\xc1\xc1"))  # not msgpack
        refused(raw(addr, encode_boot({"hello": "1", "host": 5, "port": -1})))
        refused(raw(addr, b"\x00\x00\x00\x01\x00"))  # a control message, not a hello
        first = hello(addr, secret, 1, 4001)
        second = hello(addr, secret, 1, 4009)  # two hellos for 1: one is refused
        refused(_first_refused(first, second))
        socks.append(hello(addr, secret, 2, 4002))

    th = threading.Thread(target=clients)
    th.start()
    got = gate.collect({1, 2}, time.monotonic() + 20)
    th.join()
    assert got[1].port in (4001, 4009) and (got[2].host, got[2].port) == ("127.0.0.1", 4002)
    assert gate.rejected == {"bad_proof": 2, "unexpected_id": 2, "malformed": 4}
    for h in got.values():
        h.sock.close()
    for s in socks:
        s.close()


def _first_refused(a: socket.socket, b: socket.socket) -> socket.socket:
    """Of two hellos for the same worker, the one the gate hung up on (it may take either)."""
    ready, _, _ = select.select([a, b], [], [], 10)
    assert ready, "the gate kept both hellos for one worker"
    return ready[0]


def test_a_gate_that_hears_nothing_times_out_and_names_the_missing(server):
    gate = HelloGate(server, auth.new_secret())
    silent = socket.create_connection(server.getsockname(), timeout=10)
    with pytest.raises(TimeoutError, match=r"\[3\]"):
        gate.collect({3}, time.monotonic() + 0.5)
    assert gate.rejected == {"no_hello": 1}
    silent.close()


def test_proofs_bind_the_nonce_and_every_claim():
    secret = auth.new_secret()
    nonce, message = auth.challenge()
    assert auth.boot_body(MessageReader().feed(message)[0]) == {"challenge": nonce}
    p = auth.proof(secret, auth.PEER, nonce, 3, 4)
    assert auth.verify(secret, p, auth.PEER, nonce, 3, 4)
    assert not auth.verify(secret, p, auth.PEER, nonce, 4, 3)
    assert not auth.verify(secret, p, auth.HELLO, nonce, 3, 4)
    assert not auth.verify(secret, p, auth.PEER, auth.challenge()[0], 3, 4)
    assert not auth.verify(auth.new_secret(), p, auth.PEER, nonce, 3, 4)
    assert not auth.verify(secret, p.hex(), auth.PEER, nonce, 3, 4)
    for bad in (b"", b"\x00", b"\x01" + msgpack.packb([1]), b"\x01\xd6\xff\x00\x00\x00\x01"):
        with pytest.raises(WireError):
            auth.boot_body(bad)


def test_spec_file_is_readable_by_its_owner_only(tmp_path):
    topo = load_topology_text(PAIR)
    physical = schedule(topo, ["h1"], 7)
    spec = WorkerSpec(topo, physical, physical.workers[0].worker_id, transport={"secret": "ab"})
    path = tmp_path / "w.spec.json"
    path.write_text("{}")
    path.chmod(0o644)  # an older file keeps no say
    spec.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert WorkerSpec.load(path).transport == {"secret": "ab"}
    fresh = tmp_path / "new.spec.json"
    spec.save(fresh)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


# ----- the coordinator's and the workers' parsers of what a connection sends ------------


def boot_messages() -> st.SearchStrategy[bytes]:
    """Boot messages, valid hellos mutated, and plain garbage (the gate's input)."""
    fields = st.dictionaries(
        st.sampled_from(["hello", "host", "port", "proof", "peer", "peers", "challenge"]),
        st.none()
        | st.integers(-(2**63), 2**64 - 1)
        | st.text(max_size=5)
        | st.binary(max_size=40)
        | st.lists(st.integers(0, 2**32), max_size=3),
    )
    boot = fields.map(encode_boot)
    deep = st.integers(1, 1100).map(
        lambda n: struct.pack(">I", n + 3) + b"\x01" + b"\x91" * n + b"\xc0\xc0"
    )
    return st.one_of(boot, deep, st.binary(max_size=64), boot.flatmap(mutations))


def mutations(data: bytes) -> st.SearchStrategy[bytes]:
    return st.tuples(st.integers(0, max(0, len(data) - 1)), st.integers(0, 255)).map(
        lambda iv: data[: iv[0]] + bytes([iv[1]]) + data[iv[0] + 1 :]
    )


@settings(max_examples=300, deadline=None)
@given(data=boot_messages(), cut=st.integers(1, 16))
def test_boot_parsers_raise_only_wire_errors(data: bytes, cut: int):
    reader = MessageReader(MAX_BOOT)
    try:
        messages = [m for i in range(0, len(data), cut) for m in reader.feed(data[i : i + cut])]
    except WireError:
        return
    for m in messages:
        try:
            body = auth.boot_body(m)
            auth.hello_claims(body)
        except WireError:
            continue
