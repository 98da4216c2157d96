"""Worker agent, one per host: ``typhoon-agent --host H --coordinator C --workdir D``.

(``python -m typhoon.agent`` is the same program; deploy/systemd/typhoon-agent.service
runs it as a service.)

It makes the host run what the physical topologies assign to it (paper §3.2,
step iv) and tells the coordinator what it saw.  Per worker:

* assigned here, never run (no status): write the spec to
  ``DIR/NAME/worker-WID.spec.json``, start ``python -m typhoon.runtime.worker
  SPEC`` (log in ``worker-WID.log``, reports in ``DIR/NAME/reports``), status
  ``starting``;
* ``starting``: once the worker has created its TAP device, add it to the
  host's bridge at the scheduled OpenFlow port, check the port number OVS
  gave it, status ``attached``; no TAP within ``--tap-timeout`` or a wrong
  port: stop the worker, status ``exited`` with the error;
* the process ended (finished, crashed, killed): remove its port, status
  ``exited`` with the exit code (negative: the signal).  It is not restarted:
  replacing a dead worker is the fault detector's and the manager's decision;
* no longer assigned (application killed, worker removed or moved): SIGTERM,
  SIGKILL after ``--stop-timeout``, remove its port, delete its status.

A worker that has a status is never launched again by this rule, so an agent
restart adopts the workers still alive (their process, found by the spec path
on its command line) and marks the lost ones ``exited``.  The agent publishes
``agents/HOST`` (ports in use, workers per application) on every change and
every ``--heartbeat`` seconds.  SIGTERM/SIGINT: stop every worker, remove
their ports, mark them ``exited``, delete ``agents/HOST``.  Unreadable
coordinator data is logged and skipped; the agent keeps running.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from typhoon import logs
from typhoon.cluster import Cluster
from typhoon.coordinator import (
    AgentState,
    Coordinator,
    CoordinatorError,
    WorkerStatus,
    open_coordinator,
)
from typhoon.debug.supervisor import DebugWorkers
from typhoon.engine_services import EngineServices
from typhoon.runtime import links as lk
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.tap import tap_name
from typhoon.topology.budgets import plan_budgets
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment

log = logging.getLogger("typhoon.agent")

WORKER_CMD = (sys.executable, "-m", "typhoon.runtime.worker")
MAX_OFPORT = 0xFEFF
# Frame size of a worker when nothing smaller is asked for: the emulated fabric's links
# carry 65,000 bytes (mininet_env/network.py).  Per-frame costs (a TAP write and read, a
# pass through the switch, the link protocol's bookkeeping) dominate at 9,000 bytes:
# forward.yaml on one host went from 1.15M to 1.51M tuples/s (README, "Per-tuple cost").
WORKER_MTU = 64000
SYS_NET = Path("/sys/class/net")


SDN_OPTIONS = ("window", "port_budget", "credit_timeout_s", "mtu", "control_priority")


def sdn_options(config: dict) -> dict:
    """I/O-layer settings from the topology's ``config``.

    ``flow_control: false`` turns credits off (the largest window, no byte
    budget): only for showing what flow control prevents; the links still resend
    what the switch drops.  ``sdn: {window,
    port_budget, credit_timeout_s}`` tunes it (``control_priority: false`` hands
    urgent control tuples out in arrival order, behind queued data: only for
    measuring what the priority buys); without ``port_budget`` every
    worker gets its share of the switch's socket buffers
    (:func:`typhoon.topology.budgets.plan_budgets`), kept current by the controller.
    """
    opts = {k: v for k, v in (config.get("sdn") or {}).items() if k in SDN_OPTIONS}
    if config.get("flow_control") is False:
        opts.update(window=lk.MAX_WINDOW, port_budget=0)
    return opts


def worker_mtu(config: dict, cluster: Cluster | None) -> int:
    """Frame size of a worker: what the fabric carries whole, or less if the topology asks.

    A cluster file's fabric fixes ``cluster.mtu`` (e.g. 1450 over VXLAN on a
    1500-byte underlay); a larger frame would be dropped on the way, so a
    topology's ``sdn: {mtu: N}`` can only lower it.  Tuples larger than a
    frame travel segmented (``typhoon.wire.pack_frames``).
    """
    path = cluster.mtu if cluster is not None and cluster.mtu else None
    asked = (config.get("sdn") or {}).get("mtu")
    if asked is None:
        return path or WORKER_MTU
    asked = int(asked)
    if path is not None and asked > path:
        log.warning("sdn.mtu %d does not fit the fabric: frames of %d bytes instead", asked, path)
        return path
    return asked


class OvsError(RuntimeError):
    """An ovs-vsctl command failed."""


@dataclass
class Bridge:
    """The host's OVS bridge, changed only through ovs-vsctl argument lists."""

    name: str
    timeout: float = 10.0

    def _vsctl(self, *args: str) -> str:
        cmd = ["ovs-vsctl", f"--timeout={int(self.timeout)}", *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout + 5)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise OvsError(f"{' '.join(cmd)}: {e}") from e
        if proc.returncode != 0:
            raise OvsError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def attach(self, tap: str, ofport: int) -> int | None:
        """Add ``tap`` at ``ofport``; return the port OVS actually gave it."""
        self._vsctl(
            "--may-exist", "add-port", self.name, tap,
            "--", "set", "Interface", tap, f"ofport_request={ofport}",
        )  # fmt: skip
        return self.ofport(tap)

    def ofport(self, tap: str) -> int | None:
        value = self._vsctl("get", "Interface", tap, "ofport")
        try:
            port = int(value)
        except ValueError:
            return None  # "[]": not assigned yet
        return port if port > 0 else None

    def detach(self, tap: str) -> None:
        self._vsctl("--if-exists", "del-port", self.name, tap)


@dataclass
class _Worker:
    """One supervised worker process and where it is in its life."""

    app: str
    app_id: int
    assignment: WorkerAssignment
    tap: str
    bridge: Bridge
    proc: subprocess.Popen | None  # None: adopted from an earlier agent run (pid only)
    pid: int
    phase: str  # "starting" | "attached" | "stopping"
    deadline: float  # starting: TAP deadline; stopping: when to SIGKILL
    remove: bool = False  # left the topology: delete the status when gone
    killed: bool = False
    ended: bool = False  # exit seen and port removed
    error: str = ""
    logfile: IO[bytes] | None = field(default=None, repr=False)

    @property
    def key(self) -> tuple[str, int]:
        return (self.app, self.assignment.worker_id)

    def exit_status(self) -> tuple[bool, int | None]:
        """(has it ended, its exit code if known)."""
        if self.proc is not None:
            rc = self.proc.poll()
            return rc is not None, rc
        return not _alive(self.pid), None

    def send(self, sig: signal.Signals) -> None:
        try:  # workers run in their own session: reach anything they started too
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


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
            stop_timeout=stop_timeout,
        )  # fmt: skip
        # engine processes (a Spark driver per host) of applications with spark nodes
        self.engines = EngineServices(host, self.workdir)
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
            if self._dirty or now >= self._next_resync or any(map(_relevant, keys)):
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
            log.info(
                "host %s: bridge %s, worker ports from %d",
                self.host,
                info.bridge,
                info.first_worker_port,
            )
        self.bridge = Bridge(info.bridge)
        self.cluster = cluster
        self.port_range = (info.first_worker_port, MAX_OFPORT)
        self._warned_no_host = False

    def _desired(self) -> tuple[dict, set[str]]:
        """(app, wid) -> (topology, physical, assignment) for this host; apps not readable."""
        desired: dict[tuple[str, int], tuple[Topology, PhysicalTopology, WorkerAssignment]] = {}
        unreadable: set[str] = set()
        for name in self.c.physical_names():
            try:
                physical = self.c.get_physical(name)
                topology = self.c.get_topology(name)
            except CoordinatorError as e:
                log.error("skipping application %s: %s", name, e)
                unreadable.add(name)
                continue
            if physical is None:
                continue  # deleted since the listing
            if topology is None or physical.name != name:
                log.error("skipping application %s: no matching logical topology", name)
                unreadable.add(name)
                continue
            for w in physical.workers:
                if w.host == self.host:
                    desired[(name, w.worker_id)] = (topology, physical, w)
        return desired, unreadable

    def reconcile(self) -> None:
        """Stop what is no longer assigned here, launch what is assigned and never ran."""
        self._read_cluster()
        desired, unreadable = self._desired()
        for key, wk in list(self.workers.items()):
            want = desired.get(key)
            if wk.app in unreadable:
                continue
            # a worker that turns draining keeps running: only its place matters here
            if (
                want is None
                or want[1].app_id != wk.app_id
                or want[2].placement() != wk.assignment.placement()
            ):
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
            known = statuses[key[0]]
            if known is None or w.worker_id in known:
                continue
            if self.bridge is None:
                log.warning("not launching %s worker %d: no bridge for %s", *key, self.host)
                continue
            self.launch(topology, physical, w)
        self.debug.reconcile(self.bridge)

    # ----- worker life ---------------------------------------------------------------------

    def launch(self, topology: Topology, physical: PhysicalTopology, w: WorkerAssignment) -> None:
        assert self.bridge is not None
        name, wid = physical.name, w.worker_id
        tap = tap_name(physical.app_id, wid)
        status = WorkerStatus(wid, self.host, "starting", port=w.port, tap=tap)
        try:
            topology = self.engines.topology_for(topology, physical)
            spec_path = self._write_spec(topology, physical, w, tap)
            self.bridge.detach(tap)  # a stale port of an earlier run would hold the name
            logfile = open(spec_path.with_name(f"worker-{wid}.log"), "ab")  # noqa: SIM115
            try:
                proc = subprocess.Popen(
                    [*self.worker_cmd, str(spec_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # the agent's terminal signals reach only the agent
                )
            except BaseException:
                logfile.close()
                raise
        except (OSError, ValueError, TypeError, OvsError) as e:
            log.error("cannot launch %s worker %d: %s", name, wid, e)
            status = replace(status, state="exited", error=f"launch failed: {e}")
            self.c.put_worker_status(name, replace(status, updated=time.time()))
            return
        deadline = time.monotonic() + self.tap_timeout
        wk = _Worker(name, physical.app_id, w, tap, self.bridge, proc, proc.pid, "starting",
                     deadline, logfile=logfile)  # fmt: skip
        self.workers[wk.key] = wk
        self._publish_now = True
        log.info("launched %s worker %d (%s[%d]) pid %d, waiting for TAP %s",
                 name, wid, w.node, w.index, proc.pid, tap)  # fmt: skip
        self.c.put_worker_status(name, replace(status, pid=proc.pid, updated=time.time()))

    def _write_spec(
        self, topology: Topology, physical: PhysicalTopology, w: WorkerAssignment, tap: str
    ) -> Path:
        """``DIR/NAME/worker-WID.spec.json``: what the worker process is told."""
        if not self.port_range[0] <= w.port <= self.port_range[1]:
            raise ValueError(f"port {w.port} is outside this host's range {self.port_range}")
        appdir = self.workdir / physical.name
        (appdir / "reports").mkdir(parents=True, exist_ok=True)
        config = topology.config
        transport = {"kind": "sdn", "tap": tap, **sdn_options(config)}
        transport["mtu"] = worker_mtu(config, self.cluster)
        if "port_budget" not in transport and self.cluster is not None:
            budgets = plan_budgets(topology, physical, self.cluster).budgets
            if w.worker_id in budgets:
                transport["port_budget"] = budgets[w.worker_id]
        spec = WorkerSpec(
            topology,
            physical,
            w.worker_id,
            batch_size=int(config.get("batch_size", 100)),
            max_delay_ms=float(config.get("max_delay_ms", config.get("max_delay", 2.0))),
            report_dir=str(appdir / "reports"),
            transport=transport,
        )
        path = appdir / f"worker-{w.worker_id}.spec.json"
        spec.save(path)
        return path

    def supervise(self) -> None:
        """Advance every worker: attach TAPs, notice exits, escalate stops."""
        for wk in list(self.workers.values()):
            ended, code = wk.exit_status()
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
                log.warning(
                    "%s worker %d ignored SIGTERM for %g s: SIGKILL", *wk.key, self.stop_timeout
                )
                wk.send(signal.SIGKILL)
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
                log.info(
                    "attached %s worker %d: %s is port %d of %s",
                    *wk.key,
                    wk.tap,
                    port,
                    wk.bridge.name,
                )
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
        wk.send(signal.SIGTERM)

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
        else:
            status = self._status(wk, "exited")
            status.exit_code = code
            self.c.put_worker_status(wk.app, status)
        del self.workers[wk.key]
        self._publish_now = self._dirty = True
        if wk.logfile is not None:
            wk.logfile.close()

    def _status(self, wk: _Worker, state: str) -> WorkerStatus:
        a = wk.assignment
        return WorkerStatus(
            a.worker_id,
            self.host,
            state,
            wk.pid,
            a.port,
            wk.tap,
            error=wk.error,
            updated=time.time(),
        )

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
        ours = bool(s.pid) and _alive(s.pid) and str(spec_path) in _cmdline(s.pid)
        spec = None
        if ours:
            try:
                spec = WorkerSpec.load(spec_path)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.error("cannot read %s: %s", spec_path, e)
        if spec is not None and self.bridge is not None:
            app_id = spec.physical.app_id
            tap = s.tap or tap_name(app_id, s.worker_id)
            phase = "attached" if s.state in ("attached", "running") else "starting"
            deadline = time.monotonic() + self.tap_timeout
            wk = _Worker(app, app_id, spec.assignment, tap, self.bridge, None, s.pid, phase,
                         deadline)  # fmt: skip
            self.workers[wk.key] = wk
            log.info("adopted %s worker %d (pid %d, %s)", app, s.worker_id, s.pid, phase)
            return
        if ours:  # alive, but without its spec or bridge it cannot be supervised
            log.warning("stopping %s worker %d (pid %d): cannot adopt it", app, s.worker_id, s.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(s.pid, signal.SIGTERM)
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
        self.engines.stop_all()
        try:
            self.c.delete_agent(self.host)
        except CoordinatorError as e:
            log.error("cannot remove agents/%s: %s", self.host, e)
        log.info("agent for %s stopped", self.host)


def _relevant(key: str) -> bool:
    return key == "cluster" or key.startswith(("physical/", "topology/", "debug/"))


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
    try:
        coordinator = open_coordinator(args.coordinator)
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
