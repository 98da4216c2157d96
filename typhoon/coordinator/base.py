"""The coordinator: Typhoon's global state (paper Table 1) behind one interface.

A backend is a JSON key-value store with a change log; everything else is the
typed API below, identical for every backend, so the manager, the agents and
the controller never see how state is stored.

Key layout (segments are ``[A-Za-z0-9_.:-]+``, joined by ``/``)::

    topology/NAME        logical topology          Topology.to_dict()
    physical/NAME        physical topology         PhysicalTopology.to_dict()
    state/NAME           application state         e.g. {"active": true} (controller)
    status/NAME/WID      runtime status of worker  WorkerStatus.to_dict()
    metrics/NAME/WID     last metrics of worker    free-form dict
    report/NAME/WID      an ended worker's report  {"report": ..., "exit_code": ...} (agent)
    result/NAME          a finished job's report   typhoon/job_report.py (controller; kept
                         after the job is removed, until a job of that name is submitted)
    cluster              hosts, bridges, links     Cluster.to_dict()
    agents/HOST          worker agent of HOST      AgentState.to_dict()
    debug/HOST/SID       live debugger session     DebugSpec.to_dict() (typhoon/debug/spec.py)
    appid/ID             application ID claim      the name that holds ID (4 hex digits)

Change log: every write or delete of a key gets a new, larger version.
``changes_since(v)`` lists each key changed after ``v`` once, in the order of
its latest change, so a reader that polls never misses the newest value of a
key, and the log stays as small as the key space.  Values are JSON: they cross
process and host boundaries, and nothing read back may run code (no pickle).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from typhoon.cluster import Cluster
from typhoon.topology.model import PhysicalTopology, Topology

log = logging.getLogger(__name__)

WORKER_STATES = ("starting", "attached", "running", "exited")
_SEGMENT = r"[A-Za-z0-9_.:-]+"
_KEY = re.compile(rf"{_SEGMENT}(/{_SEGMENT})*")


class CoordinatorError(Exception):
    """Coordinator state is missing, malformed or cannot be reached."""


def check_key(key: str) -> str:
    """Refuse keys that a backend could store differently (ZooKeeper paths, SQL ranges)."""
    if not isinstance(key, str) or not _KEY.fullmatch(key) or {".", ".."} & set(key.split("/")):
        raise CoordinatorError(f"invalid coordinator key {key!r}")
    return key


def encode(key: str, value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise CoordinatorError(f"value for {key!r} is not JSON-serializable: {e}") from e


def decode(key: str, text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise CoordinatorError(f"key {key!r} holds a value that is not JSON: {e}") from e


@dataclass
class WorkerStatus:
    """What the agent last saw of one worker process (``status/NAME/WID``)."""

    worker_id: int
    host: str
    state: str  # one of WORKER_STATES
    pid: int | None = None
    port: int | None = None  # OpenFlow port on the host bridge
    tap: str = ""
    exit_code: int | None = None  # negative: killed by that signal
    error: str = ""
    updated: float = 0.0  # time.time() of the write

    def __post_init__(self) -> None:
        if self.state not in WORKER_STATES:
            raise ValueError(f"worker state must be one of {WORKER_STATES}, not {self.state!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerStatus:
        return cls(**d)


@dataclass
class AgentState:
    """One host's worker agent (``agents/HOST``, paper Table 1 row 3)."""

    host: str
    pid: int
    heartbeat: float  # time.time() of the last write
    port_range: tuple[int, int]  # OpenFlow ports the host gives workers, inclusive
    used_ports: list[int] = field(default_factory=list)
    workers: dict[str, list[int]] = field(default_factory=dict)  # app -> supervised IDs

    def free_ports(self) -> int:
        first, last = self.port_range
        return last - first + 1 - len(self.used_ports)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["port_range"] = list(self.port_range)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentState:
        d = dict(d)
        first, last = d.pop("port_range")
        return cls(port_range=(int(first), int(last)), **d)


class Watch:
    """A helper thread calling ``callback(changed_keys)`` whenever the store changes."""

    def __init__(
        self, coordinator: Coordinator, callback: Callable[[list[str]], None], interval: float
    ) -> None:
        self._coordinator = coordinator
        self._callback = callback
        self._interval = interval
        self._stop = threading.Event()
        self.version = coordinator.version()
        self._thread = threading.Thread(target=self._run, name="coordinator-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.version, keys = self._coordinator.changes_since(self.version)
                if keys:
                    self._callback(keys)
            except Exception:  # a watcher must outlive one bad callback or read
                log.exception("coordinator watch callback failed")

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _typed(key: str, build: Callable[[Any], Any], value: Any) -> Any:
    """Build a typed object from a stored dict; a malformed one names its key."""
    try:
        return build(value)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CoordinatorError(f"key {key!r} holds malformed data: {e!r}") from e


class Coordinator(ABC):
    """Table-1 state over a JSON key-value store with a change log (see module docstring)."""

    # ----- backend contract ----------------------------------------------------------------

    @abstractmethod
    def put(self, key: str, value: Any) -> None:
        """Store a JSON value under ``key`` (creating or replacing it)."""

    @abstractmethod
    def create(self, key: str, value: Any) -> bool:
        """Store ``value`` only if ``key`` is absent; False if it exists (atomic)."""

    @abstractmethod
    def get(self, key: str) -> Any:
        """The value under ``key``, or None if absent."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key`` and every key under ``key/``; absent keys are fine."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys under ``prefix/`` at any depth (all keys for ``""``), not ``prefix``."""

    @abstractmethod
    def version(self) -> int:
        """Version of the latest change (0 for a store never written)."""

    @abstractmethod
    def changes_since(self, version: int) -> tuple[int, list[str]]:
        """(current version, keys changed after ``version``, oldest change first)."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection."""

    def watch(self, callback: Callable[[list[str]], None], interval: float = 0.05) -> Watch:
        """Call ``callback(keys)`` from a thread for changes after now; ``.stop()`` ends it."""
        return Watch(self, callback, interval)

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _get_typed(self, key: str, build: Callable[[Any], Any]) -> Any:
        value = self.get(key)
        return None if value is None else _typed(key, build, value)

    def _child_names(self, prefix: str) -> list[str]:
        """Last segments of the direct children of ``prefix`` (values are not read)."""
        start = len(prefix) + 1
        return [key[start:] for key in self.list(prefix) if "/" not in key[start:]]

    def _children(self, prefix: str) -> dict[str, Any]:
        """Direct children of ``prefix``: last segment -> value (skips vanished keys)."""
        out = {}
        for name in self._child_names(prefix):
            value = self.get(f"{prefix}/{name}")
            if value is not None:
                out[name] = value
        return out

    # ----- logical and physical topology ---------------------------------------------------

    def put_topology(self, topology: Topology) -> None:
        self.put(f"topology/{topology.name}", topology.to_dict())

    def get_topology(self, name: str) -> Topology | None:
        return self._get_typed(f"topology/{name}", Topology.from_dict)

    def topology_names(self) -> list[str]:
        return self._child_names("topology")

    def put_physical(self, physical: PhysicalTopology) -> None:
        self.put(f"physical/{physical.name}", physical.to_dict())

    def get_physical(self, name: str) -> PhysicalTopology | None:
        return self._get_typed(f"physical/{name}", PhysicalTopology.from_dict)

    def physical_names(self) -> list[str]:
        return self._child_names("physical")

    def delete_application(self, name: str) -> None:
        """Physical first: readers that see it vanish stop workers and remove flows."""
        for kind in ("physical", "topology", "state", "status", "metrics", "report"):
            self.delete(f"{kind}/{name}")
        for app_id in self.app_ids_of(name):  # last: the ID is free once all else is gone
            self.delete(f"appid/{app_id:04x}")

    def claim_app_id(self, app_id: int, name: str) -> str | None:
        """Claim ``app_id`` for ``name`` (atomic); None if it is ours, else its holder's name.

        Two submissions whose names hash to one ID both pass any check made
        before they write; only one ``create`` of the claim succeeds.
        """
        key = f"appid/{app_id:04x}"
        for _ in range(10):
            if self.create(key, name):
                return None
            holder = self.get(key)
            if holder is not None:
                return None if holder == name else str(holder)
        raise CoordinatorError(f"cannot claim {key!r}: it keeps changing under us")

    def app_ids_of(self, name: str) -> list[int]:
        """The application IDs ``name`` holds a claim on (one, or none)."""
        return [int(k, 16) for k, holder in self._children("appid").items() if holder == name]

    # ----- cluster and agents --------------------------------------------------------------

    def put_cluster(self, cluster: Cluster) -> None:
        self.put("cluster", cluster.to_dict())

    def get_cluster(self) -> Cluster | None:
        return self._get_typed("cluster", Cluster.from_dict)

    def put_agent(self, agent: AgentState) -> None:
        self.put(f"agents/{agent.host}", agent.to_dict())

    def get_agent(self, host: str) -> AgentState | None:
        return self._get_typed(f"agents/{host}", AgentState.from_dict)

    def delete_agent(self, host: str) -> None:
        self.delete(f"agents/{host}")

    def agents(self) -> dict[str, AgentState]:
        return {
            host: _typed(f"agents/{host}", AgentState.from_dict, value)
            for host, value in sorted(self._children("agents").items())
        }

    # ----- runtime status, metrics, application state --------------------------------------

    def put_worker_status(self, name: str, status: WorkerStatus) -> None:
        self.put(f"status/{name}/{status.worker_id}", status.to_dict())

    def delete_worker_status(self, name: str, worker_id: int) -> None:
        self.delete(f"status/{name}/{worker_id}")

    def worker_statuses(self, name: str) -> dict[int, WorkerStatus]:
        out = {}
        for wid, value in self._children(f"status/{name}").items():
            status = _typed(f"status/{name}/{wid}", WorkerStatus.from_dict, value)
            out[status.worker_id] = status
        return dict(sorted(out.items()))

    def put_metrics(self, name: str, worker_id: int, metrics: dict[str, Any]) -> None:
        self.put(f"metrics/{name}/{worker_id}", metrics)

    def get_metrics(self, name: str) -> dict[int, dict[str, Any]]:
        out = {}
        for wid, value in self._children(f"metrics/{name}").items():
            if not wid.isdigit() or not isinstance(value, dict):
                raise CoordinatorError(f"key 'metrics/{name}/{wid}' holds malformed metrics")
            out[int(wid)] = value
        return dict(sorted(out.items()))

    def put_worker_report(self, name: str, worker_id: int, doc: dict[str, Any]) -> None:
        self.put(f"report/{name}/{worker_id}", doc)

    def worker_reports(self, name: str) -> dict[int, dict[str, Any]]:
        """What the agents published of the app's ended workers (``report/NAME/WID``)."""
        out = {}
        for wid, value in self._children(f"report/{name}").items():
            if not wid.isdigit() or not isinstance(value, dict):
                raise CoordinatorError(f"key 'report/{name}/{wid}' holds a malformed report")
            out[int(wid)] = value
        return dict(sorted(out.items()))

    def put_result(self, name: str, report: dict[str, Any]) -> None:
        self.put(f"result/{name}", report)

    def get_result(self, name: str) -> dict[str, Any] | None:
        """The stored report of a finished job (also after it was removed)."""
        value = self.get(f"result/{name}")
        if value is not None and not isinstance(value, dict):
            raise CoordinatorError(f"key 'result/{name}' holds malformed data: not a mapping")
        return value

    def put_app_state(self, name: str, state: dict[str, Any]) -> None:
        self.put(f"state/{name}", state)

    def get_app_state(self, name: str) -> dict[str, Any]:
        """The application's state dict; empty if none was written."""
        value = self.get(f"state/{name}")
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise CoordinatorError(f"key 'state/{name}' holds malformed data: not a mapping")
        return value
