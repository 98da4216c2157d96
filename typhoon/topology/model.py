"""Logical and physical topology: the state the coordinator holds (paper Table 1).

Pure data.  The loader (``loader.py``) builds a :class:`Topology` from a YAML
file; the scheduler (``scheduler.py``) turns it into a :class:`PhysicalTopology`;
``routing_table`` says what each worker's framework layer routes to.
Everything here round-trips through plain dicts (``to_dict``/``from_dict``) so
it can be stored in SQLite or ZooKeeper as JSON and handed to worker processes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GROUPINGS = (
    "shuffle", "fields", "all", "global", "direct", "local_or_shuffle", "sdn", "forward",
)  # fmt: skip
ENGINES = ("python", "spark")
DEFAULT_STREAM = "default"


@dataclass(frozen=True)
class Grouping:
    """How a stream spreads tuples over the receiving node's workers."""

    type: str
    fields: tuple[str, ...] = ()
    # direct grouping: key value (as str) -> receiving worker index (0-based)
    table: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "fields": list(self.fields), "table": dict(self.table)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Grouping:
        return cls(d["type"], tuple(d.get("fields", ())), dict(d.get("table", {})))


@dataclass
class Node:
    """A spout or bolt of the logical topology."""

    name: str
    kind: str  # "spout" | "bolt"
    operator: str  # built-in name or "module:Class"
    args: dict[str, Any] = field(default_factory=dict)
    parallelism: int = 1
    engine: str = "python"
    stateful: bool = False
    output_fields: tuple[str, ...] = ()
    line: int = 0  # line in the YAML file, for error messages
    config: dict[str, Any] = field(default_factory=dict)  # per-node settings (max_parallelism)
    # the operator keeps keyed state (Operator.keyed): its input must be key-routed, and a
    # rescale moves its key groups with their state instead of flushing (typhoon.topology.keygroups)
    keyed: bool = False
    # a spout's event-time watermark settings (typhoon.runtime.watermarks.WatermarkSpec)
    watermark: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["output_fields"] = list(self.output_fields)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Node:
        d = dict(d)
        d["output_fields"] = tuple(d.get("output_fields", ()))
        return cls(**d)


@dataclass
class Stream:
    """An edge of the logical topology: ``src`` node's output stream to ``dst``.

    ``id`` is the numeric stream ID carried in every frame header; it is unique
    within a topology (assigned in file order, from 1).
    """

    id: int
    src: str
    dst: str
    grouping: Grouping
    name: str = DEFAULT_STREAM  # the src node's output stream name
    line: int = 0
    # the rows' declared layout, field -> type in field order (docs/topology.md "columns"):
    # the sender packs column blocks (typhoon/wire/columns.py); empty: msgpack row batches
    columns: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "id": self.id,
            "src": self.src,
            "dst": self.dst,
            "grouping": self.grouping.to_dict(),
            "name": self.name,
            "line": self.line,
        }
        if self.columns:
            d["columns"] = dict(self.columns)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Stream:
        return cls(
            d["id"],
            d["src"],
            d["dst"],
            Grouping.from_dict(d["grouping"]),
            d["name"],
            d["line"],
            dict(d.get("columns") or {}),
        )


@dataclass
class Topology:
    """The logical topology: nodes in file order and the streams between them."""

    name: str
    nodes: dict[str, Node]
    streams: list[Stream]
    config: dict[str, Any] = field(default_factory=dict)
    source_file: str = ""

    def spouts(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "spout"]

    def inputs_of(self, node: str) -> list[Stream]:
        return [s for s in self.streams if s.dst == node]

    def outputs_of(self, node: str) -> list[Stream]:
        return [s for s in self.streams if s.src == node]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nodes": [n.to_dict() for n in self.nodes.values()],
            "streams": [s.to_dict() for s in self.streams],
            "config": self.config,
            "source_file": self.source_file,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Topology:
        nodes = [Node.from_dict(n) for n in d["nodes"]]
        return cls(
            d["name"],
            {n.name: n for n in nodes},
            [Stream.from_dict(s) for s in d["streams"]],
            dict(d.get("config", {})),
            d.get("source_file", ""),
        )


WORKER_STATES = ("active", "draining")


@dataclass(frozen=True)
class WorkerAssignment:
    """One physical worker: where it runs and how the network knows it.

    ``state`` is ``draining`` while a reconfiguration removes the worker: it keeps
    its process and its flow rules so what is in flight reaches it, but no route
    sends to it and new workers do not wait for its end of stream.
    """

    worker_id: int  # unique within the application, 1..0xFFFE
    node: str
    index: int  # 0-based index among its node's workers
    host: str
    port: int  # OpenFlow port on the host bridge (sdn) / 0 (tcp)
    state: str = "active"

    def __post_init__(self) -> None:
        if self.state not in WORKER_STATES:
            raise ValueError(f"worker state must be one of {WORKER_STATES}, not {self.state!r}")

    @property
    def active(self) -> bool:
        return self.state == "active"

    def placement(self) -> tuple[int, str, int, str, int]:
        """Everything but the state: what an agent must restart the worker for if it changes."""
        return (self.worker_id, self.node, self.index, self.host, self.port)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerAssignment:
        return cls(**d)


@dataclass
class PhysicalTopology:
    """Per-worker assignment of one application (paper Table 1, row 2)."""

    name: str
    app_id: int  # 16-bit application prefix of worker addresses
    workers: list[WorkerAssignment]
    version: int = 1
    # guaranteed processing: workers started from this version begin in ``generation`` from
    # the global checkpoint ``restore_epoch`` (None: the start); 0 = no recovery yet
    generation: int = 0
    restore_epoch: int | None = None
    # node -> worker index per key group (typhoon.topology.keygroups); a node not listed
    # uses the default table for its active workers
    key_groups: dict[str, list[int]] = field(default_factory=dict)
    # region failover (typhoon.checkpoint.regions): worker -> (generation, epoch) of its
    # failover region when the regions are in different ones; empty: all in ``generation``
    worker_generations: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    # live unchaining (typhoon.topology.chaining): chained workers whose input from the
    # previous worker of their process goes over the network instead of a function call
    unchained: list[int] = field(default_factory=list)
    # worker groups (head first) that keep sharing one process although the topology no
    # longer chains all of them: a route or insert on a chained edge unchains it live and
    # keeps the process (typhoon.reconfig.chains); their split edges are in ``unchained``
    kept_chains: list[list[int]] = field(default_factory=list)

    def generation_of(self, worker_id: int) -> tuple[int, int | None]:
        """The generation ``worker_id`` is in and the epoch it restored to begin it."""
        return self.worker_generations.get(worker_id, (self.generation, self.restore_epoch))

    def of_node(self, node: str) -> list[WorkerAssignment]:
        """Every worker of ``node`` (draining ones too: they keep their rules), by index."""
        return sorted((w for w in self.workers if w.node == node), key=lambda w: w.index)

    def active_of_node(self, node: str) -> list[WorkerAssignment]:
        """The workers of ``node`` that routes send to, by index."""
        return [w for w in self.of_node(node) if w.active]

    def draining(self) -> list[WorkerAssignment]:
        return [w for w in self.workers if not w.active]

    def by_id(self, worker_id: int) -> WorkerAssignment:
        for w in self.workers:
            if w.worker_id == worker_id:
                return w
        raise KeyError(worker_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "app_id": self.app_id,
            "workers": [w.to_dict() for w in self.workers],
            "version": self.version,
            "generation": self.generation,
            "restore_epoch": self.restore_epoch,
            "key_groups": {n: list(t) for n, t in self.key_groups.items()},
            "worker_generations": {
                str(w): [g, e] for w, (g, e) in sorted(self.worker_generations.items())
            },
            **({"unchained": sorted(self.unchained)} if self.unchained else {}),
            **({"kept_chains": [list(g) for g in self.kept_chains]} if self.kept_chains else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PhysicalTopology:
        return cls(
            d["name"],
            d["app_id"],
            [WorkerAssignment.from_dict(w) for w in d["workers"]],
            d.get("version", 1),
            d.get("generation", 0),
            d.get("restore_epoch"),
            {n: list(t) for n, t in (d.get("key_groups") or {}).items()},
            {int(w): (g, e) for w, (g, e) in (d.get("worker_generations") or {}).items()},
            sorted(int(w) for w in d.get("unchained") or ()),
            [[int(w) for w in g] for g in d.get("kept_chains") or ()],
        )
