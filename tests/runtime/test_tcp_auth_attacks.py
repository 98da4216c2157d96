"""The tcp engine's doors under attack, in a real run: forged hellos at the coordinator
and forged data connections at a worker are refused, logged and counted, and the run
still completes with exact results.

Real worker processes, real sockets on loopback (the coordinator and the workers
listen on 127.0.0.1 only).
"""

from __future__ import annotations

import copy
import socket
import struct
import threading
from collections import Counter
from pathlib import Path

import msgpack
import pytest

from typhoon import wire
from typhoon.operators.sources import generate_sentences
from typhoon.runtime import tcp_auth as auth
from typhoon.runtime.tcp_framing import MAX_BOOT, MessageReader, encode_boot
from typhoon.tcp_cluster import RunOptions, TcpCluster, local_launcher
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def attack(addr: tuple[str, int], send: bytes) -> str:
    """Connect, take the challenge, send ``send``; 'closed' if the other side hung up."""
    with socket.create_connection(addr, timeout=30) as s:
        auth.read_challenge(s, MessageReader(MAX_BOOT), 30)
        s.sendall(send)
        return "closed" if hung_up(s) else "answered"


def forged_hello(addr, secret: str | None, wid: int, port: int = 9) -> str:
    """A hello for ``wid``, its proof made with ``secret`` (None: a proof of zeros)."""
    with socket.create_connection(addr, timeout=30) as s:
        nonce, _ = auth.read_challenge(s, MessageReader(MAX_BOOT), 30)
        proof = (
            auth.proof(secret, auth.HELLO, nonce, wid, "127.0.0.1", port) if secret else bytes(32)
        )
        s.sendall(encode_boot({"hello": wid, "host": "127.0.0.1", "port": port, "proof": proof}))
        return "closed" if hung_up(s) else "answered"


def test_forged_hellos_and_data_connections_are_refused_and_the_run_is_exact(tmp_path):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.name = "tcpauth"
    t.nodes["source"].args.update(count=20_000)
    outcomes: dict[str, str] = {}
    attacked = threading.Event()
    started: list[threading.Thread] = []
    cluster: TcpCluster

    def attacks() -> None:
        addr = cluster.server.getsockname()
        first = min(w.worker_id for w in cluster.physical.workers)
        # a hello for a real worker id before that worker, without the secret
        outcomes["wrong secret"] = forged_hello(addr, auth.new_secret(), first)
        outcomes["no proof"] = forged_hello(addr, None, first)
        # the right secret, an id the run does not have
        outcomes["unexpected id"] = forged_hello(addr, cluster.secret, 999)
        garbage = struct.pack(">I", 9) + b"\x01\xc1garbage"
        outcomes["malformed bytes"] = attack(addr, garbage)
        outcomes["boot not a map"] = attack(addr, encode_boot_raw(msgpack.packb([1, 2])))
        outcomes["oversize length"] = attack(addr, struct.pack(">I", 0xFFFFFFF0) + b"\x01")
        attacked.set()

    def launcher(host, argv, logfile):
        # the attacks start before the first worker and race ahead of the workers' start-up
        # (a second of imports); the coordinator meets them while it waits for hellos
        if not started:
            started.append(threading.Thread(target=attacks, name="attacker", daemon=True))
            started[0].start()
        return local_launcher(host, argv, logfile)

    cluster = TcpCluster(
        t, RunOptions(live=False, timeout=120), workdir=tmp_path, launcher=launcher
    )
    try:
        assert cluster.server.getsockname()[0] == "127.0.0.1"
        cluster.start()
        count = cluster.physical.of_node("count")[0]
        split = cluster.physical.of_node("split")[0].worker_id
        target = cluster.peers[count.worker_id]
        # a data connection that cannot prove the secret, then one that proves it for
        # the split worker but sends frames claiming another sender
        with socket.create_connection(target, timeout=30) as s:
            auth.read_challenge(s, MessageReader(MAX_BOOT), 30)
            s.sendall(encode_boot({"peer": split, "proof": bytes(32)}))
            s.sendall(frame(cluster, count.worker_id, split))
            assert hung_up(s)
        with socket.create_connection(target, timeout=30) as s:
            nonce, _ = auth.read_challenge(s, MessageReader(MAX_BOOT), 30)
            proof = auth.proof(cluster.secret, auth.PEER, nonce, split, count.worker_id)
            s.sendall(encode_boot({"peer": split, "proof": proof}))
            other = cluster.physical.of_node("split")[1].worker_id
            s.sendall(frame(cluster, count.worker_id, other))
            s.sendall(frame(cluster, count.worker_id, split, dst_addr=count.worker_id + 1000))
        assert attacked.wait(30), outcomes
        cluster.activate()
        clean = cluster.wait()
        report = cluster.report(clean)
    finally:
        cluster.close()
    assert set(outcomes.values()) == {"closed"}, outcomes
    assert report["rejected_connections"] == {"bad_proof": 2, "unexpected_id": 1, "malformed": 3}
    assert report["ok"], report["problems"]
    want = Counter()
    args = t.nodes["source"].args
    for s in generate_sentences(args["count"], args["seed"], args["words"], args["vocabulary"]):
        want.update(s.split())
    counts = {k: int(v) for k, v in report["results"]["count"]["counts"].items()}
    assert counts == dict(want)
    drops = next(w["drops"] for w in report["workers"] if w["worker"] == count.worker_id)
    assert drops.get("unauthenticated") == 1 and drops.get("spoofed_frame") == 2, drops


def hung_up(s: socket.socket) -> bool:
    s.settimeout(30)
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:  # closed with our frame unread
        return True


def encode_boot_raw(body: bytes) -> bytes:
    return struct.pack(">I", len(body) + 1) + b"\x01" + body


def frame(cluster: TcpCluster, dst: int, src: int, dst_addr: int | None = None) -> bytes:
    """A data frame of one row, length-prefixed as on a data connection; ``dst_addr``:
    the worker its destination address names (default ``dst``)."""
    app = cluster.physical.app_id
    f = wire.pack_frames(
        wire.worker_mac(app, dst if dst_addr is None else dst_addr),
        wire.worker_mac(app, src),
        wire.Kind.DATA,
        cluster.topology.inputs_of("count")[0].id,
        0,
        [wire.encode_rows([["forged", 1]])],
    )[0]
    return struct.pack(">I", len(f)) + f
