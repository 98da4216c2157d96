"""What a debug worker is told, and where it is written: ``debug/HOST/SESSION``.

The live debugger app (controller) writes one key per session under the host
of the observed worker; that host's agent launches the debug worker, plugs its
TAP into the bridge at ``port``, and stops it when the key is deleted.  Nothing
else reads or writes these keys, so they stay apart from the topology keys
(a debug worker is not part of any physical topology).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from typhoon.coordinator import Coordinator
from typhoon.private_files import write_private
from typhoon.wire import ETHERTYPE

log = logging.getLogger(__name__)

PREFIX = "debug"
DIRECTIONS = ("in", "out", "both")
DEBUG_TAP_PREFIX = "tdbg"
MAX_TAP_MTU = 65000  # as the emulated links (a TAP takes at most 65,521: 65,535 less its header)
KEY_HEADER = "X-Typhoon-Debug-Key"  # how a debug worker proves it owns a session


def debug_tap_name(session: str) -> str:
    """``tdbg`` + the session id: 10 characters, never a worker TAP name (``ty...``)."""
    return f"{DEBUG_TAP_PREFIX}{session}"[:15]


@dataclass
class DebugSpec:
    session: str  # short hex id, unique while the controller runs
    app: str
    app_id: int
    worker: int  # the observed worker
    direction: str  # one of DIRECTIONS
    host: str  # the observed worker's host: the debug worker runs there too
    port: int  # OpenFlow port of the debug worker's TAP on the host bridge
    tap: str
    report_url: str  # where the debug worker POSTs what it decoded
    key: str  # secret of this session, sent in KEY_HEADER
    filter: str = ""
    sample: float = 100.0  # percent of matching tuples to keep
    # frames/s the switch copies to the debug port (its meter), the rest never; None: no
    # meter, every frame copied (``--rate all``)
    rate: int | None = 200
    # a bolt (built-in name or module:Class) run over the tuples shown; its output is shown
    operator: str = ""
    # worker id -> [node, index] of every worker of the app, and node -> output fields:
    # the debug worker names the sender, receiver and fields of each tuple with them
    workers: dict[int, tuple[str, int]] = field(default_factory=dict)
    fields: dict[str, list[str]] = field(default_factory=dict)
    max_rate: int = 10000  # records per second sent to the controller, the rest are counted
    ethertype: int = ETHERTYPE
    # the largest frame a TAP takes: a mirrored copy is as long as the observed worker's
    # frames, whatever its MTU (a longer one would not reach the debug worker)
    mtu: int = MAX_TAP_MTU

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {self.direction!r}")
        if not 0 < self.sample <= 100:
            raise ValueError(f"sample must be a percentage in (0, 100], not {self.sample!r}")

    @property
    def key_path(self) -> str:
        return f"{PREFIX}/{self.host}/{self.session}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["workers"] = {str(k): list(v) for k, v in self.workers.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DebugSpec:
        d = dict(d)
        d["workers"] = {int(k): (str(v[0]), int(v[1])) for k, v in d.get("workers", {}).items()}
        return cls(**d)

    def save(self, path: Path) -> None:
        write_private(path, json.dumps(self.to_dict()))  # holds the session's key

    @classmethod
    def load(cls, path: Path) -> DebugSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))


def put_session(c: Coordinator, spec: DebugSpec) -> None:
    c.put(spec.key_path, spec.to_dict())


def delete_session(c: Coordinator, host: str, session: str) -> None:
    c.delete(f"{PREFIX}/{host}/{session}")


def sessions_on(c: Coordinator, host: str) -> dict[str, DebugSpec]:
    """The sessions whose debug worker must run on ``host``; malformed ones are skipped."""
    out = {}
    prefix = f"{PREFIX}/{host}/"
    for key in c.list(f"{PREFIX}/{host}"):
        value = c.get(key)
        if value is None:
            continue
        try:
            out[key[len(prefix) :]] = DebugSpec.from_dict(value)
        except (TypeError, ValueError, KeyError, IndexError) as e:
            log.error("ignoring debug session %s: %s", key, e)
    return out


def all_session_keys(c: Coordinator) -> list[str]:
    return c.list(PREFIX)
