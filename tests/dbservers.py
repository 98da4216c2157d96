"""Real, throwaway Redis, PostgreSQL and NATS servers for the connector tests.

Debian's ``redis-server``, ``postgresql`` and ``nats-server`` (``scripts/setup.sh`` installs them;
their system services stay stopped): each test server listens on a free port of
its own with a temporary data directory, and is stopped by the fixture.
PostgreSQL refuses to run as root, so its cluster belongs to the ``postgres``
user (``runuser``).  A missing installation is a test failure, not a skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from serverprocs import die_with_parent, free_port, stop_process

START_TIMEOUT = 30.0


def _binary(name: str) -> str:
    """The server binary ``name`` (Debian's package of that name), or a test failure."""
    binary = shutil.which(name)
    if binary is None:
        pytest.fail(
            f"{name} is not installed: the connector tests need Debian's `{name}` package "
            "(scripts/setup.sh installs it)",
            pytrace=False,
        )
    return binary


def _in_tempdir(cls, prefix: str, address: str):  # noqa: ANN001, ANN202
    """A ``cls`` server on a free port with a new temporary directory, started."""
    server = cls(free_port(), Path(tempfile.mkdtemp(prefix=prefix)), address)
    server.start()
    return server


def _wait(check, what: str, proc: subprocess.Popen | None = None) -> None:  # noqa: ANN001
    deadline = time.monotonic() + START_TIMEOUT
    while not check():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} while starting", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not start within {START_TIMEOUT:.0f} s", pytrace=False)
        time.sleep(0.05)


@dataclass
class Spawned:
    """A server that is one child process of pytest's, on ``port`` with ``workdir``."""

    port: int
    workdir: Path
    address: str = "127.0.0.1"
    proc: subprocess.Popen | None = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


@dataclass
class RedisServer(Spawned):
    @property
    def url(self) -> str:
        return f"redis://{self.address}:{self.port}/0"

    def client(self):  # noqa: ANN201
        import redis

        return redis.Redis(host=self.address, port=self.port)

    def start(self) -> None:
        binary = _binary("redis-server")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", self.address, "--dir",
             str(self.workdir), "--save", "", "--appendonly", "no", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )  # fmt: skip

        def up() -> bool:
            try:
                return bool(self.client().ping())
            except Exception:
                return False

        _wait(up, f"redis-server on port {self.port}", self.proc)


def start_redis(address: str = "127.0.0.1") -> RedisServer:
    return _in_tempdir(RedisServer, "typhoon-redis-", address)


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        pytest.fail(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/pg_ctl): the connector "
            "tests need Debian's `postgresql` package (scripts/setup.sh installs it)",
            pytrace=False,
        )
    return Path(found[-1]).parent


@dataclass
class PostgresServer:
    port: int
    workdir: Path  # owned by the postgres user
    address: str = "127.0.0.1"
    user: str = "postgres"
    log: list[str] = field(default_factory=list)

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@{self.address}:{self.port}/postgres"

    def _as_user(self, *argv: str) -> subprocess.CompletedProcess:
        cmd = list(argv)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def connect(self):  # noqa: ANN201
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def start(self) -> None:
        bindir = _pg_bin()
        data = self.workdir / "data"
        if not data.exists():
            p = self._as_user(str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                              "-U", self.user, "--no-sync")  # fmt: skip
            if p.returncode != 0:
                pytest.fail(f"initdb failed: {p.stderr.strip()}", pytrace=False)
        opts = (
            f"-p {self.port} -k {self.workdir} -c listen_addresses={self.address} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        logfile = str(self.workdir / "server.log")
        p = self._as_user(
            str(bindir / "pg_ctl"), "-D", str(data), "-l", logfile, "-o", opts, "-w", "start"
        )
        if p.returncode != 0:
            logfile = self.workdir / "server.log"
            tail = logfile.read_text(errors="replace")[-2000:] if logfile.exists() else ""
            pytest.fail(f"pg_ctl start failed: {p.stdout} {p.stderr} {tail}", pytrace=False)

    def stop(self, mode: str = "fast") -> None:
        data = self.workdir / "data"
        if (data / "postmaster.pid").exists():
            self._as_user(str(_pg_bin() / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "stop")


def start_postgres(address: str = "127.0.0.1") -> PostgresServer:
    workdir = Path(tempfile.mkdtemp(prefix="typhoon-pg-"))
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.fail("there is no `postgres` user: install Debian's `postgresql`", pytrace=False)
    if os.geteuid() == 0:
        os.chown(workdir, user.pw_uid, user.pw_gid)
    workdir.chmod(0o700)
    server = PostgresServer(free_port(), workdir, address)
    server.start()
    return server


@dataclass
class NatsServer(Spawned):
    """``nats-server -js`` with its JetStream store in ``workdir`` (it survives a restart)."""

    @property
    def url(self) -> str:
        return f"nats://{self.address}:{self.port}"

    def _up(self) -> bool:
        try:
            with socket.create_connection((self.address, self.port), timeout=1) as s:
                s.settimeout(1)
                return s.recv(4).startswith(b"INFO")  # the server greets every client
        except OSError:
            return False

    def start(self) -> None:
        binary = _binary("nats-server")
        with open(self.workdir / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [binary, "-js", "-a", self.address, "-p", str(self.port),
                 "-sd", str(self.workdir / "store")],
                stdout=subprocess.DEVNULL,
                stderr=log,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        _wait(self._up, f"nats-server on port {self.port}", self.proc)


def start_nats(address: str = "127.0.0.1") -> NatsServer:
    return _in_tempdir(NatsServer, "typhoon-nats-", address)


def remove(server: RedisServer | PostgresServer | NatsServer) -> None:
    server.stop()
    shutil.rmtree(server.workdir, ignore_errors=True)
