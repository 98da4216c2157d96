"""The agent's part of the live debugger: run the debug workers of this host.

For every ``debug/HOST/SESSION`` key (see :mod:`typhoon.debug.spec`) one debug
worker process runs here; once it has created its TAP, its port is added to the
bridge at the session's OpenFlow port, which the switch announces to the
controller (the live debugger installs its mirrors on that port-status event).
When the key is deleted the process gets SIGTERM (SIGKILL after a timeout) and
its port is removed.  A debug worker that ended on its own is not restarted
while its key exists: the controller notices the port going away and ends the
session.  A debug worker that ended on its own with an error gets its last log
line written to ``debugrec/SID/error`` (``typhoon/debug/transport.py``), so the
controller ends the session with that reason.  Each debug worker is given the
agent's coordinator URL (its records go through the coordinator by default).
Kept apart from the agent's topology workers: a debug worker belongs to no
physical topology and has no worker id.  It is started by the agent's launcher,
which forks it from the agent's worker fork server (typhoon.agent_launcher,
typhoon.runtime.zygote_server says why that is safe) while that is usable, else
spawns it; without a launcher (``--worker-cmd``, tests) it is spawned.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from typhoon.coordinator import Coordinator, CoordinatorError
from typhoon.debug.spec import DebugSpec, sessions_on
from typhoon.debug.transport import report_failure
from typhoon.supervised import Supervised

log = logging.getLogger("typhoon.agent.debug")

DEBUG_WORKER_CMD = (sys.executable, "-m", "typhoon.debug.worker")
SYS_NET = Path("/sys/class/net")
# (host, argv, log file) -> the started process: typhoon.zygote.ZygoteLauncher
Launcher = Callable[[str, list[str], Path], Supervised]


class Bridge(Protocol):
    """What is needed of the agent's bridge (``typhoon.ovs_bridge.Bridge``)."""

    def attach(self, tap: str, ofport: int) -> int | None: ...
    def detach(self, tap: str) -> None: ...


@dataclass
class _DebugProc:
    spec: DebugSpec
    bridge: Bridge
    proc: Supervised
    phase: str  # "starting" | "attached" | "stopping"
    deadline: float  # starting: TAP deadline; stopping: when to SIGKILL
    killed: bool = False


class DebugWorkers:
    """Debug worker processes of one host, reconciled with the coordinator's session keys."""

    def __init__(
        self,
        coordinator: Coordinator,
        host: str,
        workdir: Path,
        cmd: list[str] | None = None,
        *,
        tap_timeout: float = 15.0,
        stop_timeout: float = 5.0,
        sys_net: Path = SYS_NET,
        coordinator_url: str | None = None,
    ) -> None:
        self.c = coordinator
        self.coordinator_url = coordinator_url  # handed to each debug worker
        self.host = host
        self.workdir = Path(workdir)
        self.cmd = list(cmd or DEBUG_WORKER_CMD)
        self.tap_timeout = tap_timeout
        self.stop_timeout = stop_timeout
        self.sys_net = sys_net
        self.procs: dict[str, _DebugProc] = {}
        self.ran: set[str] = set()  # sessions launched once: never launched again
        self.launcher: Launcher | None = None  # the agent's, once its zygote started

    def ports(self) -> list[int]:
        return sorted(p.spec.port for p in self.procs.values())

    def reconcile(self, bridge: Bridge | None) -> None:
        """Stop debug workers whose session is gone, launch those of new sessions."""
        wanted = sessions_on(self.c, self.host)
        for sid, p in list(self.procs.items()):
            if sid not in wanted:
                self.begin_stop(p, "session detached")
        self.ran &= set(wanted) | set(self.procs)
        for sid, spec in wanted.items():
            if sid in self.procs or sid in self.ran:
                continue
            if bridge is None:
                log.warning("not starting debug session %s: no bridge for %s", sid, self.host)
                continue
            self.launch(spec, bridge)

    def launch(self, spec: DebugSpec, bridge: Bridge) -> None:
        self.ran.add(spec.session)
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / f"{spec.session}.spec.json"
        try:
            spec.save(path)
            bridge.detach(spec.tap)  # a port left by an earlier run would hold the name
            url = ["--coordinator", self.coordinator_url] if self.coordinator_url else []
            argv, log_path = [*self.cmd, str(path), *url], path.with_name(f"{spec.session}.log")
            if self.launcher is not None:  # forked, or spawned if it cannot fork
                proc = self.launcher(self.host, argv, log_path)
            else:
                proc = Supervised.start(f"debug-{spec.session}", argv, log_path)
        except (OSError, RuntimeError) as e:
            log.error("cannot start debug session %s: %s", spec.session, e)
            return
        deadline = time.monotonic() + self.tap_timeout
        self.procs[spec.session] = _DebugProc(spec, bridge, proc, "starting", deadline)
        log.info(
            "debug session %s: started debug worker pid %d for %s worker %d (%s), TAP %s",
            spec.session, proc.pid, spec.app, spec.worker, spec.direction, spec.tap,
        )  # fmt: skip

    def supervise(self) -> None:
        """Attach TAPs that appeared, notice exits, escalate stops."""
        for p in list(self.procs.values()):
            sid = p.spec.session
            if p.proc.ended():  # a forked one whose detached zygote died ends with no code
                self._finish(p)
            elif p.phase == "starting":
                if (self.sys_net / p.spec.tap).exists():
                    self._attach(p)
                elif time.monotonic() > p.deadline:
                    self.begin_stop(p, f"TAP {p.spec.tap} did not appear in {self.tap_timeout:g} s")
            elif p.phase == "stopping" and not p.killed and time.monotonic() > p.deadline:
                log.warning("debug session %s: worker ignored SIGTERM, SIGKILL", sid)
                p.proc.signal_group(signal.SIGKILL)
                p.killed = True

    def _attach(self, p: _DebugProc) -> None:
        try:
            got = p.bridge.attach(p.spec.tap, p.spec.port)
        except (OSError, RuntimeError) as e:
            self.begin_stop(p, f"cannot attach TAP {p.spec.tap}: {e}")
            return
        if got != p.spec.port:
            self.begin_stop(p, f"OVS gave TAP {p.spec.tap} port {got}, not {p.spec.port}")
            return
        p.phase = "attached"
        log.info("debug session %s: %s is port %d", p.spec.session, p.spec.tap, p.spec.port)

    def begin_stop(self, p: _DebugProc, why: str) -> None:
        if p.phase == "stopping":
            return
        log.info("stopping debug session %s (pid %d): %s", p.spec.session, p.proc.pid, why)
        p.phase = "stopping"
        p.deadline = time.monotonic() + self.stop_timeout
        p.proc.signal_group(signal.SIGTERM)

    def _finish(self, p: _DebugProc) -> None:
        code = p.proc.poll()
        log.info("debug session %s: worker exited with %s", p.spec.session, code)
        if code and p.phase != "stopping":  # it ended on its own: tell the controller why
            log_path = self.workdir / f"{p.spec.session}.log"
            why = f"the debug worker on {self.host} exited with {code}: {last_line(log_path)}"
            try:
                report_failure(self.c, p.spec.session, why)
            except CoordinatorError as e:
                log.error("debug session %s: cannot report its end: %s", p.spec.session, e)
        try:
            p.bridge.detach(p.spec.tap)
        except (OSError, RuntimeError) as e:
            log.error("cannot remove port %s: %s", p.spec.tap, e)
        p.proc.close_log()
        del self.procs[p.spec.session]

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop every debug worker and remove their ports (agent shutdown)."""
        for p in list(self.procs.values()):
            self.begin_stop(p, "agent shutdown")
        deadline = time.monotonic() + (timeout if timeout is not None else self.stop_timeout + 5)
        while self.procs and time.monotonic() < deadline:
            self.supervise()
            time.sleep(0.05)


def last_line(path: Path) -> str:
    """The last non-empty line of a log (what a failed process said last)."""
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError as e:
        return f"(no log: {e})"
    return lines[-1].strip() if lines else "(its log is empty)"
