"""Every key of a topology's ``config`` (and of a node's), declared once.

Each key is a field of :class:`TopologyConfig` (or :class:`NodeConfig`,
:class:`LocalityConfig`) with its type, its default and a one-line doc.  The schema the
loader checks files against (``typhoon/topology/schema.py``), the defaults the readers
fall back to and the table in ``docs/topology.md`` are derived from these classes, so a
new key is added here and nowhere else (``tests/unit/test_topology_config_table.py``
fails when the docs table differs).  ``spark.*`` keys go to the Spark engine as they are.

This module imports nothing above the topology package, so the modules that read a
setting (checkpoint, locality, reconfig, runtime) can import their defaults from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .batching import DEFAULTS as BATCHING
from .batching import LEGACY_KEYS as BATCHING_LEGACY
from .batching import SCHEMA as BATCHING_SCHEMA
from .batching import Batching

GUARANTEES = ("none", "at_least_once", "exactly_once")
FAILOVERS = ("region", "global")
PLACEMENTS = ("packed", "spread")
SPARK_PREFIX = r"^spark\."  # keys passed to the Spark engine unchecked


def setting(default: Any, doc: str, schema: Mapping[str, Any], nested: type | None = None) -> Any:
    """One declared key: its default, a one-line doc and its JSON schema; ``nested``: the
    declaration of the keys of a mapping-valued setting."""
    return field(default=default, metadata={"doc": doc, "schema": dict(schema), "nested": nested})


def _batching(name: str) -> Any:
    f = {f.name: f for f in dataclasses.fields(Batching)}[name]
    return setting(getattr(BATCHING, name), f.metadata["doc"], BATCHING_SCHEMA[name])


@dataclass(frozen=True)
class LocalityConfig:
    """``config: {locality: ...}``: key-pair statistics (typhoon/locality/settings.py)."""

    pairs: int = setting(1000, "SpaceSaving capacity", {"type": "integer", "minimum": 1})
    sample: int = setting(
        10, "one input tuple in `sample` is counted", {"type": "integer", "minimum": 1}
    )
    top: int = setting(200, "pairs reported per METRIC_RESP", {"type": "integer", "minimum": 1})


@dataclass(frozen=True)
class SdnConfig:
    """``config: {sdn: ...}``: the sdn transport's links (docs/flow_control.md)."""

    window: int = setting(
        128, "frames in flight per link (typhoon/runtime/links)", {"type": "integer", "minimum": 1}
    )
    window_bytes: int = setting(
        512 * 1024,
        "frame bytes in flight per balanced stream, and the least per link; 0: frames only",
        {"type": "integer", "minimum": 0},
    )
    window_bytes_max: int = setting(
        3 * 1024 * 1024,
        "the most frame bytes in flight per link (a fast receiver's window), 0: window_bytes",
        {"type": "integer", "minimum": 0},
    )
    port_budget: int | None = setting(
        None,
        "bytes a worker may have queued at the switch, 0: none (default: planned)",
        {"type": "integer", "minimum": 0},
    )
    credit_timeout_s: float = setting(
        10.0,
        "s a receiver may stay silent before it counts as dead",
        {"type": "number", "exclusiveMinimum": 0},
    )
    mtu: int | None = setting(
        None,
        "frame size; only lowers the fabric's (default: the fabric's, at most 64000)",
        {"type": "integer", "minimum": 1},
    )
    control_priority: bool = setting(
        True, "urgent control tuples overtake queued data", {"type": "boolean"}
    )


@dataclass(frozen=True)
class TcpConfig:
    """``config: {tcp: ...}``: the tcp transport's framing (docs/performance.md)."""

    mtu: int | None = setting(
        None,
        "frame size; a tcp stream has no path MTU (default: the sdn workers' 64000)",
        {"type": "integer", "minimum": 64, "maximum": 65535},
    )


_GROUPS = {"type": "integer", "minimum": 1, "maximum": 65536}
_STEP = {"type": "integer", "minimum": 0, "maximum": 65536}


@dataclass(frozen=True)
class TopologyConfig:
    """A topology's ``config``: every key the code reads, with its default."""

    batch_size: int = _batching("batch_size")
    max_delay_ms: float = _batching("max_delay_ms")
    sdn: SdnConfig | None = setting(
        None,
        "the sdn transport's link settings (defaults below)",
        {"type": ["object", "null"], "additionalProperties": False},
        nested=SdnConfig,
    )
    tcp: TcpConfig | None = setting(
        None,
        "the tcp transport's settings (defaults below)",
        {"type": ["object", "null"], "additionalProperties": False},
        nested=TcpConfig,
    )
    flow_control: bool = setting(
        True, "credit-based flow control between workers", {"type": "boolean"}
    )
    output_dir: str | None = setting(
        None,
        "a directory for the topology's own operators; no built-in reads it",
        {"type": "string"},
    )
    guarantee: str = setting(
        "none", "processing guarantee", {"type": "string", "enum": list(GUARANTEES)}
    )
    checkpoint_interval_ms: float = setting(
        1000.0, "ms between checkpoints", {"type": "number", "exclusiveMinimum": 0}
    )
    checkpoint_store: str = setting(
        "file:///var/tmp/typhoon/checkpoints",
        "URL of the checkpoint store",
        {"type": "string", "minLength": 1},
    )
    partial_rollback: bool = setting(
        False,
        "roll back the failed workers and their downstream only (docs/guarantees.md)",
        {"type": "boolean"},
    )
    failover: str = setting(
        "region",
        "a failure rolls back its failover regions, or the whole job",
        {"type": "string", "enum": list(FAILOVERS)},
    )
    upstream_backup_mb: float = setting(
        64.0,
        "MiB of output buffers per worker for partial rollback",
        {"type": "number", "minimum": 0},
    )
    placement: str = setting(
        "packed",
        "packed: fill hosts in topological order; spread: worker i on host i mod H",
        {"type": "string", "enum": list(PLACEMENTS)},
    )
    max_parallelism: int = setting(
        128, "key groups of every key-routed node without its own", _GROUPS
    )
    migration_step: int = setting(
        4, "key groups per round of a rescale's migration, 0: all at once", _STEP
    )
    chaining: bool = setting(
        True,
        "run `forward` edges' chains in one worker process (docs/topology.md, Chaining)",
        {"type": "boolean"},
    )
    locality: LocalityConfig | None = setting(
        None,
        "key-pair statistics for locality-aware routing (off when absent)",
        {"type": "object", "additionalProperties": False},
        nested=LocalityConfig,
    )

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> TopologyConfig:
        """The declared keys of ``config`` over the defaults (``spark.*`` and the older
        ``max_delay`` are read elsewhere); the values are not checked again here."""
        config = dict(config or {})
        config.update(dataclasses.asdict(Batching.of(config)))
        given = {k: config[k] for k in TOPOLOGY_KEYS if k in config}
        for f in dataclasses.fields(cls):
            if f.metadata["nested"] and isinstance(given.get(f.name), Mapping):
                given[f.name] = f.metadata["nested"](**given[f.name])
        return cls(**given)


@dataclass(frozen=True)
class NodeConfig:
    """A node's own ``config``: it goes over the topology's for that node."""

    max_parallelism: int | None = setting(
        None, "this node's key groups (default: the topology's)", _GROUPS
    )
    migration_step: int | None = setting(
        None, "this node's key groups per migration round (default: the topology's)", _STEP
    )
    chaining: bool | None = setting(
        None,
        "false: this node is chained to neither neighbour (default: the topology's)",
        {"type": "boolean"},
    )


def keys_of(cls: type) -> tuple[str, ...]:
    """The keys a declaration holds, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls))


TOPOLOGY_KEYS = keys_of(TopologyConfig)
NODE_KEYS = keys_of(NodeConfig)
DEFAULTS = TopologyConfig()
LOCALITY_DEFAULTS = LocalityConfig()
SDN_DEFAULTS = SdnConfig()
TCP_DEFAULTS = TcpConfig()


def schema_properties(cls: type) -> dict[str, dict[str, Any]]:
    """The JSON-schema ``properties`` of a declaration's keys."""
    properties = {}
    for f in dataclasses.fields(cls):
        properties[f.name] = dict(f.metadata["schema"])
        if f.metadata["nested"]:
            properties[f.name]["properties"] = schema_properties(f.metadata["nested"])
    if cls is TopologyConfig:
        properties.update({old: BATCHING_SCHEMA[old] for old in BATCHING_LEGACY})
    return properties


def config_schema(cls: type) -> dict[str, Any]:
    """The schema of a ``config`` mapping holding ``cls``'s keys and nothing else."""
    schema: dict[str, Any] = {
        "type": ["object", "null"],
        "additionalProperties": False,
        "properties": schema_properties(cls),
    }
    if cls is TopologyConfig:
        schema["patternProperties"] = {SPARK_PREFIX: {}}
    return schema
