"""Shared fixtures for integration tests: real Open vSwitch, Ryu and Mininet.

Every test in this directory is marked `integration`. The tests need root; not
being root, like a missing or stopped Open vSwitch, is a failure, not a skip:
`make test` must not pass with its integration half unrun (`make setup` starts
OVS; run it as root).

Fixtures only ever remove what they created: bridges and links whose names
carry the test's own random prefix, and the ryu-manager processes they started.
"""

import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from serverprocs import free_port, stop_process

from mininet_env.processes import ryu_manager as controller_command

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)


def run(*cmd: str, check: bool = True, timeout: float = 20) -> str:
    """Run a command, return its stdout; raise with its stderr on failure."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Poll `predicate` until it returns a truthy value; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Ovs:
    """Read-only views of the running Open vSwitch, for assertions."""

    run = staticmethod(run)
    wait_for = staticmethod(wait_for)

    @staticmethod
    def controller_connected(bridge: str) -> bool:
        """Is `bridge` connected to (one of) its OpenFlow controller(s)?"""
        out = run("ovs-vsctl", "get", "Bridge", bridge, "controller")
        return any(
            run("ovs-vsctl", "get", "Controller", uuid, "is_connected").strip() == "true"
            for uuid in re.findall(r"[0-9a-f-]{36}", out)
        )

    @staticmethod
    def flows(bridge: str) -> list[str]:
        """The rules of `bridge` as `ovs-ofctl -O OpenFlow13 dump-flows` prints them."""
        out = run("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge)
        return [line.strip() for line in out.splitlines() if "cookie=" in line]


@pytest.fixture(scope="session")
def ovs() -> Ovs:
    """Open vSwitch is installed and running (fails, does not skip)."""
    for tool in ("ovs-vsctl", "ovs-ofctl", "mnexec"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: run `make setup`")
    try:
        run("ovs-vsctl", "--timeout=5", "show")
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"Open vSwitch is not running (run `make setup`): {e}")
    return Ovs()


@pytest.fixture(autouse=True)
def _integration_prerequisites(request):
    if os.geteuid() != 0:
        pytest.fail(
            "integration tests need root (Open vSwitch, Mininet, network namespaces): "
            "run `make test` as root; a missing prerequisite is a failure, not a skip"
        )
    request.getfixturevalue("ovs")


class NetNames:
    """Unique short names for one test's bridges and links (Linux: ≤ 15 chars).

    Names are `ty<4 hex><suffix>`; Mininet names link ends `<switch>-eth<N>`, so
    keep suffixes short. `cleanup()` removes leftovers with this prefix only.
    """

    def __init__(self):
        self.token = secrets.token_hex(2)
        self.prefix = f"ty{self.token}"

    def switch(self, suffix: str) -> str:
        name = self.prefix + suffix
        assert len(name) + len("-eth99") <= 15, name
        return name

    def dpid(self, index: int) -> str:
        """A 16-hex-digit datapath id: 'ty' magic, the token, then `index`."""
        return f"7479{self.token}{index:08x}"

    def leftover_bridges(self) -> list[str]:
        return [b for b in run("ovs-vsctl", "list-br").split() if b.startswith(self.prefix)]

    def leftover_links(self) -> list[str]:
        out = run("ip", "-o", "link", "show")
        names = re.findall(r"^\d+: ([^:@]+)", out, flags=re.M)
        return [n for n in names if n.startswith(self.prefix)]

    def cleanup(self):
        for bridge in self.leftover_bridges():
            run("ovs-vsctl", "--if-exists", "del-br", bridge, check=False)
        for link in self.leftover_links():
            run("ip", "link", "del", link, check=False)


@pytest.fixture
def net_names():
    names = NetNames()
    yield names
    names.cleanup()


class RyuProcess:
    """A ryu-manager subprocess listening for OpenFlow on 127.0.0.1:`ofp_port`."""

    def __init__(self, apps, log_path: Path):
        self.ofp_port = free_port()
        self.wsapi_port = free_port()
        self.log_path = log_path
        cmd = [
            *controller_command(),  # on os-ken: $TYPHOON_CONTROLLER_BACKEND
            "--ofp-listen-host", "127.0.0.1",
            "--ofp-tcp-listen-port", str(self.ofp_port),
            "--wsapi-host", "127.0.0.1",
            "--wsapi-port", str(self.wsapi_port),
            *apps,
        ]  # fmt: skip
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_listening(self, timeout: float = 30):
        def listening():
            if self.proc.poll() is not None:
                pytest.fail(f"ryu-manager exited {self.proc.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.ofp_port), timeout=0.5):
                    return True
            except OSError:
                return False

        wait_for(listening, timeout, what=f"ryu-manager on port {self.ofp_port}")

    def stop(self):
        stop_process(self.proc)
        self._log.close()


@pytest.fixture
def ryu_manager(tmp_path):
    """Factory: `ryu_manager("apps/typhoon.py", ...)` starts ryu-manager from the repo
    root and waits until it accepts OpenFlow connections. Stopped at teardown."""
    started = []

    def start(*apps: str) -> RyuProcess:
        ryu = RyuProcess(apps, tmp_path / f"ryu-{len(started)}.log")
        started.append(ryu)
        ryu.wait_listening()
        return ryu

    yield start
    for ryu in started:
        ryu.stop()
