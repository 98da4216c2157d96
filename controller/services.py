"""What control-plane apps may ask of the controller core: events and methods.

Apps in ``apps/`` never read the core's fields (switches, installed groups,
port states, the coordinator, the manager); ``tests/unit/test_services.py``
checks it over their source.  They get :class:`Services` from :func:`services`
(looked up on use: Ryu may start the core after the app) and subscribe to the
events of ``controller/events.py``:

* ``EventWorkerUp`` / ``EventWorkerDown``: a worker's port came up / went away;
* ``EventWorkerMetrics`` / ``EventWorkerAck``: a METRIC_RESP, a confirmed control tuple;
* ``EventSparkMetrics``: a spark node's query progress;
* ``EventTopologyChanged``: an application was submitted, changed or killed.

What the methods do is the core's (``controller/core.py``); this class only
decides what is visible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from controller import ofp
from controller.framework.ryu_compat import lookup_service_brick
from controller.reconfigure import Reconfiguration, Registry
from controller.rules.composer import Source
from controller.rules.groups import GroupSpec
from controller.rules.view import ClusterView
from controller.switch_sync import SwitchSync
from typhoon.checkpoint.progress import JobProgress
from typhoon.coordinator import Coordinator
from typhoon.debug.spec import DebugSpec, all_session_keys, delete_session, put_session
from typhoon.debug.transport import delete_batches, forget_batches, take_batches
from typhoon.manager import Manager
from typhoon.reconfig import Request
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.wire import ControlTuple

__all__ = ["Services", "Source", "services"]

CORE_APP = "TyphoonController"  # the core's Ryu name (controller/core.py)


class CoreState(Protocol):
    """What :class:`Services` reads and calls of the core (``controller/core.py`` has it).

    Declared here, not imported, so that the core and its parts (``core_recovery.py``
    builds services for the fault machine) import this module and not the reverse."""

    @property
    def view(self) -> ClusterView: ...
    @property
    def coordinator(self) -> Coordinator: ...
    @property
    def manager(self) -> Manager: ...
    @property
    def progress(self) -> dict[str, JobProgress]: ...
    @property
    def worker_metrics(self) -> dict[str, dict[int, dict]]: ...
    @property
    def desired_groups(self) -> dict[str, frozenset[GroupSpec]]: ...
    @property
    def sync(self) -> SwitchSync: ...
    @property
    def reconfigs(self) -> Registry: ...

    def send_control(self, app: str, worker_ids: Iterable[int], ct: ControlTuple) -> int: ...
    def next_control_version(self) -> int: ...
    def request_metrics(self, app: str, worker_ids: Iterable[int] | None = None) -> int: ...
    def acked(self, app: str, what: str, version: int) -> set[int]: ...
    def set_rules(self, source: Source, owner: str, value: Any) -> None: ...
    def clear_rules(self, source: Source, owner: str) -> None: ...
    def synced(self) -> bool: ...
    def rules_ready(self, app: str, version: int) -> bool: ...
    def send_to_host(self, host: str, build: Callable[[Any], list[Any]]) -> bool: ...
    def reconfigure(self, app: str, request: Request) -> Reconfiguration: ...


def core_app() -> CoreState:
    """The running core app, looked up on use (Ryu may start it after an app)."""
    app = lookup_service_brick(CORE_APP)
    if app is None:
        raise RuntimeError("the Typhoon controller core is not loaded")
    return app


class Services:
    """The core as apps see it."""

    def __init__(self, core: CoreState) -> None:
        self._core = core

    # ----- what the controller knows -------------------------------------------------------

    @property
    def view(self) -> ClusterView:
        """The latest snapshot of the coordinator (replaced, never changed, on updates)."""
        return self._core.view

    def stored_topology(self, app: str) -> Topology | None:
        """The application's logical topology as the coordinator holds it now."""
        return self._core.coordinator.get_topology(app)

    def stored_physical(self, app: str) -> PhysicalTopology | None:
        """The application's physical topology as the coordinator holds it now (it may be
        newer than the view's)."""
        return self._core.coordinator.get_physical(app)

    def agent(self, host: str) -> Any:
        """The last state ``host``'s agent reported (None: never heard of)."""
        return self._core.coordinator.get_agent(host)

    def connected_hosts(self) -> set[str | None]:
        """Hosts whose switch is connected to the controller now."""
        return self._core.connected_hosts()

    def job_progress(self, app: str) -> JobProgress | None:
        """Checkpoints and ends of a guaranteed application, as its workers report them."""
        return self._core.progress.get(app)

    # ----- control tuples ------------------------------------------------------------------

    def send_control(self, app: str, worker_ids: Iterable[int], ct: ControlTuple) -> int:
        """PacketOut ``ct`` to each worker; returns how many were sent."""
        return self._core.send_control(app, worker_ids, ct)

    def next_control_version(self) -> int:
        """A version for a control tuple that no earlier one (this run or the last) used."""
        return self._core.next_control_version()

    def request_metrics(self, app: str, worker_ids: Iterable[int] | None = None) -> int:
        """METRIC_REQ to the given (default: every attached) worker; returns how many."""
        return self._core.request_metrics(app, worker_ids)

    def worker_metrics(self, app: str) -> dict[int, dict]:
        """The last METRIC_RESP of each of the application's workers (worker ID -> report)."""
        return self._core.worker_metrics.get(app, {})

    def acked(self, app: str, what: str, version: int) -> set[int]:
        """Workers that confirmed the control tuple ``what`` with ``version``."""
        return self._core.acked(app, what, version)

    # ----- switches ------------------------------------------------------------------------

    def set_rules(self, source: Source, owner: str, value: Any) -> None:
        """Contribute rules, groups or an overlay (``controller/rules/composer.py``); installed
        now."""
        self._core.set_rules(source, owner, value)

    def clear_rules(self, source: Source, owner: str) -> None:
        self._core.clear_rules(source, owner)

    def synced(self) -> bool:
        """Every connected switch confirmed the desired rules."""
        return self._core.synced()

    def rules_ready(self, app: str, version: int) -> bool:
        """The view holds ``version`` of ``app`` and its switches confirmed the rules."""
        return self._core.rules_ready(app, version)

    def hosts_with_groups(self) -> set[str]:
        """Hosts whose switch the core keeps groups on."""
        return {h for h, gs in self._core.desired_groups.items() if gs}

    def groups_wanted(self, host: str) -> frozenset[GroupSpec]:
        """The groups the core keeps on ``host``'s switch."""
        return self._core.desired_groups.get(host, frozenset())

    def groups_on_switch(self, dpid: int) -> set[GroupSpec]:
        """The groups the switch holds (as read back and since installed)."""
        return self._core.sync.installed_groups.get(dpid, set())

    def port_is_up(self, dpid: int, port: int) -> bool:
        """The port's last status (up unless the switch said otherwise)."""
        return self._core.sync.port_up.get((dpid, port), True)

    def request_stats(self, host: str, groups: bool) -> bool:
        """Port counters (and group counters) from ``host``'s switch; the replies come as
        Ryu's EventOFPPortStatsReply / EventOFPGroupStatsReply.  False: not connected."""

        def build(dp: Any) -> list[Any]:
            msgs = [ofp.group_stats_request(dp)] if groups else []
            return [*msgs, ofp.port_stats_request(dp)]

        return self._core.send_to_host(host, build)

    def request_meter_stats(self, host: str) -> bool:
        """Meter counters of ``host``'s switch (frames in, frames dropped by the band); the
        reply comes as Ryu's EventOFPMeterStatsReply.  False: not connected."""
        return self._core.send_to_host(host, lambda dp: [ofp.meter_stats_request(dp)])

    # ----- changing applications -----------------------------------------------------------

    def reconfigure(self, app: str, request: Request) -> Reconfiguration:
        """Start a stable update (``controller/reconfigure.py``); ReconfigError if it cannot."""
        return self._core.reconfigure(app, request)

    def reconfiguration(self, app: str) -> Reconfiguration | None:
        """The application's running or last reconfiguration."""
        return self._core.reconfigs.get(app)

    def placement(self, app: str) -> Any:
        """The scheduler's placement for new workers of ``app`` (``typhoon/manager.py``)."""
        return self._core.manager.placement(app)

    def update_physical(self, app: str, physical: PhysicalTopology) -> PhysicalTopology:
        """Write a new physical topology (agents start and stop workers after it)."""
        return self._core.manager.update_physical(app, physical)

    # ----- live debugger sessions ----------------------------------------------------------

    def put_debug_session(self, spec: DebugSpec) -> None:
        """Ask the observed worker's agent to start the session's debug worker."""
        put_session(self._core.coordinator, spec)

    def delete_debug_session(self, host: str, session: str) -> None:
        """Release the session's debug worker."""
        delete_session(self._core.coordinator, host, session)

    def take_debug_batches(self, session: str, next_n: int) -> tuple[list[Any], int, str | None]:
        """A session's batches sent through the coordinator, and any failure reported."""
        return take_batches(self._core.coordinator, session, next_n)

    def delete_debug_batches(self, session: str) -> None:
        """Drop what a session left in the coordinator."""
        delete_batches(self._core.coordinator, session)

    def forget_debug_batches(self, keep: set[str]) -> list[str]:
        """Drop what sessions not in ``keep`` left in the coordinator; their ids."""
        return forget_batches(self._core.coordinator, keep)

    def forget_debug_sessions(self, keep: set[str]) -> list[str]:
        """Delete the session keys of sessions not in ``keep``; returns the keys deleted."""
        gone = [k for k in all_session_keys(self._core.coordinator) if k.split("/")[-1] not in keep]
        for key in gone:
            self._core.coordinator.delete(key)
        return gone


def services() -> Services:
    """The running core's services."""
    return Services(core_app())
