"""An agent's engine services: the processes a non-python engine needs on its host.

A topology with ``engine: spark`` nodes needs one Spark driver per host next
to the node's workers (``typhoon/engines.py``).  The agent plans them once
per application, starts the ones placed on its host, holds its workers back
from "attached" (so the controller does not ACTIVATE the sources) until every
such service is ready, restarts a service that exits with an error (a few
times), and stops them when the application goes away — as ``tcp_cluster``
does for tcp runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from typhoon.engines import EngineService, plan_engines
from typhoon.supervised import Supervised
from typhoon.topology.model import PhysicalTopology, Topology

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
PLANNED_ARGS = ("dir", "guarantee")  # engine-node arguments the engine's plan fills in


@dataclass
class _Running:
    service: EngineService
    log_path: Path
    proc: Supervised | None = None
    restarts: int = 0
    failed: bool = False


@dataclass
class _AppEngines:
    topology: Topology  # what the workers get (engine directories filled in)
    services: list[_Running] = field(default_factory=list)


def with_planned_args(topology: Topology, planned: Topology) -> Topology:
    """``topology`` with the planned arguments of its engine nodes (see ``topology_for``)."""
    out = Topology.from_dict(topology.to_dict())
    for node in out.nodes.values():
        if node.engine == "python":
            continue
        was = planned.nodes.get(node.name)
        same = (
            was is not None
            and (was.engine, was.operator) == (node.engine, node.operator)
            and {**was.args, **node.args} == was.args  # nothing changed or added
            and set(was.args) - set(node.args) <= set(PLANNED_ARGS)  # nothing removed
        )
        if not same:
            raise ValueError(
                f"{node.engine} node '{node.name}' is not the one its engine service runs "
                "(inserted or swapped while the application runs); only scaling it is supported"
            )
        node.args.update(was.args)
    return out


class EngineServices:
    """Engine processes of every application with workers on this host."""

    def __init__(self, host: str, workdir: Path) -> None:
        self.host = host
        self.workdir = workdir
        self.apps: dict[str, _AppEngines] = {}

    def topology_for(self, topology: Topology, physical: PhysicalTopology) -> Topology:
        """The topology to give workers; plans and starts this host's services once.

        Later launches (a reconfiguration added workers) get the *current*
        topology with the engine nodes' planned arguments (a spark node's
        ``dir``) filled in, so a worker added to an engine node joins the
        service that already runs it.  An engine node the services were not
        planned for (inserted, or its operator or arguments swapped) cannot be
        served: ValueError, which fails the launch with that reason.
        """
        if all(n.engine == "python" for n in topology.nodes.values()):
            return topology
        app = self.apps.get(physical.name)
        if app is None:
            appdir = self.workdir / physical.name
            planned, services = plan_engines(topology, physical, appdir / "engines")
            app = self.apps[physical.name] = _AppEngines(planned)
            for s in services:
                if s.host == self.host:
                    running = _Running(s, appdir / f"{s.name}.log")
                    app.services.append(running)
                    self._start(running)
            return planned
        return with_planned_args(topology, app.topology)

    def _start(self, r: _Running) -> None:
        r.log_path.parent.mkdir(parents=True, exist_ok=True)
        r.proc = Supervised.start(r.service.name, r.service.argv, r.log_path)
        log.info("started engine service %s (pid %d) for %s", r.service.name, r.proc.pid,
                 ", ".join(r.service.nodes))  # fmt: skip

    def ready(self, app: str) -> bool:
        """Every service of ``app`` on this host serves its nodes (or none is needed)."""
        engines = self.apps.get(app)
        if engines is None:
            return True
        return all(
            not r.service.ready_file or Path(r.service.ready_file).exists()
            for r in engines.services
        )

    def failed(self, app: str) -> bool:
        """A service of ``app`` here gave up after its restarts."""
        engines = self.apps.get(app)
        return engines is not None and any(r.failed for r in engines.services)

    def supervise(self) -> None:
        """Restart a service that exited with an error; a clean exit means its nodes finished."""
        for app, engines in self.apps.items():
            for r in engines.services:
                if r.proc is None or r.failed or r.proc.poll() is None:
                    continue
                code = r.proc.returncode
                if code == 0:
                    continue
                if r.restarts >= MAX_RESTARTS:
                    r.failed = True
                    log.error("%s: engine service %s failed %d times (exit %d); giving up",
                              app, r.service.name, r.restarts + 1, code)  # fmt: skip
                    continue
                r.restarts += 1
                log.warning("%s: engine service %s exited %d; restart %d of %d",
                            app, r.service.name, code, r.restarts, MAX_RESTARTS)  # fmt: skip
                r.proc.close_log()
                self._start(r)

    def forget_except(self, apps: set[str]) -> None:
        """Stop the services of applications no longer assigned to this host."""
        for name in [a for a in self.apps if a not in apps]:
            self.stop(name)

    def stop(self, app: str, timeout: float = 10.0) -> None:
        engines = self.apps.pop(app, None)
        for r in engines.services if engines else []:
            if r.proc is not None:
                r.proc.stop(timeout)  # SIGTERM to its group, SIGKILL after the timeout
            log.info("%s: stopped engine service %s", app, r.service.name)

    def stop_all(self) -> None:
        for app in list(self.apps):
            self.stop(app)
