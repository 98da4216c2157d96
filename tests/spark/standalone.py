"""A Spark standalone cluster on this machine, from the installed pyspark distribution.

pyspark ships Spark's jars and ``bin/spark-class``, which is all a standalone
master and worker need (no separate Spark download).  Both listen on loopback
at free ports; the worker offers few cores and little memory, so a test's
driver asks for executors that fit (``executor_conf``).  Every JVM runs in its
own process group, which ``stop`` signals, so executors the worker started go
with it even when the test fails half-way.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER_CORES = 2
WORKER_MEMORY_MB = 1024
EXECUTOR_MEMORY_MB = 512  # one executor per worker core count, within WORKER_MEMORY_MB
DAEMON_MEMORY = "256m"  # the master and worker JVMs themselves


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise RuntimeError(f"{home}/bin/spark-class missing: pyspark without its distribution?")
    return home


@dataclass
class StandaloneCluster:
    workdir: Path
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    worker_ui_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def executor_conf(self) -> dict[str, str]:
        """What a driver sets to run on this cluster: its master and executors that fit."""
        return {
            "spark.master": self.url,
            "spark.driver.host": "127.0.0.1",
            "spark.executor.memory": f"{EXECUTOR_MEMORY_MB}m",
            "spark.executor.cores": str(WORKER_CORES),
            "spark.cores.max": str(WORKER_CORES),
        }

    def _start(self, name: str, *args: str) -> None:
        home = spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_LOG_DIR": str(self.workdir),
        }
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(
            [str(home / "bin" / "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        log.close()  # the child holds its own descriptor

    def state(self) -> dict[str, Any]:
        """The master's view (its web UI's JSON): workers, running and completed apps."""
        url = f"http://127.0.0.1:{self.master_ui_port}/json/"
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())

    def start(self, timeout: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1",
            "--port", str(self.master_port),
            "--webui-port", str(self.master_ui_port),
        )  # fmt: skip
        self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1",
            "--webui-port", str(self.worker_ui_port),
            "--cores", str(WORKER_CORES),
            "--memory", f"{WORKER_MEMORY_MB}m",
            "--work-dir", str(self.workdir / "work"),
            self.url,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"spark {name} exited {p.returncode}:\n{self.tail(name)}")
            try:
                if self.state().get("aliveworkers", 0) >= 1:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no worker registered with {self.url} in {timeout:.0f} s:\n"
                    f"{self.tail('master')}\n{self.tail('worker')}"
                )
            time.sleep(0.3)

    def tail(self, name: str, lines: int = 20) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """SIGTERM each JVM's process group (the worker's holds its executors), then SIGKILL."""
        for p in self.procs.values():
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p, signal.SIGKILL)  # what is left of the group, executors included
            p.wait()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
