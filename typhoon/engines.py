"""Engines other than ``python``: where they live and what they add to a run.

A node with ``engine: spark`` runs its computation outside the worker process
(docs/design.md §7).  The core never imports an engine statically (layering rule): an
engine is a module named in ``typhoon/operators/engine_modules.py``, imported by
name only when a topology uses it.
Such a module provides:

* ``bolt_for(operator: str) -> type[Bolt]``: the bolt the node's workers run
  (framework and I/O layers stay the same; the bolt hands tuples to the engine
  and emits what the engine produces);
* ``plan(topology, physical, workdir) -> (topology, [EngineService])``: the
  processes the engine needs next to the workers (one Spark driver per host),
  and the topology the workers should get (e.g. with state directories filled in).

Whoever launches workers (``tcp_cluster`` for tcp runs, the worker agent for
sdn runs) launches these services the same way, on the named host, waits for
their ``ready_file`` before activating sources, and restarts one that dies
with a non-zero status while the application runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from typhoon.operators.engine_modules import engine_module
from typhoon.topology.model import PhysicalTopology, Topology


@dataclass
class EngineService:
    """A process an engine needs on one host while the application runs."""

    name: str  # unique within the run, e.g. "spark-driver-h1"
    host: str
    argv: list[str]
    nodes: list[str] = field(default_factory=list)  # the nodes it serves
    # the service creates this file once it serves its nodes; sources are activated after that
    ready_file: str = ""


def plan_engines(
    topology: Topology, physical: PhysicalTopology, workdir: Path
) -> tuple[Topology, list[EngineService]]:
    """Let every engine the topology uses add its services and fill in its nodes."""
    services: list[EngineService] = []
    for engine in sorted({n.engine for n in topology.nodes.values()} - {"python"}):
        topology, more = engine_module(engine).plan(topology, physical, Path(workdir))
        services.extend(more)
    return topology, services
