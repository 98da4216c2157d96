"""What the controller knows, read fresh from the coordinator (it keeps no state of its own).

A :class:`ClusterView` is a snapshot of paper Table 1 plus worker statuses:
from it the controller derives the rules every bridge must hold, which
worker sits behind a switch port, and whether an application may start.
Pure Python: unit-tested without Ryu or a switch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.rules.flows import RuleSpec, compile_default_rules, compile_rules
from typhoon.cluster import Cluster
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment


@dataclass
class AppView:
    topology: Topology
    physical: PhysicalTopology
    statuses: dict[int, Any] = field(default_factory=dict)  # worker id -> WorkerStatus
    state: dict[str, Any] = field(default_factory=dict)

    def all_attached(self) -> bool:
        """Every worker of the physical topology has its port on the bridge."""
        return all(
            (s := self.statuses.get(w.worker_id)) is not None and s.state in ("attached", "running")
            for w in self.physical.workers
        )

    def worker_summary(self, w: WorkerAssignment) -> dict[str, Any]:
        """Who and where a worker is, and its agent's last word (REST and the dashboard)."""
        status = self.statuses.get(w.worker_id)
        return {
            "worker": w.worker_id,
            "node": w.node,
            "index": w.index,
            "host": w.host,
            "port": w.port,
            "state": status.state if status else "unknown",
            "role": w.state,
        }

    def spout_workers(self) -> list[int]:
        spouts = {n.name for n in self.topology.spouts()}
        return [w.worker_id for w in self.physical.workers if w.node in spouts]


# Changes that leave the view and the rules as they are: the workers' published reports,
# the finished jobs' reports and the live debugger's record batches (several per second).
# Every other change (metrics too) keeps re-reading the view, reconciling and re-pushing
# budgets, as the core always did.
QUIET_PREFIXES = ("report/", "result/", "debugrec/")


def rereads_view(key: str) -> bool:
    """Does a change of ``key`` make the core re-read the view (``QUIET_PREFIXES`` do not)?"""
    return not key.startswith(QUIET_PREFIXES)


@dataclass
class ClusterView:
    cluster: Cluster
    apps: dict[str, AppView]
    problems: dict[str, str] = field(default_factory=dict)  # app -> why its rules are missing

    @classmethod
    def read(cls, coordinator: Any) -> ClusterView:
        """Snapshot the coordinator; apps without a physical topology are not deployed."""
        apps = {}
        for name in coordinator.topology_names():
            topo = coordinator.get_topology(name)
            phys = coordinator.get_physical(name)
            if topo is None or phys is None:
                continue
            apps[name] = AppView(
                topo,
                phys,
                coordinator.worker_statuses(name),
                coordinator.get_app_state(name) or {},
            )
        return cls(coordinator.get_cluster() or Cluster(), apps)

    def desired(
        self, extra: dict[str, frozenset[RuleSpec]] | None = None
    ) -> dict[str, frozenset[RuleSpec]]:
        """Every host bridge's complete rule set: default, each app's, and app extras."""
        out: dict[str, set[RuleSpec]] = {
            h: set(compile_default_rules()) for h in self.cluster.hosts
        }
        self.problems = {}
        for name, app in self.apps.items():
            try:
                compiled = compile_rules(app.topology, app.physical, self.cluster)
            except ValueError as e:
                # one broken application must not keep the others from their rules
                self.problems[name] = str(e)
                continue
            for host, rules in compiled.items():
                out.setdefault(host, set(compile_default_rules())).update(rules)
        for host, rules in (extra or {}).items():
            # an app's rule replaces the compiled rule with the same match (a mirror adds
            # an output to a data rule): two rules with one key would be ambiguous
            keys = {r.key for r in rules}
            kept = {
                r for r in out.setdefault(host, set(compile_default_rules())) if r.key not in keys
            }
            out[host] = kept | set(rules)
        return {h: frozenset(r) for h, r in out.items()}

    def host_of_dpid(self, dpid: int) -> str | None:
        h = self.cluster.by_dpid(dpid)
        return h.name if h else None

    def worker_at(self, host: str, port: int) -> tuple[str, WorkerAssignment] | None:
        for name, app in self.apps.items():
            for w in app.physical.workers:
                if w.host == host and w.port == port:
                    return name, w
        return None

    def app_by_id(self, app_id: int) -> str | None:
        for name, app in self.apps.items():
            if app.physical.app_id == app_id:
                return name
        return None
