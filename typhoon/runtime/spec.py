"""What a worker process is told when it starts (its row of the physical topology)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typhoon.private_files import write_private
from typhoon.topology.batching import DEFAULTS, Batching
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment


@dataclass
class WorkerSpec:
    topology: Topology
    physical: PhysicalTopology
    worker_id: int
    batch_size: int = DEFAULTS.batch_size
    max_delay_ms: float = DEFAULTS.max_delay_ms
    report_dir: str = ""
    # transport name and its parameters, e.g. {"kind": "tcp", "control": ["127.0.0.1", 4000]}
    transport: dict[str, Any] = field(default_factory=dict)

    @property
    def assignment(self) -> WorkerAssignment:
        return self.physical.by_id(self.worker_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topology": self.topology.to_dict(),
            "physical": self.physical.to_dict(),
            "worker_id": self.worker_id,
            "batch_size": self.batch_size,
            "max_delay_ms": self.max_delay_ms,
            "report_dir": self.report_dir,
            "transport": self.transport,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerSpec:
        batching = Batching.of(d)
        return cls(
            Topology.from_dict(d["topology"]),
            PhysicalTopology.from_dict(d["physical"]),
            d["worker_id"],
            batching.batch_size,
            batching.max_delay_ms,
            d.get("report_dir", ""),
            dict(d.get("transport", {})),
        )

    def save(self, path: Path) -> None:
        """Write the spec readable by its owner only (0600, also over an older file): it
        may hold secrets (the tcp engine's run secret, operator arguments)."""
        write_private(path, json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: Path) -> WorkerSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))
