"""What the integration tests share: an emulated cluster per module, a ryu-manager
running given apps, and polling until a condition holds.

Imported by test modules as ``from harness import ...`` (pytest puts this
directory on ``sys.path``, as for ``flowdump``).
"""

from __future__ import annotations

import copy
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from serverprocs import stop_process

from mininet_env.fabric import FabricPlan
from mininet_env.processes import free_port, ryu_manager
from mininet_env.run import EmulatedCluster, SdnRunOptions, rest_call
from typhoon.coordinator import Coordinator, open_coordinator
from typhoon.live import data_tuples
from typhoon.report import read_worker_reports
from typhoon.topology import load_topology
from typhoon.topology.model import Topology

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def wait(
    predicate: Callable[[], T],
    timeout: float = 20.0,
    what: str = "condition",
    interval=0.1,
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); fail the test on
    timeout, with what ``explain`` says about the state then (a stack dump, counters)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    detail = f"\n{explain()}" if explain is not None else ""
    pytest.fail(f"timed out after {timeout:g}s waiting for {what}{detail}")


def stacks_of(pid: int) -> str:
    """Every thread's Python stack in process ``pid`` (py-spy dump), for a failure message:
    where a worker that stopped answering is stuck."""
    spy = Path(sys.executable).with_name("py-spy")
    try:
        out = subprocess.run(
            [str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"py-spy dump of {pid} failed: {e}"
    return f"py-spy dump of {pid}:\n{out.stdout}{out.stderr}"


def finish(c: EmulatedCluster, name: str) -> tuple[Topology, list[dict[str, Any]]]:
    """Wait until every worker of ``name`` exited, kill it; its topology and the workers'
    exit reports.  Fails the test unless every worker ever started exited with 0."""
    topology = c.coordinator.get_topology(name)
    clean = c.wait_finished(name)
    statuses = c.coordinator.worker_statuses(name)
    c.kill(name)
    reports = read_worker_reports(c.report_dir(name))
    exits = {w: (s.state, s.exit_code) for w, s in statuses.items()}
    assert clean and {s.exit_code for s in statuses.values()} == {0}, exits
    return topology, reports


@contextmanager
def emulated_cluster(
    workdir: Path,
    tag: str,
    *,
    hosts: int = 3,
    shape: str = "mesh",
    apps: Sequence[str] = (),
    config: str = "metrics_interval = 0.25\n",
    timeout: float = 120,
    **options: Any,
) -> Iterator[EmulatedCluster]:
    """A started Mininet cluster (bridges ``ty<hex><tag>*``), closed on exit.

    ``config`` is the controller's config file text; ``options`` go to
    :class:`SdnRunOptions` as they are."""
    cluster = EmulatedCluster(
        SdnRunOptions(
            plan=FabricPlan(hosts=hosts, shape=shape, prefix=f"ty{secrets.token_hex(2)}{tag}"),
            apps=list(apps),
            live=False,
            timeout=timeout,
            controller_config=config,
            workdir=workdir,
            **options,
        )
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def guaranteed_job(
    file: str, prefix: str, store: Path, source: dict[str, Any] | None = None, **config: Any
) -> Topology:
    """``topologies/FILE`` named ``PREFIX`` and 4 random hex digits (its application ID:
    runs side by side do not share TAP names), its ``source`` node's arguments updated
    with ``source``, checkpoints in ``store`` and ``config`` (e.g. ``guarantee``)."""
    t = copy.deepcopy(load_topology(ROOT / "topologies" / file))
    t.name = f"{prefix}{secrets.token_hex(2)}"
    if source:
        t.nodes["source"].args.update(source)
    t.config.update(checkpoint_store=str(store), **config)
    return t


def run_checkpointed_then(
    c: EmulatedCluster, t: Topology, act: Callable[[Coordinator], T]
) -> tuple[dict[str, Any], T]:
    """``c.run(t)`` while another thread, once a global checkpoint of ``t`` is complete,
    calls ``act`` with a coordinator of its own (sqlite: one per thread) to kill what it
    kills.  The run's report and what ``act`` returned; the test fails if it never ran."""
    done: dict[str, T] = {}

    def kill() -> None:
        coordinator = open_coordinator(c.coordinator_url)
        try:
            wait(
                lambda: (coordinator.get_app_state(t.name) or {}).get("checkpoint"),
                60,
                "a completed global checkpoint",
            )
            done["act"] = act(coordinator)
        finally:
            coordinator.close()

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    report = c.run(t)
    killer.join(timeout=5)
    assert "act" in done, "the kill never happened"
    return report, done["act"]


def sent_then_checkpointed(coordinator: Coordinator, name: str, n: int) -> None:
    """Wait until the first ``source`` worker has sent ``n`` data tuples (its METRIC_RESPs
    in the coordinator), then for the second global checkpoint completed after that:
    a restore goes back mid-run, not to a checkpoint taken before the first tuple."""
    physical = coordinator.get_physical(name)
    wid = physical.of_node("source")[0].worker_id

    def sent() -> int:
        return data_tuples(coordinator.get_metrics(name).get(wid, {}).get("out", {}))

    def epoch() -> int:
        return ((coordinator.get_app_state(name) or {}).get("checkpoint") or {}).get("epoch", -1)

    wait(lambda: sent() >= n, 60, f"{n} tuples sent by the source")
    seen = epoch()
    wait(lambda: epoch() >= seen + 2, 60, f"two global checkpoints after epoch {seen}")


def kill_first(coordinator: Coordinator, name: str, node: str) -> int:
    """SIGKILL the first active worker of ``node``; its worker id."""
    victim = coordinator.get_physical(name).active_of_node(node)[0].worker_id
    os.kill(coordinator.worker_statuses(name)[victim].pid, signal.SIGKILL)
    return victim


@dataclass
class RyuApps:
    """A ryu-manager process started by :func:`ryu_apps`."""

    proc: subprocess.Popen
    url: str  # http://127.0.0.1:<port>/typhoon
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, Any] | None:
        """``GET url+path``, or None while the REST server is not up yet."""
        assert self.proc.poll() is None, self.log()
        try:
            return rest_call(self.url, "GET", path)
        except OSError:
            return None


@contextmanager
def ryu_apps(tmp_path: Path, apps: Sequence[str], config: str = "") -> Iterator[RyuApps]:
    """``ryu-manager --config-file ... <apps>`` from the repository root, with a
    coordinator of its own and API token ``t``; ``config`` is appended to the
    config file.  Terminated on exit."""
    conf = tmp_path / "ryu.conf"
    conf.write_text(f"[typhoon]\ncoordinator = {tmp_path / 'c.db'}\napi_token = t\n{config}")
    port, ofp = free_port(), free_port()
    log_path = tmp_path / "ryu.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*ryu_manager(), "--config-file", str(conf),
             "--wsapi-host", "127.0.0.1", "--wsapi-port", str(port),
             "--ofp-tcp-listen-port", str(ofp), *apps],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            yield RyuApps(proc, f"http://127.0.0.1:{port}/typhoon", log_path)
        finally:
            stop_process(proc)
