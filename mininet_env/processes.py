"""Child processes of an emulated run: the Ryu controller and one agent per host.

Each starts in a session of its own so that stopping it also stops what it
started in its group.  An agent's workers are not in its group: they start
sessions of their own (typhoon.agent_launcher) so that a restarted agent adopts
them, and they outlive an agent that dies.  What the agents started and left
behind is found by :func:`leftovers` and ended by :func:`reap_leftovers`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import psutil

from controller.framework import backend
from typhoon.private_files import write_private
from typhoon.supervised import Supervised, command_line

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
CORE_APP = "apps/typhoon_core.py"
# how often a start-up wait looks again: each look is a socket connect or one ovs-vsctl
POLL_S = 0.02
# The controller's environment.  Ryu monkey-patches with eventlet, which by default
# imports dnspython for a green resolver (0.25 s of CPU here) and, for one version
# comparison, distutils, which setuptools' shim makes a load of setuptools (0.15 s).
# An emulated cluster's controller resolves no names (its listeners, bridges and
# coordinator are numeric addresses or a file; a name would still resolve, through
# the C library) and the standard library's distutils has the same LooseVersion:
# together about a quarter of its start, on two cores it shares with every agent.
CONTROLLER_ENV = {"EVENTLET_NO_GREENDNS": "yes", "SETUPTOOLS_USE_DISTUTILS": "stdlib"}


class PhaseClock:
    """Seconds per step, written into ``phases`` as each step ends (``lap(name)``)."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases = phases
        self.last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(now - self.last, 3)
        self.last = now


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ryu_manager() -> list[str]:
    """The controller's command: Ryu's ``ryu-manager``, or controller/framework/launcher.py
    on os-ken."""
    if backend.selected() == backend.OS_KEN:
        return [sys.executable, "-m", "controller.framework.launcher"]
    exe = Path(sys.executable).with_name("ryu-manager")
    if not exe.exists():
        raise RuntimeError(f"{exe} not found: run `make setup` first")
    return [str(exe)]


def write_controller_config(path: Path, coordinator: str, extra: str = "") -> Path:
    """The Ryu config file: the ``[typhoon]`` section the controller core reads."""
    write_private(path, f"[typhoon]\ncoordinator = {coordinator}\n{extra}")  # api_token
    return path


def start(name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> Supervised:
    """A child in the repository, in a session of its own, its output appended to ``log``;
    ``env``: variables added to this process's environment."""
    return Supervised.start(name, argv, log, cwd=REPO, env={**os.environ, **env} if env else None)


def start_controller(
    workdir: Path,
    coordinator: str,
    apps: list[str],
    ofp_port: int,
    wsapi_port: int,
    extra_config: str = "",
) -> Supervised:
    conf = write_controller_config(workdir / "controller.conf", coordinator, extra_config)
    argv = [
        *ryu_manager(),
        "--ofp-tcp-listen-port",
        str(ofp_port),
        "--wsapi-host",
        "127.0.0.1",
        "--wsapi-port",
        str(wsapi_port),
        "--config-file",
        str(conf),
        CORE_APP,
        *apps,
    ]
    return start("controller", argv, workdir / "controller.log", CONTROLLER_ENV)


def start_agent(workdir: Path, coordinator: str, host: str) -> Supervised:
    argv = [
        sys.executable,
        "-m",
        "typhoon.agent",
        "--host",
        host,
        "--coordinator",
        coordinator,
        "--workdir",
        str(workdir),
    ]
    return start(f"agent-{host}", argv, workdir / f"agent-{host}.log")


def wait_until(predicate, timeout: float, what: str, children: list[Supervised] = (), interval=0.1):
    """Poll until ``predicate()`` is truthy; fail early if a child died."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for c in children:
            if not c.alive():
                raise RuntimeError(
                    f"{c.name} exited ({c.returncode}) while waiting for {what}:\n{c.tail()}"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def leftovers(workdir: Path) -> list[psutil.Process]:
    """The processes an emulated cluster's agents started, still running.

    Whatever an agent starts -- a worker or chain (forked by its zygote, or
    spawned), a debug worker, an engine service -- leads a session of its own
    and names a file under the cluster's work directory on its command line (a
    spec, a plan), whichever agent started it and whether or not that agent
    still lives; no agent record or pid file is needed, so a worker forked a
    moment before its agent died is found too.  This process and its ancestors
    are never among them.
    """
    under = str(workdir.resolve()) + os.sep
    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    found = []
    for pid in psutil.pids():
        try:
            if pid in spared or os.getsid(pid) != pid:  # first the cheap test: one syscall
                continue
            p = psutil.Process(pid)
            args = command_line(p.cmdline())
            if any(a.startswith(under) for a in args) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (OSError, psutil.Error):  # ended meanwhile
            continue
    return found


def reap_leftovers(workdir: Path, timeout: float = 10.0) -> list[int]:
    """SIGKILL every process of :func:`leftovers` with its session's group (what it
    started); returns their pids once they are gone (a worker's TAP goes with it), or
    after ``timeout`` s, saying which still run."""
    procs = leftovers(workdir)
    for p in procs:
        try:
            if p.is_running():  # not a pid reused since the scan
                log.warning("pid %d outlived its agent: SIGKILL (%s)", p.pid, " ".join(p.cmdline()))
                os.killpg(p.pid, signal.SIGKILL)
        except (OSError, psutil.Error):
            pass
    deadline = time.monotonic() + timeout
    while live := [p for p in procs if _running(p)]:
        if time.monotonic() > deadline:
            log.error("pids %s still run %g s after SIGKILL", [p.pid for p in live], timeout)
            break
        time.sleep(POLL_S)
    return [p.pid for p in procs]


def _running(p: psutil.Process) -> bool:
    """Not ended (a zombie has: it waits only for its new parent to reap it)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
