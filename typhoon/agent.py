"""Worker agent, one per host: ``typhoon-agent --host H --coordinator C --workdir D``
(or ``python -m typhoon.agent``; deploy/systemd/typhoon-agent.service runs it).

It makes the host run what the physical topologies assign to it (paper §3.2,
step iv) and tells the coordinator what it saw.  Per worker:

* assigned here, never run (no status): write the spec to
  ``DIR/NAME/worker-WID.spec.json``, start ``python -m typhoon.runtime.worker
  SPEC``, forked by the agent's zygote (typhoon.agent_launcher) (a chain's workers:
  one process, every spec; log in ``worker-WID.log``, reports in
  ``DIR/NAME/reports``), status ``starting``;
* ``starting``: once the worker has created its TAP device, add it to the host's bridge
  at the scheduled OpenFlow port, check the port number OVS gave it, status ``attached``;
  no TAP within ``--tap-timeout`` or a wrong port: stop the worker, status ``exited``;
* the process ended (finished, crashed, killed): remove its port, status ``exited`` with
  the exit code (negative: the signal); not restarted (the fault detector's decision);
* no longer assigned (application killed, worker removed or moved): SIGTERM, SIGKILL
  after ``--stop-timeout``, remove its port, delete its status; but a worker that drained
  out of a chain process whose other workers stay: once its TAP is gone, the last two.

A worker that has a status is never launched again by this rule, so an agent restart
adopts the workers still alive (their process, found by the spec path on its command
line) and marks the lost ones ``exited``.  The agent publishes ``agents/HOST`` (ports
in use, workers per application) on every change and every ``--heartbeat`` seconds.
SIGTERM/SIGINT: stop every worker, remove their ports, mark them ``exited``, delete
``agents/HOST``.  Unreadable coordinator data is logged and skipped; it keeps running.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from typhoon import logs
from typhoon.agent_launcher import agent_zygote, spawn
from typhoon.assignments import assigned_workers, relevant
from typhoon.cluster import Cluster
from typhoon.coordinator import (
    AgentState,
    Coordinator,
    CoordinatorError,
    WorkerStatus,
    coordinator_url,
    open_coordinator,
)
from typhoon.debug.supervisor import DebugWorkers
from typhoon.engine_services import EngineServices
from typhoon.job_report import publish_worker_report
from typhoon.ovs_bridge import Bridge, OvsError
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.tap import tap_name
from typhoon.supervised import Supervised
from typhoon.topology.chaining import group_of
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment
from typhoon.worker_specs import write_group_specs
from typhoon.zygote import ZygoteLauncher

log = logging.getLogger("typhoon.agent")

WORKER_CMD = (sys.executable, "-m", "typhoon.runtime.worker")
MAX_OFPORT = 0xFEFF
SYS_NET = Path("/sys/class/net")


@dataclass
class _Worker:
    """One supervised worker process and where it is in its life."""

    app: str
    app_id: int
    assignment: WorkerAssignment
    tap: str
    bridge: Bridge
    process: Supervised  # started here, or adopted from an earlier agent run (pid only)
    phase: str  # "starting" | "attached" | "stopping"
    deadline: float  # starting: TAP deadline; stopping: when to SIGKILL
    remove: bool = False  # left the topology: delete the status when gone
    killed: bool = False
    ended: bool = False  # exit seen and port removed
    error: str = ""

    @property
    def key(self) -> tuple[str, int]:
        return (self.app, self.assignment.worker_id)

    @property
    def pid(self) -> int:
        return self.process.pid


class Agent:
    """Reconciles this host's workers with the coordinator (see the module docstring)."""

    def __init__(
        self,
        coordinator: Coordinator,
        host: str,
        workdir: Path,
        worker_cmd: list[str] | None = None,
        *,
        tap_timeout: float = 15.0,
        stop_timeout: float = 5.0,
        heartbeat: float = 1.0,
        interval: float = 0.05,
        resync: float = 5.0,
        coordinator_url: str | None = None,
    ) -> None:
        self.c = coordinator
        self.host = host
        self.workdir = Path(workdir).resolve()
        self.worker_cmd = list(worker_cmd or WORKER_CMD)
        self.tap_timeout = tap_timeout
        self.stop_timeout = stop_timeout
        self.heartbeat = heartbeat
        self.interval = interval
        self.resync = resync
        self.workers: dict[tuple[str, int], _Worker] = {}
        # the live debugger's workers (debug/HOST/* keys): separate from the topologies'
        self.debug = DebugWorkers(
            coordinator, host, self.workdir / "debug", tap_timeout=tap_timeout,
            stop_timeout=stop_timeout, coordinator_url=coordinator_url,
        )  # fmt: skip
        # engine processes (a Spark driver per host) of applications with spark nodes
        self.engines = EngineServices(host, self.workdir)
        self.zygote: ZygoteLauncher | None = None  # run() starts it: workers are forked
        self.bridge: Bridge | None = None
        self.cluster: Cluster | None = None
        self.port_range = (1, MAX_OFPORT)
        self.stopping = False
        self._version = 0
        self._dirty = True  # reconcile on the next tick
        self._published = 0.0
        self._publish_now = True
        self._next_resync = 0.0
        self._warned_no_host = False

    # ----- main loop -----------------------------------------------------------------------

    def stop(self, *_: object) -> None:
        """Signal handler: finish the current tick, then shut down."""
        self.stopping = True

    def run(self) -> None:
        log.info("agent for %s started (pid %d, workdir %s)", self.host, os.getpid(), self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.worker_cmd == list(WORKER_CMD):  # else the command is spawned, as ever
            self.zygote = agent_zygote(self.workdir, self.host)
            self.debug.launcher = self.zygote  # debug workers are forked there too
        try:
            self._version = self.c.version()  # reconcile reads everything once anyway
            self._read_cluster()
            self.recover()
        except CoordinatorError as e:
            log.error("cannot recover earlier workers: %s", e)
        while not self.stopping:
            if not self.tick():
                time.sleep(1.0)  # the coordinator failed: do not spin on it
            time.sleep(self.interval)
        self.shutdown()

    def tick(self) -> bool:
        """One round: read changes, reconcile if needed, supervise, publish; False on error."""
        try:
            version, keys = self.c.changes_since(self._version)
            now = time.monotonic()
            if self._dirty or now >= self._next_resync or any(map(relevant, keys)):
                self._dirty = False
                self._next_resync = now + self.resync
                self.reconcile()
            self._version = version
            self.supervise()
            self.engines.supervise()
            self.debug.supervise()
            if self._publish_now or time.time() - self._published >= self.heartbeat:
                self.publish()
            return True
        except Exception:  # the agent outlives any bad read or failed command
            log.exception("agent round failed; retrying")
            self._dirty = True
            return False

    # ----- desired state -------------------------------------------------------------------

    def _read_cluster(self) -> None:
        try:
            cluster = self.c.get_cluster()
        except CoordinatorError as e:
            log.error("ignoring the cluster: %s", e)
            return
        info = cluster.hosts.get(self.host) if cluster else None
        if info is None:
            if not self._warned_no_host:
                log.warning("host %s is not in the coordinator's cluster: no bridge yet", self.host)
                self._warned_no_host = True
            return
        if self.bridge is None or self.bridge.name != info.bridge:
            log.info("host %s: bridge %s, worker ports from %d",
                     self.host, info.bridge, info.first_worker_port)  # fmt: skip
        self.bridge = Bridge(info.bridge)
        self.cluster = cluster
        self.port_range = (info.first_worker_port, MAX_OFPORT)
        self._warned_no_host = False

    def reconcile(self) -> None:
        """Stop what is no longer assigned here, launch what is assigned and never ran."""
        self._read_cluster()
        desired, unreadable = assigned_workers(self.c, self.host)
        for key, wk in list(self.workers.items()):
            want = desired.get(key)
            if wk.app in unreadable:
                continue
            place = want and (want[1].app_id, want[2].placement())  # draining keeps running
            mates = {o.key for o in self.workers.values() if o.process is wk.process}
            if want is None and mates & desired.keys():  # drained out of a chain process that
                wk.remove = not (SYS_NET / wk.tap).exists()  # goes on: once it closed its TAP
                self._dirty |= not wk.remove  # (runtime/chain.py; look again next tick),
                if wk.remove:  # only its port and status go
                    self.finish(wk, 0)
            elif place != (wk.app_id, wk.assignment.placement()):
                self.begin_stop(wk, remove=True, why="no longer assigned to this host")
        self.engines.forget_except({key[0] for key in desired} | unreadable)
        statuses: dict[str, dict[int, WorkerStatus] | None] = {}
        for key, (topology, physical, w) in desired.items():
            if key in self.workers:
                continue
            if key[0] not in statuses:
                try:
                    statuses[key[0]] = self.c.worker_statuses(key[0])
                except CoordinatorError as e:
                    log.error("not launching workers of %s: %s", key[0], e)
                    statuses[key[0]] = None
            if (known := statuses[key[0]]) is None or w.worker_id in known:
                continue
            if self.bridge is None:
                log.warning("not launching %s worker %d: no bridge for %s", *key, self.host)
                continue
            self.launch(topology, physical, w)
        self.debug.reconcile(self.bridge)

    # ----- worker life ---------------------------------------------------------------------

    def launch(self, topology: Topology, physical: PhysicalTopology, w: WorkerAssignment) -> None:
        """Start ``w``, or its chain's one process (typhoon.topology.chaining)."""
        assert self.bridge is not None
        name, wid = physical.name, w.worker_id
        group = [physical.by_id(m) for m in group_of(topology, physical, wid)]
        if group[0].worker_id != wid:
            return  # started with the head of its chain
        try:
            topology = self.engines.topology_for(topology, physical)
            specs = write_group_specs(self.workdir, topology, physical, group, self.cluster,
                                      self.port_range)  # fmt: skip
            for _, tap, _ in specs:
                self.bridge.detach(tap)  # a stale port of an earlier run would hold the name
            argv = [*self.worker_cmd, *(str(p) for _, _, p in specs)]
            log_path = specs[0][2].with_name(f"worker-{wid}.log")
            proc = (self.zygote or spawn)(self.host, argv, log_path)
        except (OSError, ValueError, TypeError, OvsError) as e:
            log.error("cannot launch %s worker %d: %s", name, wid, e)
            for m in group:
                tap, why = tap_name(physical.app_id, m.worker_id), f"launch failed: {e}"
                self.c.put_worker_status(name, WorkerStatus(m.worker_id, self.host, "exited",
                    port=m.port, tap=tap, error=why, updated=time.time()))  # fmt: skip
            return
        deadline = time.monotonic() + self.tap_timeout
        for m, tap, _ in specs:
            wk = _Worker(name, physical.app_id, m, tap, self.bridge, proc, "starting", deadline)
            self.workers[wk.key] = wk
            log.info("launched %s worker %d (%s[%d]) pid %d, waiting for TAP %s",
                     name, m.worker_id, m.node, m.index, proc.pid, tap)  # fmt: skip
            self.c.put_worker_status(name, WorkerStatus(m.worker_id, self.host, "starting",
                proc.pid, m.port, tap, updated=time.time()))  # fmt: skip
        self._publish_now = True

    def supervise(self) -> None:
        """Advance every worker: attach TAPs, notice exits, escalate stops."""
        for wk in list(self.workers.values()):
            ended, code = wk.process.exit_status()
            if ended:
                self.finish(wk, code)
            elif wk.phase == "starting":
                if self.engines.failed(wk.app):
                    wk.error = "its engine service failed (see the service log)"
                    self.begin_stop(wk, remove=False, why=wk.error)
                elif (SYS_NET / wk.tap).exists() and not self.engines.ready(wk.app):
                    # sources start once workers are attached: not before the engine serves
                    wk.deadline = max(wk.deadline, time.monotonic() + self.tap_timeout)
                elif (SYS_NET / wk.tap).exists():
                    self.attach(wk)
                elif time.monotonic() > wk.deadline:
                    wk.error = f"TAP {wk.tap} did not appear within {self.tap_timeout:g} s"
                    self.begin_stop(wk, remove=False, why=wk.error)
            elif wk.phase == "stopping" and not wk.killed and time.monotonic() > wk.deadline:
                log.warning("%s worker %d ignored SIGTERM for %g s: SIGKILL",
                            *wk.key, self.stop_timeout)  # fmt: skip
                wk.process.signal_group(signal.SIGKILL)
                wk.killed = True

    def attach(self, wk: _Worker) -> None:
        port = wk.assignment.port
        try:
            got = wk.bridge.attach(wk.tap, port)
        except OvsError as e:
            wk.error = f"cannot attach TAP {wk.tap}: {e}"
        else:
            if got == port:
                wk.phase = "attached"
                log.info("attached %s worker %d: %s is port %d of %s",
                         *wk.key, wk.tap, port, wk.bridge.name)  # fmt: skip
                self.c.put_worker_status(wk.app, self._status(wk, "attached"))
                return
            wk.error = f"OVS gave TAP {wk.tap} port {got}, not the scheduled {port}"
        self.begin_stop(wk, remove=False, why=wk.error)

    def begin_stop(self, wk: _Worker, remove: bool, why: str) -> None:
        wk.remove = wk.remove or remove
        if wk.phase == "stopping":
            return
        log.info("stopping %s worker %d (pid %d): %s", *wk.key, wk.pid, why)
        wk.phase = "stopping"
        wk.deadline = time.monotonic() + self.stop_timeout
        wk.process.signal_group(signal.SIGTERM)

    def finish(self, wk: _Worker, code: int | None) -> None:
        """The process is gone: free its port, record (or forget) it, then drop it.

        The worker stays supervised until its status is written, so a failed
        coordinator write is retried on the next round.
        """
        if not wk.ended:
            wk.ended = True
            why = f" ({wk.error})" if wk.error else ""
            log.info("%s worker %d (pid %d) exited with %s%s", *wk.key, wk.pid, code, why)
            try:
                wk.bridge.detach(wk.tap)
                log.info("removed port %s from %s", wk.tap, wk.bridge.name)
            except OvsError as e:
                log.error("cannot remove port %s: %s", wk.tap, e)
        if wk.remove:
            self.c.delete_worker_status(wk.app, wk.assignment.worker_id)
        else:  # the report first: whoever sees "exited" finds it (typhoon/job_report.py)
            wid = wk.assignment.worker_id
            publish_worker_report(self.c, wk.app, wid, self.host, self.workdir / wk.app, code)
            status = self._status(wk, "exited")
            status.exit_code = code
            self.c.put_worker_status(wk.app, status)
        del self.workers[wk.key]
        self._publish_now = self._dirty = True
        wk.process.close_log()

    def _status(self, wk: _Worker, state: str) -> WorkerStatus:
        a = wk.assignment
        return WorkerStatus(a.worker_id, self.host, state, wk.pid, a.port, wk.tap,
                            error=wk.error, updated=time.time())  # fmt: skip

    # ----- agent state, restart and shutdown -----------------------------------------------

    def publish(self) -> None:
        apps: dict[str, list[int]] = {}
        for app, wid in sorted(self.workers):
            apps.setdefault(app, []).append(wid)
        used = sorted([wk.assignment.port for wk in self.workers.values()] + self.debug.ports())
        state = AgentState(self.host, os.getpid(), time.time(), self.port_range, used, apps)
        self.c.put_agent(state)
        self._published, self._publish_now = state.heartbeat, False

    def recover(self) -> None:
        """Adopt live workers of an earlier run on this host; mark the lost ones exited."""
        apps = sorted({key.split("/")[1] for key in self.c.list("status")})
        for app in apps:
            try:
                statuses = self.c.worker_statuses(app)
            except CoordinatorError as e:
                log.error("cannot recover workers of %s: %s", app, e)
                continue
            for s in statuses.values():
                if s.host == self.host and s.state != "exited":
                    self._recover_one(app, s)

    def _recover_one(self, app: str, s: WorkerStatus) -> None:
        spec_path = self.workdir / app / f"worker-{s.worker_id}.spec.json"
        adopted = (
            Supervised.adopt(f"worker-{s.worker_id}", s.pid, str(spec_path)) if s.pid else None
        )
        spec = None
        if adopted is not None:
            try:
                spec = WorkerSpec.load(spec_path)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.error("cannot read %s: %s", spec_path, e)
        if adopted is not None and spec is not None and self.bridge is not None:
            app_id = spec.physical.app_id
            tap = s.tap or tap_name(app_id, s.worker_id)
            phase = "attached" if s.state in ("attached", "running") else "starting"
            deadline = time.monotonic() + self.tap_timeout
            wk = _Worker(app, app_id, spec.assignment, tap, self.bridge, adopted, phase, deadline)
            self.workers[wk.key] = wk
            log.info("adopted %s worker %d (pid %d, %s)", app, s.worker_id, s.pid, phase)
            return
        if adopted is not None:  # alive, but without its spec or bridge it cannot be supervised
            log.warning("stopping %s worker %d (pid %d): cannot adopt it", app, s.worker_id, s.pid)
            adopted.send_signal(signal.SIGTERM)
        if self.bridge is not None and s.tap:
            try:
                self.bridge.detach(s.tap)
            except OvsError as e:
                log.error("cannot remove port %s: %s", s.tap, e)
        log.warning("%s worker %d was lost while no agent watched it", app, s.worker_id)
        s.state, s.error, s.updated = "exited", "lost: its agent stopped", time.time()
        self.c.put_worker_status(app, s)

    def shutdown(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL), remove their ports, leave the cluster."""
        log.info("agent for %s shutting down: stopping %d workers", self.host, len(self.workers))
        for wk in self.workers.values():
            wk.error = wk.error or "stopped by agent shutdown"
            self.begin_stop(wk, remove=False, why="agent shutdown")
        deadline = time.monotonic() + self.stop_timeout + 5
        while self.workers and time.monotonic() < deadline:
            try:
                self.supervise()
            except Exception:
                log.exception("error while stopping workers")
            time.sleep(self.interval)
        for wk in self.workers.values():
            log.error("%s worker %d (pid %d) did not exit", *wk.key, wk.pid)
        self.debug.shutdown()
        if self.zygote is not None:  # after its children: their exit codes came through it
            self.zygote.close()
        self.engines.stop_all()
        try:
            self.c.delete_agent(self.host)
        except CoordinatorError as e:
            log.error("cannot remove agents/%s: %s", self.host, e)
        log.info("agent for %s stopped", self.host)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="typhoon-agent",
        description="Typhoon worker agent: runs this host's workers and attaches their TAPs.",
    )
    parser.add_argument("--host", required=True, help="this host's name in the cluster")
    parser.add_argument(
        "--coordinator",
        help="SQLite path, sqlite:///PATH or zk://HOST:PORT/PREFIX "
        "(default: $TYPHOON_COORDINATOR, else /var/lib/typhoon/coordinator.db)",
    )
    parser.add_argument("--workdir", required=True, type=Path, help="specs, logs and reports")
    parser.add_argument(
        "--worker-cmd",
        help="command that runs one worker, SPEC.json appended (split like a shell would, "
        "run without one; default: python -m typhoon.runtime.worker)",
    )
    parser.add_argument("--tap-timeout", type=float, default=15.0, metavar="S")
    parser.add_argument("--stop-timeout", type=float, default=5.0, metavar="S")
    parser.add_argument("--heartbeat", type=float, default=1.0, metavar="S")
    parser.add_argument("--interval", type=float, default=0.05, metavar="S")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logs.setup(
        logging.DEBUG if args.verbose else logging.INFO,
        text_format=f"%(asctime)s agent[{args.host}] %(levelname)s %(message)s",
    )
    url = coordinator_url(args.coordinator)
    try:
        coordinator = open_coordinator(url)
    except CoordinatorError as e:
        log.error("%s", e)
        return 1
    agent = Agent(
        coordinator,
        args.host,
        args.workdir,
        shlex.split(args.worker_cmd) if args.worker_cmd else None,
        tap_timeout=args.tap_timeout,
        stop_timeout=args.stop_timeout,
        heartbeat=args.heartbeat,
        interval=args.interval,
        coordinator_url=url,
    )
    signal.signal(signal.SIGTERM, agent.stop)
    signal.signal(signal.SIGINT, agent.stop)
    try:
        agent.run()
    finally:
        coordinator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
