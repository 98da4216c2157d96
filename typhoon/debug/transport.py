"""How a debug worker's records reach the controller: through the coordinator by default.

A debug worker runs on the observed worker's host, often another machine than
the controller's, whose REST API listens on 127.0.0.1 unless an operator
exposes it (docs/deploy.md, section 6).  Every agent host reaches the
coordinator, so that is the default road: the debug worker writes batch n
(records and statistics, the same body it would POST) to
``debugrec/SID/<n mod SLOTS>`` with an atomic create.  The controller reads
the slots in order and deletes each one; a slot it has not read yet is
backpressure (the batch waits in the worker's bounded backlog), so a session
never holds more than ``SLOTS`` keys and the store's change log stays bounded.

With ``[live_debugger] report_url`` set, batches go over HTTP instead
(``typhoon.debug.worker.http_post``).  Either way ``debugrec/SID/error``
carries a failure to the controller: the worker could not deliver (say, the
URL is refused from that host), or its process ended with an error (written by
the agent).  The controller ends the session with that reason, which
``typhoon debug attach`` prints within seconds instead of waiting on an empty
stream.  ``debugrec/SID`` goes when the session ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from typhoon.coordinator import Coordinator, CoordinatorError
from typhoon.debug.spec import DebugSpec

PREFIX = "debugrec"
SLOTS = 32  # batches written but not read yet, per session
MAX_BATCH_BYTES = 256 * 1024  # JSON bytes of one batch's records (ZooKeeper takes 1 MiB)
ERROR = "error"


class Undelivered(Exception):
    """A batch that could not be handed over now; the shipper keeps it and tries again."""


class SessionEnded(Exception):
    """The session's key is gone: the controller ended it."""


def slot_key(session: str, n: int) -> str:
    return f"{PREFIX}/{session}/{n % SLOTS}"


def record_size(record: dict[str, Any]) -> int:
    return len(json.dumps(record, default=str))


def coordinator_post(c: Coordinator, spec: DebugSpec) -> Callable[[dict[str, Any]], None]:
    """The debug worker's ``post``: one batch into the next slot (module docstring)."""
    sent = [0]

    def post(body: dict[str, Any]) -> None:
        try:
            if c.get(spec.key_path) is None:
                raise SessionEnded(f"session key {spec.key_path} is gone")
            if not c.create(slot_key(spec.session, sent[0]), body):
                raise Undelivered(f"the controller has not read the last {SLOTS} batches")
        except CoordinatorError as e:
            raise Undelivered(f"cannot write to the coordinator: {e}") from None
        sent[0] += 1

    return post


def report_failure(c: Coordinator, session: str, message: str) -> None:
    """Tell the controller why this session cannot deliver (it ends the session)."""
    c.put(f"{PREFIX}/{session}/{ERROR}", {"error": message})


def take_batches(
    c: Coordinator, session: str, next_n: int
) -> tuple[list[dict[str, Any]], int, str | None]:
    """The controller's read: batches from ``next_n`` on, in order, each deleted once read;
    (batches, the next batch number, the failure the worker or its agent reported)."""
    out: list[dict[str, Any]] = []
    while len(out) < SLOTS:
        key = slot_key(session, next_n)
        body = c.get(key)
        if body is None:
            break
        c.delete(key)
        next_n += 1
        if isinstance(body, dict):
            out.append(body)
    failure = c.get(f"{PREFIX}/{session}/{ERROR}")
    error = str(failure.get("error")) if isinstance(failure, dict) else None
    return out, next_n, error


def delete_batches(c: Coordinator, session: str) -> None:
    """Remove a session's slots and error."""
    c.delete(f"{PREFIX}/{session}")


def forget_batches(c: Coordinator, keep: set[str]) -> list[str]:
    """Remove what sessions not in ``keep`` left (an earlier controller run's); their ids."""
    gone = sorted({key.split("/")[1] for key in c.list(PREFIX)} - keep)
    for session in gone:
        delete_batches(c, session)
    return gone
