"""Three "machines" joined only by VXLAN, run the way docs/deploy.md deploys them.

Each machine is a network namespace with its own Open vSwitch (``machines.py``),
an address on an IP underlay, its bridge configured by ``typhoon cluster
apply`` from one cluster file (VXLAN tunnels to the other two), and a
``typhoon-agent`` started with the command line of
deploy/systemd/typhoon-agent.service.  ZooKeeper is the coordinator and
``typhoon-controller`` (the sample deploy/controller.conf, with the fault
detector) is reached over TCP on the underlay; topologies go in with
``typhoon submit``.  No Mininet.

* a fan-in topology (two sources into one split and count stage) counts
  exactly, its workers spread over the three machines;
* wordcount under ``exactly_once``: one machine loses power mid-run (its
  bridge, with its VXLAN ports, deleted; its agent, workers and Open vSwitch
  SIGKILLed); the fault detector's heartbeat finds its workers and replaces
  them on the two others (a host whose switch is gone gets none of them), the
  counts are still exact, the report is ok and its incidents name the host.
"""

from __future__ import annotations

import collections
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import REPO, free_port, wait_for
from machines import Underlay, links_named
from zkserver import start_zookeeper

from mininet_env.run import rest_call
from typhoon.coordinator import open_coordinator
from typhoon.live import data_tuples
from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report, read_worker_reports
from typhoon.topology import load_topology_text

BIN = Path(sys.executable).parent
TOKEN = "netns-t0ken"
ZK_SECRET = "netns-zk-s3cret"


def command(script: str, module: str) -> list[str]:
    """The console script if this environment has it, else the module it runs."""
    exe = BIN / script
    return [str(exe)] if exe.exists() else [sys.executable, "-m", module]


def agent_argv(host: str, coordinator: str, workdir: Path) -> list[str]:
    """ExecStart of the agent's systemd unit, with agent.env's variables filled in."""
    unit = (REPO / "deploy/systemd/typhoon-agent.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    words = shlex.split(exec_start.removeprefix("ExecStart="))
    env = {"TYPHOON_HOST": host, "TYPHOON_COORDINATOR": coordinator}
    args = [env.get(w[2:-1], w) if w.startswith("${") else w for w in words[1:]]
    args[args.index("--workdir") + 1] = str(workdir)  # not /var/lib/typhoon
    return [*command("typhoon-agent", "typhoon.agent"), *args]


def listening(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=0.5).close()
    except OSError:
        return False
    return True


class Deployment:
    """ZooKeeper, the controller and three machines with agents; ``close`` undoes all."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.net = Underlay(workdir, 3)
        self.procs: list[tuple[subprocess.Popen, Path]] = []
        self.zk = None
        self.agents: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        net, w = self.net, self.workdir
        net.start()
        self.zk = start_zookeeper(w / "zookeeper", address=net.gateway)
        auth = w / "zk-auth"  # ACLs on, as docs/deploy.md says to run it
        auth.write_text(f"typhoon:{ZK_SECRET}\n")
        auth.chmod(0o600)
        self.zk_prefix = f"/typhoon-{net.prefix}"
        self.coordinator = f"zk://{self.zk.hosts}{self.zk_prefix}?auth_file={auth}"
        self.ofp, self.wsapi = free_port(), free_port()
        (w / "api-token").write_text(TOKEN + "\n")
        conf = w / "controller.conf"  # the sample; a slow shared machine: a long heartbeat
        conf.write_text((REPO / "deploy/controller.conf").read_text().replace(
            "[fault_detector]\n", "[fault_detector]\nheartbeat_timeout = 15\n"))  # fmt: skip
        self.controller = self.spawn(
            "controller",
            [*command("typhoon-controller", "controller.daemon"), "--config", str(conf),
             "--coordinator", self.coordinator, "--ofp-listen-host", net.gateway,
             "--ofp-port", str(self.ofp), "--wsapi-port", str(self.wsapi),
             "--api-token-file", str(w / "api-token"), "--app", "fault_detector",
             "--runtime-dir", str(w / "controller-run")],
        )  # fmt: skip
        hosts = {
            m.name: {"address": m.address, "bridge": "br-typhoon", "dpid": i,
                     "datapath": "netdev"}
            for i, m in enumerate(net.machines, 1)
        }  # fmt: skip
        self.cluster_file = w / "cluster.yaml"
        self.cluster_file.write_text(yaml.safe_dump({
            "controller": f"tcp:{net.gateway}:{self.ofp}",
            "coordinator": self.coordinator,
            "fabric": {"type": "vxlan", "mtu": 1500, "key": 4242},
            "hosts": hosts,
        }, sort_keys=False))  # fmt: skip
        wait_for(lambda: self.alive() and listening(net.gateway, self.ofp), 60,
                 what=f"the controller's OpenFlow port\n{self.tail('controller')}")  # fmt: skip
        for m in net.machines:  # typhoon-cluster-apply.service, then typhoon-agent.service
            m.run(*self.typhoon("cluster", "apply", str(self.cluster_file), "--host", m.name),
                  timeout=60)  # fmt: skip
            env = m.env(TYPHOON_HOST=m.name, TYPHOON_COORDINATOR=self.coordinator)
            argv = m.argv(*agent_argv(m.name, self.coordinator, w / m.name / "work"))
            self.agents[m.name] = self.spawn(f"agent-{m.name}", argv, env)
        for m in net.machines:  # the bridge connects a moment after apply
            self.check_ok(m)
        with open_coordinator(self.coordinator) as c:
            wait_for(lambda: set(c.agents()) == set(hosts), 30, what="the three agents")
            assert c.get_cluster().mtu == 1450  # VXLAN on a 1500-byte underlay

    def check_ok(self, m, timeout: float = 30) -> None:
        """``typhoon cluster check`` on machine ``m`` says ok (within ``timeout``)."""
        argv = m.argv(*self.typhoon("cluster", "check", str(self.cluster_file), "--host", m.name))
        deadline = time.monotonic() + timeout
        while True:
            out = subprocess.run(argv, capture_output=True, text=True, env=m.env(), timeout=60)
            # the first line says which fabric protection is active (typhoon/fabric_guard.py)
            if out.stdout.endswith(f"\n{m.name}: ok\n") or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # sleep-ok: the poll interval of this wait with a deadline
        assert out.stdout.splitlines()[1:] == [f"{m.name}: ok"], out.stdout + out.stderr

    @staticmethod
    def typhoon(*args: str) -> list[str]:
        return [*command("typhoon", "typhoon_cli"), *args]

    def spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)  # fmt: skip
        self.procs.append((proc, log))
        return proc

    def tail(self, name: str, lines: int = 40) -> str:
        text = (self.workdir / f"{name}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        for proc, log in self.procs:
            if proc.poll() is not None and proc in self.agents.values():
                continue  # a machine the test killed
            assert proc.poll() is None, f"{log.name} exited {proc.returncode}:\n{log.read_text()}"
        return True

    def ctl(self, *args: str) -> None:
        """``typhoon VERB ...`` against the controller's REST API, as an operator runs it."""
        env = {**os.environ, "TYPHOON_CONTROLLER": f"http://127.0.0.1:{self.wsapi}",
               "TYPHOON_TOKEN": TOKEN}  # fmt: skip
        out = subprocess.run(self.typhoon(*args), capture_output=True, text=True, env=env,
                             timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr

    def submit(self, doc: dict) -> str:
        path = self.workdir / f"{doc['name']}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.ctl("submit", str(path))
        return doc["name"]

    def faults(self) -> list[dict]:
        status, body = rest_call(f"http://127.0.0.1:{self.wsapi}", "GET", "/faults")
        assert status == 200, body
        return body

    def finish(
        self, name: str, timeout: float = 90, before_kill: Callable[[], object] = lambda: None
    ) -> tuple[list[dict], list[int], bool]:
        """Wait until every worker of the current physical topology exited; its reports
        (``before_kill`` runs then, before ``typhoon kill``)."""
        with open_coordinator(self.coordinator) as c:

            def done():
                self.alive()
                current = {w.worker_id for w in c.get_physical(name).workers}
                statuses = c.worker_statuses(name)
                exited = {wid for wid, s in statuses.items() if s.state == "exited"}
                return (current, statuses) if current <= exited else None

            current, statuses = wait_for(done, timeout, what=f"the end of {name}")
            clean = all(statuses[w].exit_code == 0 for w in current)
        reports = []
        for m in self.net.machines:
            reports += read_worker_reports(self.workdir / m.name / "work" / name / "reports")
        before_kill()
        self.ctl("kill", name)
        return reports, sorted(set(statuses) - current), clean

    def close(self) -> None:
        """Stop the agents (they stop their workers), the controller and ZooKeeper; the
        machines and their underlay go whatever failed before (``Underlay.close``)."""
        try:
            for proc, _ in reversed(self.procs):  # agents stop their workers, then controller
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 20
            for proc, _ in reversed(self.procs):
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
            if self.zk is not None:
                self.zk.stop()
        finally:
            self.net.close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    d = Deployment(tmp_path_factory.mktemp("machines"))
    try:
        d.start()
        yield d
    finally:
        d.close()
    # a machine lost power: its namespace may outlive the test (orphaned connections
    # hold it), but not a device of the underlay (test_underlay.py)
    left = links_named(d.net.prefix)
    for name in left:  # not the suite's leak, whatever the outcome
        subprocess.run(["ip", "link", "del", name], capture_output=True)
    assert left == []


def reference(*args: dict) -> dict[str, int]:
    words: collections.Counter[str] = collections.Counter()
    for a in args:
        for s in generate_sentences(a["count"], a["seed"], a["words"], a["vocabulary"]):
            words.update(s.split())
    return dict(words)


def check_exact(counts: dict, want: dict[str, int]) -> None:
    got = {k: int(v) for k, v in counts.items()}
    diff = {w: (got.get(w, 0), n) for w, n in want.items() if got.get(w, 0) != n}
    assert not diff and set(got) == set(want), list(diff.items())[:10]


def hosts_of(d: Deployment, name: str) -> dict[str, set[str]]:
    with open_coordinator(d.coordinator) as c:
        physical = c.get_physical(name)
    out: dict[str, set[str]] = collections.defaultdict(set)
    for w in physical.workers:
        out[w.node].add(w.host)
    return out


def test_three_machines_come_up_joined_only_by_vxlan(deployment):
    """apply + check ok on each machine (asserted by the fixture), and the fabric is VXLAN."""
    for m in deployment.net.machines:
        tunnels = {
            p: m.run("ovs-vsctl", "get", "Interface", p, "type").strip()
            for p in m.run("ovs-vsctl", "list-ports", "br-typhoon").split()
        }
        others = [o for o in deployment.net.machines if o is not m]
        assert tunnels == {f"tyt{o.name[1:]}": "vxlan" for o in others}, tunnels
        for o in others:
            remote = m.run("ovs-vsctl", "get", "Interface", f"tyt{o.name[1:]}", "options:remote_ip")
            assert remote.strip().strip('"') == o.address


def test_zookeeper_refuses_a_client_without_the_credentials(deployment):
    """Every znode the deployment made is creator-only: the world cannot read or rewrite
    ``physical/*`` (agents start what it says) nor the cluster."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    d = deployment
    name = d.submit(
        {"name": "acl", "spouts": [{"id": "s", "operator": "sequence_source",
                                    "args": {"count": 10}}],
         "bolts": [{"id": "k", "operator": "sequence_check"}],
         "streams": [{"from": "s", "to": "k", "grouping": "shuffle"}]}
    )  # fmt: skip
    d.finish(name)
    stranger = KazooClient(d.zk.hosts)
    stranger.start(timeout=10)
    try:
        kv = f"{d.zk_prefix}/kv"
        for call in (
            lambda: stranger.get_children(f"{kv}/physical"),
            lambda: stranger.get(f"{kv}/cluster"),
            lambda: stranger.set(f"{kv}/cluster", b"{}"),
            lambda: stranger.create(f"{kv}/physical/evil", b'{"workers": []}'),
        ):
            with pytest.raises(NoAuthError):
                call()
    finally:
        stranger.stop()
        stranger.close()


def test_fan_in_counts_exact_across_three_machines(deployment):
    d = deployment
    a = {"count": 3000, "seed": 1, "words": 6, "vocabulary": 300}
    b = {"count": 2000, "seed": 2, "words": 6, "vocabulary": 300}
    doc = {
        "name": "fanin",
        "config": {"placement": "spread"},
        "spouts": [{"id": "a", "operator": "sentence_source", "args": a},
                   {"id": "b", "operator": "sentence_source", "args": b}],
        "bolts": [{"id": "split", "operator": "split_words", "parallelism": 3},
                  {"id": "count", "operator": "count_by_key", "args": {"key": "word"},
                   "parallelism": 3, "stateful": True}],
        "streams": [{"from": "a", "to": "split", "grouping": "shuffle"},
                    {"from": "b", "to": "split", "grouping": "shuffle"},
                    {"from": "split", "to": "count",
                     "grouping": {"type": "fields", "fields": ["word"]}}],
    }  # fmt: skip
    name = d.submit(doc)
    placed = hosts_of(d, name)
    assert placed["split"] == placed["count"] == {"m1", "m2", "m3"}
    reports, recovered, clean = d.finish(name)
    assert clean and not recovered
    t = load_topology_text(yaml.safe_dump(doc), name)
    report = build_report(t, reports, ok=clean, transport="sdn")
    assert report["ok"], report["problems"]
    want = reference(a, b)
    check_exact(report["results"]["count"]["counts"], want)
    # the merged sum would hide a split key: each count worker's own state holds its own
    # keys, no key on two workers, and every worker (one per machine) owns some
    owned = [set(r["result"]["counts"]) for r in reports if r["node"] == "count"]
    assert len(owned) == 3 and all(owned), [len(o) for o in owned]
    assert sum(map(len, owned)) == len(set().union(*owned)) == len(want)
    assert report["results"]["count"]["keys_on_several_workers"] == 0


def test_a_machine_loses_power_and_wordcount_is_still_exact(deployment, tmp_path):
    """A power cut of m2 mid-run: its bridge goes (no port event, its OpenFlow connection
    dies), its agent, workers and Open vSwitch are SIGKILLed, its agent's record stays.
    The heartbeat finds its workers, the replacements go to m1 and m3, the counts are
    exact, the report is ok and every incident names m2."""
    d = deployment
    doc = yaml.safe_load((REPO / "topologies/wordcount.yaml").read_text())
    doc["name"] = "wcnetns"
    args = doc["spouts"][0]["args"]
    args.update(count=12_000, rate=2_000)  # a 6 s run
    doc["config"] = {
        "placement": "spread",
        "guarantee": "exactly_once",
        "checkpoint_interval_ms": 500,
        "checkpoint_store": str(tmp_path / "ckpt"),
    }
    name = d.submit(doc)
    with open_coordinator(d.coordinator) as c:
        wait_for(lambda: (c.get_app_state(name) or {}).get("active"), 60, what="wcnetns active")
        physical = c.get_physical(name)
        doomed = [w.worker_id for w in physical.workers if w.host == "m2"]
        (source,) = [w.worker_id for w in physical.of_node("source")]

        def sent() -> int:
            return data_tuples(c.get_metrics(name).get(source, {}).get("out", {}))

        # mid-run by count (a third of the sentences), not a sleep
        wait_for(lambda: sent() >= 4_000, 60, what="4,000 sentences from the source")
    assert doomed  # spread: m2 runs a split and a count worker
    victim = d.net.machines[1]
    killed = victim.power_cut("br-typhoon")
    assert d.agents["m2"].pid in killed and set(victim.ovs_pids) <= set(killed)
    with open_coordinator(d.coordinator) as c:
        assert c.get_agent("m2") is not None  # a power cut leaves the record behind

    def replaced():
        incidents = {i["worker"]: i for i in d.faults() if i["app"] == name}
        done = [incidents.get(v) for v in doomed]
        if all(i is not None and i["state"] in ("rejoined", "failed") for i in done):
            return done
        return None

    incidents = wait_for(replaced, 90, what=f"the replacements of {doomed}")
    mine: list[dict] = []  # the controller's incidents, read at the end of the run
    for i in incidents:
        assert i["state"] == "rejoined", i
        assert i["host"] == "m2", i
        assert i["exit_code"] is None, i  # nobody on m2 reported the exit
        assert i["reason"].startswith("no METRIC_RESP"), i  # the heartbeat found it
    placed = hosts_of(d, name)
    assert "m2" not in set().union(*placed.values()), placed
    reports, recovered, clean = d.finish(name, before_kill=lambda: mine.extend(d.faults()))
    assert set(doomed) <= set(recovered), (doomed, recovered)
    t = load_topology_text(yaml.safe_dump(doc), name)
    mine = [i for i in mine if i["app"] == name]
    report = build_report(
        t, reports, ok=clean, recovered=recovered, transport="sdn", incidents=mine
    )
    check_exact(report["results"]["count"]["counts"], reference(args))
    assert report["ok"], report["problems"]
    assert {i["host"] for i in report["incidents"]} == {"m2"}, report["incidents"]
