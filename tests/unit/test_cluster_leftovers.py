"""An emulated cluster's close() ends what an agent started, also once that agent is dead
(mininet_env/processes.py ``leftovers``), with real processes standing in for them.

An agent's workers lead sessions of their own (so that a restarted agent adopts
them): stopping the agent's group misses them, and a worker whose agent was
SIGKILLed (a power cut, a crash) lives on until someone ends it.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from mininet_env.fabric import FabricPlan
from mininet_env.processes import leftovers, reap_leftovers
from mininet_env.run import EmulatedCluster, SdnRunOptions
from typhoon.supervised import Supervised

PY = sys.executable
SLEEP = "import time; time.sleep(120)"


def wait_for(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stand_in_agent(workdir: Path, pids: Path) -> list[str]:
    """A process that starts a "worker" as an agent does (a session of its own, its spec
    under the work directory on its command line), the worker a child of its own in
    its group (as a Spark driver starts a JVM), writes both pids, then waits."""
    spec = workdir / "app" / "worker-1.spec.json"
    child = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); {SLEEP}"
    code = (
        "import subprocess, sys, time, psutil\n"
        f"w = subprocess.Popen([sys.executable, '-c', {child!r}, {str(spec)!r}],"
        " start_new_session=True)\n"
        "while not psutil.Process(w.pid).children(): time.sleep(0.02)\n"
        "kid = psutil.Process(w.pid).children()[0].pid\n"
        f"open({str(pids)!r}, 'w').write(f'{{w.pid}} {{kid}}')\n"
        "time.sleep(120)\n"
    )
    return [PY, "-c", code]


def test_close_ends_the_workers_of_an_agent_that_died(tmp_path):
    workdir = tmp_path / "run"
    plan = FabricPlan(hosts=1, prefix=f"ty{secrets.token_hex(2)}u")  # no such bridge exists
    cluster = EmulatedCluster(SdnRunOptions(plan=plan, workdir=workdir, live=False))
    pids = tmp_path / "pids"
    agent = Supervised.start("agent-h1", stand_in_agent(workdir, pids), tmp_path / "agent.log")
    cluster.agents.append(agent)
    worker, kid = map(int, wait_for(lambda: pids.exists() and pids.read_text().split()))
    # not the zygote's name: a forked worker's title is read the same way
    wait_for(lambda: str(workdir) in " ".join(psutil.Process(worker).cmdline()))
    agent.stop(timeout=5, sig=signal.SIGKILL)  # as fail_host does; its group goes with it
    assert not agent.alive() and running(worker) and running(kid)
    # a process that names the work directory without leading a session (someone's
    # `tail -f`) and one that leads a session naming another directory are not the cluster's
    log = workdir / "agent-h1.log"
    log.write_text("")
    tail = subprocess.Popen(["tail", "-f", str(log)])
    other = subprocess.Popen([PY, "-c", SLEEP, str(tmp_path / "elsewhere" / "x.spec.json")],
                             start_new_session=True)  # fmt: skip
    try:
        cluster.close()
        assert not running(worker) and not running(kid)
        assert tail.poll() is None and other.poll() is None
    finally:
        for p in (tail, other):
            p.kill()
            p.wait()
        for pid in (worker, kid):
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_leftovers_are_found_by_a_forked_workers_title(tmp_path):
    """A worker forked by an agent's zygote has one process title (setproctitle) with
    its spec paths, not an argument list: it is found as a spawned one is."""
    title = f"{PY} -m typhoon.runtime.worker {tmp_path / 'app' / 'worker-3.spec.json'}"
    code = f"import setproctitle, time; setproctitle.setproctitle({title!r}); time.sleep(120)"
    p = subprocess.Popen([PY, "-c", code], start_new_session=True)
    try:
        found = wait_for(lambda: [q.pid for q in leftovers(tmp_path)])
        assert found == [p.pid]
        assert reap_leftovers(tmp_path) == [p.pid]
        assert p.wait(10) == -signal.SIGKILL
        assert leftovers(tmp_path) == [] and reap_leftovers(tmp_path) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
