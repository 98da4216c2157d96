"""Topologies: the YAML file a user writes, the checked model, and worker placement."""

from .loader import TopologyError, load_topology, load_topology_text
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
from .schema import expand_environment

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
