"""The worker fork server (typhoon.zygote, typhoon/runtime/zygote_server.py) as real
processes: a live zygote refuses bad requests and keeps forking; a forked worker
exits, logs and shows itself as a spawned one; a tcp run's workers are its children,
die with it, a relaunch is forked while it lives and spawned once it died (and the log
says so)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from typhoon.supervised import command_line
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology
from typhoon.zygote import ForkJob, Zygote, ZygoteChild

ROOT = Path(__file__).resolve().parents[2]
WORKER = [sys.executable, "-m", "typhoon.runtime.worker"]


def refused(z: Zygote, data: bytes, fds: list[int]) -> str:
    """Send one raw message; the zygote's refusal (AssertionError: none in 10 s)."""
    z.replies.clear()
    socket.send_fds(z.sock, [data], fds)
    deadline = time.monotonic() + 10
    while not z.replies and time.monotonic() < deadline and z.gone is None:
        z.pump(0.1)
    (r,) = z.replies.values()
    assert r.op == "refused", r
    return r.error


def test_a_live_zygote_refuses_bad_requests_and_forks_a_worker_that_fails_as_spawned(
    tmp_path: Path,
) -> None:
    z = Zygote(tmp_path / "zygote.log")
    log = open(tmp_path / "bad.log", "wb")  # noqa: SIM115
    try:
        assert z.wait_ready(), z.gone
        fd = log.fileno()
        good = {"op": "fork", "id": 1, "specs": [str(tmp_path / "worker-1.spec.json")]}
        assert "not JSON" in refused(z, b"\x00garbage", [fd])
        assert "unknown op" in refused(z, json.dumps({**good, "op": "exec"}).encode(), [fd])
        assert "descriptor, not 0" in refused(z, json.dumps(good).encode(), [])
        assert "descriptor, not 2" in refused(z, json.dumps(good).encode(), [fd, fd])
        argv = {**good, "argv": ["/bin/sh", "-c", "touch /tmp/owned"]}
        assert "unknown fields" in refused(z, json.dumps(argv).encode(), [fd])
        assert "truncated" in refused(z, b"x" * (70 * 1024), [fd])
        assert z.proc.poll() is None and z.gone is None  # still serving
        assert (tmp_path / "zygote.log").read_text().count("refused a request") == 6

        # a spec that is not there: the forked worker fails as a spawned one does
        missing = str(tmp_path / "worker-9.spec.json")
        with open(tmp_path / "forked.log", "wb") as out:
            child = z.fork(ForkJob("worker", [missing]), out.fileno())
        assert isinstance(child, ZygoteChild)
        assert child.wait(30) == 1
        with open(tmp_path / "spawned.log", "wb") as out:
            spawned = subprocess.run([*WORKER, missing], stdout=out, stderr=subprocess.STDOUT)
        assert spawned.returncode == 1
        for name in ("forked.log", "spawned.log"):
            last = (tmp_path / name).read_text().strip().splitlines()[-1]
            assert last.startswith("FileNotFoundError") and missing in last, (name, last)
    finally:
        log.close()
        z.close()
    assert z.proc.returncode == 0  # it ends on its socket's EOF


def test_tcp_workers_are_the_zygotes_titled_children_and_spawned_once_it_died(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "typhoon.zygote")
    topology = load_topology(ROOT / "topologies" / "wordcount.yaml")
    c = TcpCluster(topology, RunOptions(hosts=["h1", "h2"], live=False), workdir=tmp_path)
    try:
        c.start()  # not activated: every worker waits, alive
        assert c.zygote is not None
        zpid = c.zygote.zygote.proc.pid
        for wid, p in c.procs.items():
            proc = psutil.Process(p.pid)
            assert proc.ppid() == zpid
            spec = str(tmp_path / f"worker-{wid}.spec.json")
            assert command_line(proc.cmdline()) == [*WORKER, spec]
        assert c.zygote.forked == len(c.procs) and c.zygote.spawned == 0
        victim = min(c.procs)
        c.procs[victim].kill()  # by pid, as the tcp runner's failure handling does
        assert c.procs[victim].wait(10) == -signal.SIGKILL
        forked = c.zygote.forked
        c.launch_workers([victim])  # a relaunch while the zygote lives: forked too
        assert isinstance(c.procs[victim].proc, ZygoteChild)
        assert psutil.Process(c.procs[victim].pid).ppid() == zpid
        assert c.zygote.forked == forked + 1 and c.zygote.spawned == 0
        c.procs[victim].kill()
        assert c.procs[victim].wait(10) == -signal.SIGKILL

        os.kill(zpid, signal.SIGKILL)  # the rest die with it (PDEATHSIG), so reported
        for wid, p in c.procs.items():
            assert p.wait(10) == -signal.SIGKILL, wid
        c.launch_workers([victim])  # a relaunch: spawned, and the log says the zygote is gone
        assert isinstance(c.procs[victim].proc, subprocess.Popen)
        assert c.procs[victim].poll() is None
        assert c.zygote.spawned == 1
        assert "worker zygote gone" in caplog.text
        assert f"worker-{victim}: spawned, not forked: the zygote is gone" in caplog.text
    finally:
        c.close()


def test_an_agents_zygote_forks_a_debug_worker_that_fails_as_a_spawned_one(
    tmp_path: Path,
) -> None:
    """An agent's zygote forks the live debugger's debug worker, whose exit code and log
    come back as a spawned one's (a spec with neither a report URL nor a coordinator:
    exit 2); the debug worker's modules are imported on that first request."""
    from typhoon.debug.spec import DebugSpec

    z = Zygote(tmp_path / "zygote.log", transport="sdn", detach=True)
    spec = tmp_path / "debug" / "ab12cd.spec.json"
    spec.parent.mkdir()
    DebugSpec(
        session="ab12cd", key="k" * 32, app="wc", app_id=1, worker=2, workers={2: ("split", 0)},
        fields={}, direction="out", host="h1", port=65000, tap="tdbgab12cd", report_url="",
    ).save(spec)  # fmt: skip
    try:
        assert z.wait_ready(), z.gone
        with open(tmp_path / "forked.log", "wb") as out:
            child = z.fork(ForkJob("debug", [str(spec)]), out.fileno())
        assert child.wait(30) == 2
        with open(tmp_path / "spawned.log", "wb") as out:
            argv = [sys.executable, "-m", "typhoon.debug.worker", str(spec)]
            spawned = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT)
        assert spawned.returncode == 2
        for name in ("forked.log", "spawned.log"):
            last = (tmp_path / name).read_text().strip().splitlines()[-1]
            assert "no report_url and no coordinator" in last, (name, last)
        assert "refused" not in (tmp_path / "zygote.log").read_text()
    finally:
        z.close()
