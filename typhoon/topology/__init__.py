"""Topologies: the YAML file a user writes, the checked model, and worker placement.

The loader (YAML, the schema, the operator registry) is imported on first use:
a worker imports ``typhoon.topology.model`` and ``.config`` but never loads a
file, and importing this package must not cost it the loader.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .model import (
    DEFAULT_STREAM,
    ENGINES,
    GROUPINGS,
    Grouping,
    Node,
    PhysicalTopology,
    Stream,
    Topology,
    WorkerAssignment,
)
from .scheduler import app_id_for, reschedule, schedule, topological_order

if TYPE_CHECKING:
    from .loader import TopologyError, load_topology, load_topology_text
    from .schema import expand_environment

# name -> the submodule that defines it, imported when the name is first asked for
_LAZY = {
    "TopologyError": "loader",
    "load_topology": "loader",
    "load_topology_text": "loader",
    "expand_environment": "schema",
}

__all__ = [
    "DEFAULT_STREAM",
    "ENGINES",
    "GROUPINGS",
    "Grouping",
    "Node",
    "PhysicalTopology",
    "Stream",
    "Topology",
    "TopologyError",
    "WorkerAssignment",
    "app_id_for",
    "expand_environment",
    "load_topology",
    "load_topology_text",
    "reschedule",
    "schedule",
    "topological_order",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
