"""Worker agent against real Open vSwitch: launch, attach, exit, kill, shutdown, restart.

One userspace bridge (``datapath_type=netdev``, ``fail_mode=secure``), an SQLite
coordinator with a one-host cluster, ``python -m typhoon.agent`` as a
subprocess and topologies submitted through the manager.  Workers are the real
``typhoon.runtime.worker`` with the ``sdn`` transport: each creates its TAP.
They are forked by the agent's zygote (typhoon.agent_launcher), in sessions of
their own, and outlive it; once it is gone they are spawned.
No controller runs, so no flows exist and spouts are never activated: workers
stay up until they are stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from typhoon.cluster import Cluster, HostInfo
from typhoon.coordinator import SqliteCoordinator, WorkerStatus
from typhoon.manager import Manager
from typhoon.runtime.tap import tap_name
from typhoon.topology import PhysicalTopology, load_topology_text

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"

TOPOLOGY = """
name: {name}
spouts:
  - id: src
    operator: sequence_source
    args: {{count: 100}}
bolts:
  - id: sink
    operator: collect
    parallelism: 2
streams:
  - from: src
    to: sink
    grouping: shuffle
"""


@pytest.fixture(scope="session", autouse=True)
def _ovs_started() -> None:
    """Start Open vSwitch if it is installed but not running (before the shared checks)."""
    if os.geteuid() != 0 or not Path(OVS_CTL).exists():
        return
    ok = subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode == 0
    if not ok:
        subprocess.run([OVS_CTL, "start", "--system-id=random"], capture_output=True, timeout=60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def zygote_of(agent: subprocess.Popen) -> psutil.Process:
    """The agent's worker fork server (typhoon.agent_launcher)."""
    children = psutil.Process(agent.pid).children()
    (zygote,) = [p for p in children if "typhoon.runtime.zygote_server" in p.cmdline()]
    assert "--detach" in zygote.cmdline()
    return zygote


def parents(statuses: dict[int, WorkerStatus]) -> set[int]:
    return {psutil.Process(s.pid).ppid() for s in statuses.values()}


class Stack:
    """Bridge + coordinator + agent subprocess(es) of one test; cleans up after itself."""

    def __init__(self, tmp_path: Path, bridge: str, ovs) -> None:
        self.tmp = tmp_path
        self.bridge = bridge
        self.ovs = ovs
        self.db = tmp_path / "coordinator.db"
        self.workdir = tmp_path / "work"
        self.coord = SqliteCoordinator(self.db)
        self.coord.put_cluster(Cluster({"h1": HostInfo("h1", bridge, 1)}))
        self.manager = Manager(self.coord)
        self.agents: list[subprocess.Popen] = []
        self.worker_pids: set[int] = set()
        ovs.run(
            "ovs-vsctl", "add-br", bridge,
            "--", "set", "Bridge", bridge, "datapath_type=netdev", "fail_mode=secure",
        )  # fmt: skip

    # ----- agent ---------------------------------------------------------------------------

    def start_agent(self, *extra: str) -> subprocess.Popen:
        log = open(self.tmp / f"agent-{len(self.agents)}.log", "wb")  # noqa: SIM115
        cmd = [
            sys.executable, "-m", "typhoon.agent", "--host", "h1",
            "--coordinator", str(self.db), "--workdir", str(self.workdir),
            "--stop-timeout", "3", *extra,
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        self.agents.append(proc)

        def published() -> bool:
            state = self.coord.get_agent("h1")
            return proc.poll() is not None or (state is not None and state.pid == proc.pid)

        self.ovs.wait_for(published, 20, what="the agent to publish agents/h1")
        assert proc.poll() is None, self.agent_log()
        return proc

    def stop_agent(self, proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
        if proc.poll() is None:
            proc.send_signal(sig)
        return proc.wait(timeout=20)

    def agent_log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.tmp.glob("agent-*.log"))
        )

    # ----- observations --------------------------------------------------------------------

    def statuses(self, name: str) -> dict[int, WorkerStatus]:
        statuses = self.coord.worker_statuses(name)
        self.worker_pids |= {s.pid for s in statuses.values() if s.pid}
        return statuses

    def wait_states(self, name: str, want: dict[int, str], timeout: float = 30) -> dict:
        def reached():
            statuses = self.statuses(name)
            return statuses if {k: s.state for k, s in statuses.items()} == want else None

        return self.ovs.wait_for(reached, timeout, what=f"statuses {want}\n{self.agent_log()}")

    def ports(self) -> list[str]:
        return self.ovs.run("ovs-vsctl", "list-ports", self.bridge).split()

    def ofport(self, tap: str) -> int:
        return int(self.ovs.run("ovs-vsctl", "get", "Interface", tap, "ofport"))

    def assert_attached(self, physical: PhysicalTopology) -> dict[int, WorkerStatus]:
        statuses = self.wait_states(
            physical.name, {w.worker_id: "attached" for w in physical.workers}
        )
        for w in physical.workers:
            tap = tap_name(physical.app_id, w.worker_id)
            s = statuses[w.worker_id]
            assert (s.port, s.tap, s.host) == (w.port, tap, "h1")
            assert self.ofport(tap) == w.port
            assert _alive(s.pid)
        assert sorted(self.ports()) == sorted(s.tap for s in statuses.values())
        return statuses

    # ----- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        for proc in self.agents:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for pid in self.worker_pids:  # only processes this test's agents started
            if _alive(pid) and str(self.workdir) in Path(f"/proc/{pid}/cmdline").read_text(
                errors="replace"
            ):
                os.kill(pid, signal.SIGKILL)
        self.coord.close()
        self.ovs.run("ovs-vsctl", "--if-exists", "del-br", self.bridge, check=False)


@pytest.fixture
def stack(tmp_path: Path, net_names, ovs) -> Iterator[Stack]:
    s = Stack(tmp_path, net_names.switch("br"), ovs)
    yield s
    s.close()


def topology(net_names, suffix: str = ""):
    return load_topology_text(TOPOLOGY.format(name=f"agent{net_names.token}{suffix}"))


def test_workers_attach_exit_and_leave_with_their_application(stack: Stack, net_names) -> None:
    agent = stack.start_agent()
    physical = stack.manager.submit(topology(net_names))
    assert [w.port for w in physical.workers] == [100, 101, 102]
    statuses = stack.assert_attached(physical)
    assert stack.coord.get_agent("h1").used_ports == [100, 101, 102]
    zygote = zygote_of(agent)
    assert parents(statuses) == {zygote.pid}  # forked, each in a session of its own
    assert all(os.getsid(s.pid) == s.pid for s in statuses.values())

    stack.coord.put("physical/junk", [1, 2, 3])  # bad data: logged and skipped
    stack.ovs.wait_for(
        lambda: "skipping application junk" in stack.agent_log(), 10, what="the agent to skip junk"
    )

    # a worker dies: reported with its signal (relayed by the zygote), port removed,
    # not restarted
    victim = physical.workers[1]
    os.kill(statuses[victim.worker_id].pid, signal.SIGKILL)
    stack.wait_states(physical.name, {1: "attached", 2: "exited", 3: "attached"})
    dead = stack.statuses(physical.name)[victim.worker_id]
    assert dead.exit_code == -signal.SIGKILL
    stack.ovs.wait_for(
        lambda: tap_name(physical.app_id, victim.worker_id) not in stack.ports(), 10,
        what="the dead worker's port to go",
    )  # fmt: skip
    assert stack.coord.get_agent("h1").used_ports == [100, 102]

    # the zygote dies: its children live on, still supervised (their end has no code now)
    zygote.kill()
    stack.ovs.wait_for(
        lambda: "worker zygote gone" in stack.agent_log(), 10, what="the agent to see it go"
    )
    assert all(_alive(s.pid) for k, s in statuses.items() if k != victim.worker_id)
    assert {k: s.state for k, s in stack.statuses(physical.name).items()} == {
        1: "attached",
        2: "exited",
        3: "attached",
    }

    # kill the application: processes gone, ports removed, statuses cleaned
    stack.manager.kill(physical.name)
    assert stack.manager.wait_stopped(physical.name, timeout=20), stack.agent_log()
    assert stack.statuses(physical.name) == {}
    assert stack.ports() == []
    assert not any(_alive(s.pid) for s in statuses.values())
    assert stack.coord.get_agent("h1").workers == {}

    assert stack.stop_agent(agent) == 0
    assert stack.coord.get_agent("h1") is None


def test_agent_shutdown_stops_its_workers(stack: Stack, net_names) -> None:
    agent = stack.start_agent()
    physical = stack.manager.submit(topology(net_names))
    statuses = stack.assert_attached(physical)
    assert stack.stop_agent(agent, signal.SIGINT) == 0
    assert stack.ports() == []
    assert not any(_alive(s.pid) for s in statuses.values())
    after = stack.statuses(physical.name)
    assert {s.state for s in after.values()} == {"exited"}
    assert {s.error for s in after.values()} == {"stopped by agent shutdown"}
    assert {s.exit_code for s in after.values()} == {0}  # the workers stopped cleanly
    assert stack.coord.get_agent("h1") is None


def test_restarted_agent_adopts_live_workers(stack: Stack, net_names) -> None:
    first = stack.start_agent()
    physical = stack.manager.submit(topology(net_names))
    statuses = stack.assert_attached(physical)
    zygote = zygote_of(first)
    assert parents(statuses) == {zygote.pid}
    stack.stop_agent(first, signal.SIGKILL)  # workers live on in their own sessions
    zygote.wait(10)  # it ends on its agent's EOF; its children do not
    assert all(_alive(s.pid) for s in statuses.values())

    stack.start_agent()
    assert stack.coord.get_agent("h1").workers == {physical.name: [1, 2, 3]}
    adopted = stack.assert_attached(physical)
    assert {k: s.pid for k, s in adopted.items()} == {k: s.pid for k, s in statuses.items()}
    stack.manager.kill(physical.name)
    assert stack.manager.wait_stopped(physical.name, timeout=20), stack.agent_log()
    assert stack.ports() == []
    assert not any(_alive(s.pid) for s in statuses.values())


def test_worker_without_a_tap_is_stopped_and_reported(stack: Stack, net_names) -> None:
    never_taps = f"{sys.executable} -c 'import time; time.sleep(120)'"
    stack.start_agent("--worker-cmd", never_taps, "--tap-timeout", "1")
    physical = stack.manager.submit(topology(net_names))
    stack.wait_states(physical.name, {1: "exited", 2: "exited", 3: "exited"}, timeout=20)
    for s in stack.statuses(physical.name).values():
        tap = tap_name(physical.app_id, s.worker_id)
        assert s.error == f"TAP {tap} did not appear within 1 s"
        assert s.exit_code == -signal.SIGTERM
        assert not _alive(s.pid)
    assert stack.ports() == []


def test_worker_frames_follow_the_fabric_mtu(stack: Stack, net_names) -> None:
    """A cluster file's fabric (here 1450: VXLAN on a 1500-byte underlay) sets the
    workers' frame size and their TAPs' MTU; a topology may ask for less, not more."""
    stack.coord.put_cluster(Cluster({"h1": HostInfo("h1", stack.bridge, 1)}, mtu=1450))
    agent = stack.start_agent()
    small = topology(net_names, "s")
    small.config["sdn"] = {"mtu": 1200}
    big = topology(net_names, "b")
    big.config["sdn"] = {"mtu": 9000}
    zygote = zygote_of(agent)
    for i, (topo, want) in enumerate(((topology(net_names), 1450), (small, 1200), (big, 1450))):
        physical = stack.manager.submit(topo)
        statuses = stack.assert_attached(physical)
        # the first forked; then the zygote is killed and the others are spawned
        assert parents(statuses) == {zygote.pid if i == 0 else agent.pid}
        if i == 0:
            zygote.kill()
            zygote.wait(10)
        for w in physical.workers:
            spec = stack.workdir / physical.name / f"worker-{w.worker_id}.spec.json"
            assert json.loads(spec.read_text())["transport"]["mtu"] == want
            tap = tap_name(physical.app_id, w.worker_id)
            assert int(Path(f"/sys/class/net/{tap}/mtu").read_text()) == want
        stack.manager.kill(physical.name)
        assert stack.manager.wait_stopped(physical.name, timeout=20), stack.agent_log()
    assert stack.agent_log().count("spawned, not forked: the zygote is gone") == 1  # one line
    assert stack.stop_agent(agent) == 0
