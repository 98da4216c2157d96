"""Who may talk to whom on the ``tcp`` engine: a per-run secret, HMAC over a nonce.

The run coordinator makes one secret per run and hands it to each worker in its
spec file (mode 0600, never on a command line).  Whoever accepts a connection
(the coordinator for control connections, a worker for data connections) first
sends a fresh random nonce (``challenge``); the connecting side answers with an
HMAC-SHA256 over a purpose label, the nonce and the ids it claims.  Only then is
the connection trusted: a control connection as the worker id of its hello, a
data connection as the sending worker, whose frames must carry that worker's
address.  Anything else is refused, logged and counted, never a crash
(docs/security-notes-wire.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import select
import socket
import time
from typing import Any

from typhoon.runtime.tcp_framing import MSG_BOOT, MessageReader, encode_boot
from typhoon.wire import WireError, decode_value

NONCE_LEN = 16
SECRET_BYTES = 32
HELLO = b"typhoon-tcp-hello\0"  # control connection: worker -> coordinator
PEER = b"typhoon-tcp-peer\0"  # data connection: sender -> receiver
AUTH_TIMEOUT_S = 30.0


def new_secret() -> str:
    """A fresh per-run secret, hex (it travels in a JSON spec file)."""
    return secrets.token_hex(SECRET_BYTES)


def challenge() -> tuple[bytes, bytes]:
    """A fresh nonce and the boot message that carries it."""
    nonce = secrets.token_bytes(NONCE_LEN)
    return nonce, encode_boot({"challenge": nonce})


def proof(secret: str, purpose: bytes, nonce: bytes, *claims: int | str) -> bytes:
    """HMAC-SHA256 of the purpose label, the nonce and what the sender claims."""
    msg = purpose + nonce + b"\0".join(str(c).encode() for c in claims)
    return hmac.new(bytes.fromhex(secret), msg, hashlib.sha256).digest()


def verify(secret: str, got: Any, purpose: bytes, nonce: bytes, *claims: int | str) -> bool:
    """Whether ``got`` is the proof for these claims (constant-time comparison)."""
    if type(got) is not bytes:
        return False
    return hmac.compare_digest(got, proof(secret, purpose, nonce, *claims))


def boot_body(message: bytes) -> dict[str, Any]:
    """The map of one boot message; WireError if the message is anything else."""
    if not message or message[0] != MSG_BOOT:
        raise WireError("expected a boot message")
    body = decode_value(message[1:])
    if type(body) is not dict:
        raise WireError(f"a boot message must be a msgpack map, got {type(body).__name__}")
    return body


def read_challenge(
    sock: socket.socket, reader: MessageReader, timeout: float
) -> tuple[bytes, list[Any]]:
    """Wait for the peer's challenge on a new connection: its nonce, and any messages
    that came after it.  ConnectionError if the peer closes or stays silent, WireError
    if it sends anything else."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConnectionError("no challenge from the peer")
        if not select.select([sock], [], [], left)[0]:
            continue
        data = sock.recv(4096)
        if not data:
            raise ConnectionError("the peer closed the connection before its challenge")
        messages = reader.feed(data)
        if messages:
            nonce = boot_body(messages[0]).get("challenge")
            if type(nonce) is not bytes or len(nonce) != NONCE_LEN:
                raise WireError("malformed challenge")
            return nonce, messages[1:]


def hello_claims(body: dict[str, Any]) -> tuple[int, str, int]:
    """(worker id, host, port) of a hello; WireError if a field is missing or wrong."""
    wid, host, port = body.get("hello"), body.get("host"), body.get("port")
    if type(wid) is not int or not 1 <= wid <= 0xFFFE:
        raise WireError(f"hello: bad worker id {wid!r}")
    if type(host) is not str or not host or len(host) > 255:
        raise WireError("hello: bad host")
    if type(port) is not int or not 1 <= port <= 0xFFFF:
        raise WireError(f"hello: bad port {port!r}")
    return wid, host, port
