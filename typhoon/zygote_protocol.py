"""What the launcher and its worker fork server (zygote) say to each other.

The two ends share one ``AF_UNIX``/``SOCK_SEQPACKET`` socket pair that the
launcher makes and hands to the zygote it starts (an inherited descriptor, no
name in the file system): nobody else can send it a request.  Each message is
one JSON object of at most :data:`MAX_MESSAGE` bytes.

Launcher -> zygote, with the worker's log file as the one descriptor attached
(``SCM_RIGHTS``), so the zygote never opens a path it was told::

    {"op": "fork", "id": 7, "specs": ["/abs/worker-3.spec.json", ...]}

or, for the live debugger's debug worker of one session (an agent's zygote;
``coordinator`` optional, the URL its records go through)::

    {"op": "fork", "id": 8, "program": "debug", "specs": ["/abs/debug/S.spec.json"],
     "coordinator": "zk://..."}

Zygote -> launcher: ``{"op": "ready", "pid": P}`` once its imports are done,
``{"op": "forked", "id": 7, "pid": C}`` or ``{"op": "refused", "id": 7,
"error": "..."}`` per request, and ``{"op": "exit", "pid": C, "code": N}`` when
a child ends (``N`` as ``Popen.returncode``: negative for a signal).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_MESSAGE = 64 * 1024
MAX_SPECS = 64  # a chain of this many workers in one process is far past any real one
SPEC_SUFFIX = ".spec.json"
MAX_URL = 4096
# what a child runs: a topology worker (or chain), or the live debugger's debug worker
PROGRAMS = {"worker": "typhoon.runtime.worker", "debug": "typhoon.debug.worker"}


class ZygoteProtocolError(ValueError):
    """A message that breaks the protocol; the text says how, in one sentence."""


@dataclass(frozen=True)
class ForkRequest:
    """One worker process to fork: its spec files (a chain's, head first); a debug
    worker's one spec and the coordinator URL it is given."""

    request_id: int
    specs: tuple[str, ...]
    program: str = "worker"  # a key of PROGRAMS
    coordinator: str | None = None  # a debug worker's --coordinator


def encode(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ZygoteProtocolError(f"message of {len(data)} bytes is over {MAX_MESSAGE}")
    return data


def decode(data: bytes) -> dict[str, Any]:
    """One message's JSON object (ZygoteProtocolError: not one)."""
    try:
        message = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ZygoteProtocolError(f"not JSON: {e}") from None
    if not isinstance(message, dict):
        raise ZygoteProtocolError("a message must be a JSON object")
    return message


def fork_request(data: bytes, fds: int, truncated: bool = False) -> ForkRequest:
    """The request in ``data`` with ``fds`` descriptors attached, or ZygoteProtocolError."""
    if truncated:
        raise ZygoteProtocolError(f"message over {MAX_MESSAGE} bytes (truncated)")
    message = decode(data)
    if message.get("op") != "fork":
        raise ZygoteProtocolError(f"unknown op {message.get('op')!r}")
    rid = message.get("id")
    if not isinstance(rid, int) or isinstance(rid, bool) or rid < 0:
        raise ZygoteProtocolError("id must be a non-negative integer")
    if fds != 1:
        raise ZygoteProtocolError(f"a fork request carries one log descriptor, not {fds}")
    specs = message.get("specs")
    if not isinstance(specs, list) or not 1 <= len(specs) <= MAX_SPECS:
        raise ZygoteProtocolError(f"specs must be a list of 1 to {MAX_SPECS} paths")
    for s in specs:
        if not isinstance(s, str) or not s.startswith("/") or not s.endswith(SPEC_SUFFIX):
            raise ZygoteProtocolError(f"spec {s!r} is not an absolute *{SPEC_SUFFIX} path")
        if "\0" in s:
            raise ZygoteProtocolError("a spec path holds a NUL byte")
    program = message.get("program", "worker")
    if program not in PROGRAMS:
        raise ZygoteProtocolError(f"unknown program {program!r}")
    known = {"op", "id", "specs", "program"} | ({"coordinator"} if program == "debug" else set())
    extra = set(message) - known
    if extra:
        raise ZygoteProtocolError(f"unknown fields {sorted(extra)}")
    coordinator = message.get("coordinator")
    if program == "debug":
        if len(specs) != 1:
            raise ZygoteProtocolError("a debug worker has one spec")
        if coordinator is not None and (
            not isinstance(coordinator, str)
            or not 0 < len(coordinator) <= MAX_URL
            or "\0" in coordinator
        ):
            raise ZygoteProtocolError(f"coordinator must be a URL of 1 to {MAX_URL} characters")
    return ForkRequest(rid, tuple(specs), program, coordinator)


def exit_message(pid: int, code: int) -> dict[str, Any]:
    return {"op": "exit", "pid": pid, "code": code}


@dataclass(frozen=True)
class Reply:
    """A zygote message the launcher acts on (``op`` one of ready, forked, refused, exit)."""

    op: str
    pid: int = 0
    request_id: int = -1
    code: int = 0
    error: str = ""


def reply(data: bytes) -> Reply:
    """A zygote message, checked (ZygoteProtocolError: not one the launcher knows)."""
    m = decode(data)
    op = m.get("op")
    ints = {k: m.get(k) for k in ("pid", "id", "code") if k in m}
    if any(not isinstance(v, int) or isinstance(v, bool) for v in ints.values()):
        raise ZygoteProtocolError(f"{op} message with a non-integer field: {m}")
    if op == "ready" and "pid" in m:
        return Reply("ready", pid=m["pid"])
    if op == "forked" and {"pid", "id"} <= set(m):
        return Reply("forked", pid=m["pid"], request_id=m["id"])
    if op == "refused" and "id" in m:
        return Reply("refused", request_id=m["id"], error=str(m.get("error", "")))
    if op == "exit" and {"pid", "code"} <= set(m):
        return Reply("exit", pid=m["pid"], code=m["code"])
    raise ZygoteProtocolError(f"unexpected zygote message {m}")
