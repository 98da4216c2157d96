"""The streaming manager (paper Fig. 3): admits applications and places their workers.

``submit`` turns a logical topology into a physical one on the cluster found in
the coordinator and writes both; agents and the controller react to the
physical topology.  ``kill`` deletes the physical topology first, so agents
stop the workers and the controller removes the flows, then everything else.
``plan`` is the dynamic topology manager's entry (reconfiguration): it turns
a request into the steps of a stable update (``typhoon.reconfig``), which the
controller runs; ``update_physical`` writes each new version of a running
application's workers.

Ports: the scheduler takes one first port for every host.  The manager starts
at the largest ``first_worker_port`` of the hosts (ports below a host's value
are its fabric and tunnel ports, so a smaller start could collide there) and
moves up until no worker lands on a port that another application, or a
worker still draining on an agent, holds on that host.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field

from typhoon.checkpoint import CheckpointError, checkpoint_settings, guarantee_of, open_store
from typhoon.cluster import Cluster
from typhoon.coordinator import Coordinator, WorkerStatus
from typhoon.reconfig import Plan, ReconfigError, Request, plan
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.topology.scheduler import app_id_for, schedule

MAX_OFPORT = 0xFEFF  # highest port number OVS assigns on request (ofport_request)


class ManagerError(Exception):
    """A request the manager refuses; the message says why and what to do."""


@dataclass
class Application:
    """Everything the coordinator knows about one application."""

    topology: Topology
    physical: PhysicalTopology | None
    state: dict = field(default_factory=dict)
    statuses: dict[int, WorkerStatus] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.topology.name


@dataclass
class Placement:
    """Inputs of ``reschedule`` for new workers of a running application."""

    hosts: list[str]
    first_port: int
    avoid: set[tuple[str, int]]
    min_id: int  # above every worker ID the application ever used


class Manager:
    """Admission, scheduling and removal of applications, over a coordinator."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    # ----- queries -------------------------------------------------------------------------

    def list(self) -> list[str]:
        """Names of the submitted applications."""
        return self.coordinator.topology_names()

    def get(self, name: str) -> Application:
        c = self.coordinator
        topology = c.get_topology(name)
        if topology is None:
            raise ManagerError(f"no application named '{name}'")
        return Application(
            topology, c.get_physical(name), c.get_app_state(name), c.worker_statuses(name)
        )

    # ----- submit and kill -----------------------------------------------------------------

    def submit(self, topology: Topology, remove_when_done: bool = False) -> PhysicalTopology:
        """Schedule ``topology`` and write it (logical, state, then physical).

        ``remove_when_done``: the controller removes the job once it has finished and
        its report is stored (``typhoon/job_report.py``)."""
        c = self.coordinator
        name = topology.name
        if name in c.topology_names() or name in c.physical_names():
            raise ManagerError(f"application '{name}' is already running; kill it first")
        draining = [h for h, a in c.agents().items() if name in a.workers]
        if draining:
            raise ManagerError(
                f"workers of a previous '{name}' are still stopping on {', '.join(draining)}; "
                "try again in a few seconds"
            )
        fresh_checkpoints(topology)
        cluster = self._cluster()
        app_id = app_id_for(name)
        for other in c.physical_names():
            physical = c.get_physical(other)
            if physical is not None and physical.app_id == app_id:
                raise ManagerError(
                    f"application ID {app_id:#06x} of '{name}' is already used by '{other}'; "
                    "rename the topology"
                )
        physical = self._place(topology, cluster, app_id)
        if not c.create(f"topology/{name}", topology.to_dict()):
            raise ManagerError(f"application '{name}' is already running; kill it first")
        holder = c.claim_app_id(app_id, name)  # the check above raced with other submissions
        if holder is not None:
            c.delete(f"topology/{name}")
            raise ManagerError(
                f"application ID {app_id:#06x} of '{name}' is already used by '{holder}'; "
                "rename the topology"
            )
        # a previous job of this name: its stored report and published worker reports go
        c.delete(f"result/{name}")
        c.delete(f"report/{name}")
        # fresh state: "active" is the controller's to set, once it has ACTIVATEd the spouts
        extra = {"remove_when_done": True} if remove_when_done else {}
        c.put_app_state(name, {"submitted": time.time(), **extra})
        c.put_physical(physical)
        return physical

    def kill(self, name: str) -> None:
        """Remove ``name``: physical topology first (workers, flows), then the rest."""
        c = self.coordinator
        known = c.topology_names() + c.physical_names()
        if name not in known and not c.app_ids_of(name):  # a claim left by a failed kill
            raise ManagerError(f"no application named '{name}'")
        c.delete_application(name)  # deletes physical/NAME first

    def wait_stopped(self, name: str, timeout: float = 30.0, interval: float = 0.1) -> bool:
        """Wait until no agent supervises a worker of ``name``; False on timeout."""
        deadline = time.monotonic() + timeout
        while any(name in a.workers for a in self.coordinator.agents().values()):
            if time.monotonic() > deadline:
                return False
            time.sleep(interval)
        return True

    # ----- reconfiguration -----------------------------------------------------------------

    def update_physical(self, name: str, new: PhysicalTopology) -> PhysicalTopology:
        """Write a new version of a running application's physical topology.

        The application ID stays (it is in every worker's address); the version
        must grow so readers can tell the update from the deployment it replaces.
        """
        old = self.coordinator.get_physical(name)
        if old is None:
            raise ManagerError(f"no running application named '{name}'")
        if new.name != name or new.app_id != old.app_id:
            raise ManagerError(
                f"an update of '{name}' must keep its name and application ID {old.app_id:#06x}"
            )
        if new.version <= old.version:
            raise ManagerError(
                f"new physical topology of '{name}' has version {new.version}, "
                f"not above the current {old.version}"
            )
        hosts = self._cluster().hosts
        taken = self._ports_in_use(exclude=name)
        for w in new.workers:
            if w.host not in hosts:
                raise ManagerError(f"worker {w.worker_id} is placed on unknown host '{w.host}'")
            if (w.host, w.port) in taken:
                raise ManagerError(
                    f"worker {w.worker_id}: port {w.port} on {w.host} belongs to another "
                    "application"
                )
        self.coordinator.put_physical(new)
        state = self.coordinator.get_app_state(name)
        top = max((w.worker_id for w in new.workers), default=0)
        if top > int(state.get("max_worker_id", 0)):  # IDs are never reused (see plan)
            self.coordinator.put_app_state(name, {**state, "max_worker_id": top})
        return new

    def plan(
        self,
        name: str,
        request: Request,
        allow_imports: bool = False,
        reserved: Collection[tuple[str, int]] = (),
    ) -> Plan:
        """The stable-update plan of ``request`` for the running application ``name``.

        Pure planning (``typhoon.reconfig``) on what the coordinator holds now;
        nothing is written.  ``reserved`` (host, port) are also kept free: the
        new ports of other applications' updates that are planned but not
        written yet.  ReconfigError says why a request cannot be done.
        """
        c = self.coordinator
        topology, physical = c.get_topology(name), c.get_physical(name)
        if topology is None or physical is None:
            raise ReconfigError(f"no running application named '{name}'", 404)
        if not c.get_app_state(name).get("active"):
            raise ReconfigError(f"'{name}' is not active yet; try again once it runs", 409)
        statuses = c.worker_statuses(name)
        exited = {w for w, s in statuses.items() if s.state == "exited"}
        state = c.get_app_state(name)
        used = max([*statuses, int(state.get("max_worker_id", 0))], default=0)
        try:
            cluster = self._cluster()
        except ManagerError as e:
            raise ReconfigError(str(e), 409) from None
        first_port = max(h.first_worker_port for h in cluster.hosts.values())
        return plan(
            request,
            topology,
            physical,
            cluster.host_names(),
            first_port,
            avoid=self._ports_in_use(exclude=name) | set(reserved),
            exited=exited,
            allow_imports=allow_imports,
            min_id=used + 1,
        )

    def placement(self, name: str) -> Placement:
        """Where new workers of ``name`` may go now (the fault detector's replacements)."""
        c = self.coordinator
        state = c.get_app_state(name)
        used = max([*c.worker_statuses(name), int(state.get("max_worker_id", 0))], default=0)
        physical = c.get_physical(name)
        if physical is not None:
            used = max([used, *(w.worker_id for w in physical.workers)])
        cluster = self._cluster()
        return Placement(
            cluster.host_names(),
            max(h.first_worker_port for h in cluster.hosts.values()),
            self._ports_in_use(exclude=name),
            used + 1,
        )

    # ----- placement -----------------------------------------------------------------------

    def _cluster(self) -> Cluster:
        cluster = self.coordinator.get_cluster()
        if cluster is None or not cluster.hosts:
            raise ManagerError("the coordinator holds no cluster: write one (put_cluster) first")
        return cluster

    def _ports_in_use(self, exclude: str = "") -> set[tuple[str, int]]:
        """(host, port) held by other applications' workers or still in use on an agent.

        Ports of ``exclude``'s current workers are free for its own update; an
        agent's port outside them may be a removed worker still draining.
        """
        c = self.coordinator
        own: set[tuple[str, int]] = set()
        taken: set[tuple[str, int]] = set()
        for other in c.physical_names():
            physical = c.get_physical(other)
            if physical is not None:
                ports = {(w.host, w.port) for w in physical.workers}
                if other == exclude:
                    own = ports
                else:
                    taken |= ports
        for host, agent in c.agents().items():
            taken |= {(host, p) for p in agent.used_ports} - own
        return taken

    def _place(self, topology: Topology, cluster: Cluster, app_id: int) -> PhysicalTopology:
        hosts = cluster.host_names()
        taken = self._ports_in_use()
        first_port = max(h.first_worker_port for h in cluster.hosts.values())
        while True:
            physical = schedule(topology, hosts, app_id, first_port=first_port)
            clashes = [w.port for w in physical.workers if (w.host, w.port) in taken]
            if not clashes:
                break
            first_port = max(clashes) + 1
        top = max((w.port for w in physical.workers), default=first_port)
        if top > MAX_OFPORT:
            raise ManagerError(f"no free switch ports left for '{topology.name}' (needs {top})")
        return physical


def fresh_checkpoints(topology: Topology) -> None:
    """Under a guarantee, a submission starts with an empty checkpoint store for the app
    (an earlier run's epochs must not be restored into this one); a store that cannot
    be used is refused now, in one sentence, rather than at the first failure."""
    if guarantee_of(topology) == "none":
        return
    try:
        open_store(checkpoint_settings(topology).store_url, topology.name).clear()
    except CheckpointError as e:
        raise ManagerError(f"application '{topology.name}': {e}") from None
