"""Child processes of an emulated run: the Ryu controller and one agent per host.

Each starts in its own process group so that stopping it also stops what it
started (an agent's workers), even when the run fails half-way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from controller import backend

REPO = Path(__file__).resolve().parents[1]
CORE_APP = "apps/typhoon_core.py"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ryu_manager() -> list[str]:
    """The controller's command: Ryu's ``ryu-manager``, or controller/manager.py on os-ken."""
    if backend.selected() == backend.OS_KEN:
        return [sys.executable, "-m", "controller.manager"]
    exe = Path(sys.executable).with_name("ryu-manager")
    if not exe.exists():
        raise RuntimeError(f"{exe} not found: run `make setup` first")
    return [str(exe)]


def write_controller_config(path: Path, coordinator: str, extra: str = "") -> Path:
    """The Ryu config file: the ``[typhoon]`` section the controller core reads."""
    path.write_text(f"[typhoon]\ncoordinator = {coordinator}\n{extra}")
    return path


class Child:
    """A started child process with its log file."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self._out = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """Signal the process group, wait, then kill what is left."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._out.close()

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def start_controller(
    workdir: Path,
    coordinator: str,
    apps: list[str],
    ofp_port: int,
    wsapi_port: int,
    extra_config: str = "",
) -> Child:
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
    return Child("controller", argv, workdir / "controller.log")


def start_agent(workdir: Path, coordinator: str, host: str) -> Child:
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
    return Child(f"agent-{host}", argv, workdir / f"agent-{host}.log")


def wait_until(predicate, timeout: float, what: str, children: list[Child] = (), interval=0.1):
    """Poll until ``predicate()`` is truthy; fail early if a child died."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for c in children:
            if not c.alive():
                raise RuntimeError(
                    f"{c.name} exited ({c.proc.returncode}) while waiting for {what}:\n{c.tail()}"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
