"""The Redis and PostgreSQL servers of ``typhoon bench --only connectors``: throwaway ones.

Debian's ``redis-server`` and ``postgresql`` (``scripts/setup.sh`` installs them and
leaves their services stopped), each on a free loopback port with a temporary data
directory, stopped and removed by ``close()``.  PostgreSQL refuses to run as root, so
its cluster belongs to the ``postgres`` user (``runuser``).  The sdn workers run in the
root namespace, so loopback reaches them.  The tests have their own copy with pytest's
failures (``tests/dbservers.py``); a missing server here is a RuntimeError sentence.
"""

from __future__ import annotations

import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from typhoon.operators.sources import generate_sentences

START_TIMEOUT = 30.0
STREAM = "sentences"
TABLE = "word_counts"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM redis-server if the benchmark dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {START_TIMEOUT:.0f} s")
        time.sleep(0.05)


class LocalServers:
    """A Redis and a PostgreSQL server of the benchmark's own, with the wordcount's stream
    and table (``redis_url``, ``pg_dsn`` for the topology)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="typhoon-bench-redis-"))
        self.pg_dir = Path(tempfile.mkdtemp(prefix="typhoon-bench-pg-"))  # postgres's own
        self.redis_proc: subprocess.Popen | None = None
        self.pg_data: Path | None = None
        self.redis_port, self.pg_port = _free_port(), _free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.pg_dsn = f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"
        try:
            self._start_redis()
            self._start_postgres()
        except BaseException:
            self.close()
            raise

    def _start_redis(self) -> None:
        import redis

        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (scripts/setup.sh installs it)")
        self.redis_proc = subprocess.Popen(
            [binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir",
             str(self.dir), "--save", "", "--appendonly", "no", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )  # fmt: skip

        def up() -> bool:
            try:
                return bool(redis.Redis.from_url(self.redis_url).ping())
            except redis.ConnectionError:
                return False

        _until(up, f"redis-server on port {self.redis_port}")

    def _as_postgres(self, *argv: str) -> subprocess.CompletedProcess:
        cmd = list(argv)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def _start_postgres(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not found:
            raise RuntimeError("PostgreSQL is not installed (scripts/setup.sh installs it)")
        bindir = Path(found[-1]).parent
        pgdir = self.pg_dir
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(pgdir, user.pw_uid, user.pw_gid)
        pgdir.chmod(0o700)
        data = pgdir / "data"
        p = self._as_postgres(str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                              "-U", "postgres", "--no-sync")  # fmt: skip
        if p.returncode != 0:
            raise RuntimeError(f"initdb failed: {p.stderr.strip()}")
        opts = f"-p {self.pg_port} -k {pgdir} -c listen_addresses=127.0.0.1"
        p = self._as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-l",
                              str(pgdir / "server.log"), "-o", opts, "-w", "start")  # fmt: skip
        if p.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {p.stderr.strip() or p.stdout.strip()}")
        self.pg_data, self.pg_bin = data, bindir

    def prepare(self, sentences: int, seed: int) -> Counter:
        """The stream of ``sentences`` generated sentences and an empty table; returns the
        reference word counts (the sink appends ``(word, 1..count)``)."""
        import redis

        client = redis.Redis.from_url(self.redis_url)
        client.delete(STREAM)
        want: Counter = Counter()
        pipe = client.pipeline(transaction=False)
        for i, s in enumerate(generate_sentences(sentences, seed=seed, words=6)):
            pipe.xadd(STREAM, {"line": s})
            want.update(s.split())
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
        client.close()
        with self._connect() as c:
            c.execute(f"DROP TABLE IF EXISTS {TABLE}")
            c.execute(f"CREATE TABLE {TABLE} (word text NOT NULL, n bigint NOT NULL)")
        return want

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.pg_dsn, autocommit=True)

    def clear(self) -> None:
        """An empty table before a run."""
        with self._connect() as c:
            c.execute(f"TRUNCATE {TABLE}")

    def rows(self) -> list[tuple[str, int]]:
        with self._connect() as c:
            return [(w, int(n)) for w, n in c.execute(f"SELECT word, n FROM {TABLE}")]

    def close(self) -> None:
        if self.redis_proc is not None and self.redis_proc.poll() is None:
            self.redis_proc.terminate()
            try:
                self.redis_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.redis_proc.kill()
                self.redis_proc.wait(timeout=10)
        if self.pg_data is not None and (self.pg_data / "postmaster.pid").exists():
            self._as_postgres(
                str(self.pg_bin / "pg_ctl"), "-D", str(self.pg_data), "-m", "fast", "-w", "stop"
            )
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.pg_dir, ignore_errors=True)
