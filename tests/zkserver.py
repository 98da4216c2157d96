"""A real, throwaway ZooKeeper server for tests (fixtures in ``tests/conftest.py``).

Debian's ``zookeeper`` package (``scripts/setup.sh`` installs it) run as a
standalone ``ZooKeeperServerMain`` on a free loopback port with its own
dataDir.  A missing installation is a test failure, not a skip: CI must run
the ZooKeeper backend's tests.  The JVM gets ``PR_SET_PDEATHSIG``, so it
stops even when pytest itself is killed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from serverprocs import die_with_parent, free_port, stop_process

ZK_JAR = Path(os.environ.get("TYPHOON_ZK_JAR", "/usr/share/java/zookeeper.jar"))
# Optional slf4j binding, so the server's own log explains a failed start.
SLF4J_SIMPLE = Path("/usr/share/java/slf4j-simple.jar")
ZK_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
START_TIMEOUT = 20.0

# Standalone, loopback only; no admin HTTP server (it would take port 8080); only the
# `srvr` four-letter word (the readiness probe); no fsync (test data is throwaway);
# a short tick so session timeouts (2..20 ticks) allow fast connection-loss tests.
ZOO_CFG = """\
tickTime=500
dataDir={data}
clientPort={port}
clientPortAddress={address}
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr
forceSync=no
preAllocSize=1024
"""


@dataclass
class ZooKeeperServer:
    """One running ZooKeeper server started by the tests."""

    port: int
    workdir: Path
    proc: subprocess.Popen[bytes]
    started_in: float  # seconds from launch until it serves clients
    address: str = "127.0.0.1"

    @property
    def hosts(self) -> str:
        return f"{self.address}:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        path = self.workdir / "zookeeper.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def restart(self) -> None:
        """Start again on the same port and dataDir (the data survives)."""
        self.stop()
        again = start_zookeeper(self.workdir, fixed_port=self.port, address=self.address)
        self.proc, self.started_in = again.proc, again.started_in

    def stop(self) -> None:
        stop_process(self.proc)


def _serving(port: int, address: str = "127.0.0.1") -> bool:
    """Does the server serve clients?  ``srvr`` says so only once its database is loaded.

    Not ``ruok``: ZooKeeper 3.8 answers ``imok`` while still starting, and a client
    that connects then may wait for its whole session timeout (ZooKeeperServer not
    running, and the server fails to close the connection).
    """
    try:
        with socket.create_connection((address, port), timeout=0.5) as s:
            s.sendall(b"srvr")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
    except OSError:
        return False
    return b"Mode: standalone" in reply


def _java() -> str:
    java = shutil.which("java")
    if java is None or not ZK_JAR.is_file():
        pytest.fail(
            f"ZooKeeper is not installed ({ZK_JAR} or `java` missing): the ZooKeeper "
            "coordinator tests need Debian's `zookeeper` package; run `make setup` "
            "(scripts/setup.sh) or `apt-get install zookeeper`",
            pytrace=False,
        )
    return java


def start_zookeeper(
    workdir: Path, fixed_port: int = 0, attempts: int = 3, address: str = "127.0.0.1"
) -> ZooKeeperServer:
    """Start a standalone server in ``workdir`` and wait until it serves clients.

    ``fixed_port`` 0 picks a free one; a given port (a restart) is tried once.
    ``address`` is where it listens (another network namespace's hosts need
    an address of theirs, not loopback).
    """
    java = _java()
    classpath = [str(ZK_JAR)]  # its manifest's Class-Path names the dependencies
    if SLF4J_SIMPLE.is_file():
        classpath.append(str(SLF4J_SIMPLE))
    failure = ""
    for _ in range(1 if fixed_port else attempts):  # a free port may be taken before we bind
        port = fixed_port or free_port()
        data = workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = workdir / "zoo.cfg"
        cfg.write_text(ZOO_CFG.format(data=data, port=port, address=address))
        cmd = [
            java,
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # start fast; the tests are not CPU-bound
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            ":".join(classpath),
            ZK_MAIN,
            str(cfg),
        ]
        t0 = time.monotonic()
        with open(workdir / "zookeeper.log", "ab") as out:  # restarts append
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
            )
        server = ZooKeeperServer(port, workdir, proc, 0.0, address)
        deadline = t0 + START_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            if _serving(port, address):
                server.started_in = time.monotonic() - t0
                return server
            time.sleep(0.05)
        server.stop()
        failure = f"exit code {proc.returncode}; log:\n{server.log_tail()}"
        if "Address already in use" not in failure:
            break
    pytest.fail(
        f"ZooKeeper did not start serving within {START_TIMEOUT:g}s: {' '.join(cmd)}\n{failure}",
        pytrace=False,
    )
