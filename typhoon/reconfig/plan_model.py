"""What a stable update's plan is: its steps (``typhoon.reconfig.plan`` computes them,
``controller/reconfigure.py`` runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from typhoon.reconfig.requests import Request, describe
from typhoon.topology.model import PhysicalTopology, Topology

ACTIONS = (
    "keep_rules",  # the old rules stay installed until drop_rules
    "write",  # new logical topology + transition physical topology to the coordinator
    "wait_attached",  # agents launched the new workers and attached their ports
    "wait_rules",  # the controller compiled the written version and every switch holds it
    "control",  # control tuples to workers, each acked (or the worker exited cleanly)
    "commit",  # the point of no return
    "drain",  # DRAIN, acked or exited cleanly
    "write_final",  # the physical topology without the drained workers
    "wait_stopped",  # no agent supervises the drained workers any more
    "drop_rules",  # only the new topology's rules stay
)

Bodies = list[tuple[int, dict[str, Any]]]  # (worker, control tuple body without "version")


@dataclass
class Step:
    action: str  # one of ACTIONS
    what: str  # one sentence, for the status report
    workers: list[int] = field(default_factory=list)
    control: str = ""  # control type of a "control" step
    bodies: Bodies = field(default_factory=list)
    # "write" / "keep_rules" of another state than the plan's (its new one / its old one):
    # a route or insert on a chained edge first unchains it (typhoon.reconfig.chains)
    topology: Topology | None = None
    physical: PhysicalTopology | None = None


def _control(what: str, ctype: str, bodies: Bodies) -> Step:
    return Step("control", what, sorted({w for w, _ in bodies}), ctype, bodies)


@dataclass
class Plan:
    request: Request
    old_topology: Topology
    old_physical: PhysicalTopology
    topology: Topology  # the new logical topology
    physical: PhysicalTopology  # during the update: new workers plus draining ones
    final: PhysicalTopology  # after it
    added: list[int]
    removed: list[int]
    steps: list[Step]

    def summary(self) -> str:
        return (
            f"{describe(self.request)}: +{len(self.added)} -{len(self.removed)} workers, "
            f"{len(self.steps)} steps"
        )
