"""docs/deploy.md, executed: its marked shell blocks run as written on two namespace hosts.

A block preceded by ``<!-- test: HOSTS [LABEL] -->`` (``h1``, ``h2`` or both)
runs with ``bash -e`` inside those hosts' network namespaces
(``machines.py``: each its own ``ovsdb-server``/``ovs-vswitchd``, joined only by
an IP underlay), in the order of the document, so the guide cannot drift from
the code.  Nothing but these substitutions stands between the text and the run:

* the example addresses 10.0.0.1 and 10.0.0.2 become the namespaces', and
  ``10.0.0.1:2181`` the test's ZooKeeper (on the underlay's gateway: the
  guide's ``apt-get install zookeeperd`` is not run here);
* ``/etc/typhoon``, ``/var/lib/typhoon`` and ``~`` become per-host directories
  of the test, ``/opt/typhoon-src`` this checkout and ``eth0`` the namespace's
  underlay interface; ``HOST`` and ``ADDR`` are set as the guide says;
* the sample files under ``deploy/`` get the same addresses; the fault
  detector a long heartbeat (a slow shared machine); and wordcount a source
  rate (a 15 s run, so the debugger attaches while it runs) and ``placement:
  spread`` (so ``split[1]``, the worker the guide watches, is on h2).

What is asserted beyond "every block exits 0": the debugger printed tuples of
``split[1]`` from h2, ``typhoon report`` says finished and ok, its JSON has the
exact word counts (also after ``typhoon kill``), the kill stopped every worker,
no block printed the API token, and the control class the guide turns on
(``fabric.control_class``) is on each host's underlay interface after
``apply``, ``check`` reports it, and the credit frames of the run went through
it (the kernel's own counters, ``tc -s class show``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import REPO, wait_for
from machines import Machine, Underlay
from test_machines import check_exact, reference
from zkserver import start_zookeeper

from typhoon import control_queue as cq
from typhoon.coordinator import open_coordinator
from typhoon.host_setup import KERNEL_MODULE

GUIDE = REPO / "docs/deploy.md"
MARK = re.compile(r"<!-- test: ([^>]*?) -->\n```sh\n(.*?)```", re.S)
HOSTS = ("h1", "h2")
BIN = Path(sys.executable).parent
SOURCE_RATE = 1500  # sentences/s of the test's wordcount (20,000 of them)


@dataclass
class Block:
    hosts: list[str]
    label: str | None
    text: str
    line: int


def guide_blocks(text: str) -> list[Block]:
    """The marked ``sh`` blocks, in document order."""
    blocks = []
    for m in MARK.finditer(text):
        words = m.group(1).split()
        hosts = [w for w in words if w in HOSTS]
        labels = [w for w in words if w not in HOSTS]
        line = text.count("\n", 0, m.start()) + 1
        assert hosts and len(labels) <= 1, f"docs/deploy.md:{line}: bad marker {m.group(0)!r}"
        blocks.append(Block(hosts, labels[0] if labels else None, m.group(2), line))
    assert len(blocks) == text.count("<!-- test:"), "a test marker not followed by a sh block"
    return blocks


def test_the_guide_marks_blocks_for_both_hosts():
    blocks = guide_blocks(GUIDE.read_text())
    assert {h for b in blocks for h in b.hosts} == set(HOSTS)
    assert {b.label for b in blocks} >= {"debug", "report"}


class Guide:
    """Two hosts, ZooKeeper, and the substitutions that turn the guide into their commands."""

    def __init__(self, work: Path, controller_conf: dict[str, str] | None = None) -> None:
        self.work = work
        self.conf_edits = controller_conf or {}  # text replacements in controller.conf
        self.net = Underlay(work, 2)
        self.machines: dict[str, Machine] = dict(zip(HOSTS, self.net.machines, strict=True))
        self.zk = None
        self.outputs: list[subprocess.CompletedProcess[str]] = []

    def start(self) -> None:
        self.net.start(phy=False)  # br-phy and the addresses: the guide's commands
        self.zk = start_zookeeper(self.work / "zookeeper", address=self.net.gateway)
        src = self.work / "src"
        (src / "deploy").mkdir(parents=True)
        for name in ("cluster.yaml", "controller.conf", "agent.env"):
            text = self.substitute((REPO / "deploy" / name).read_text(), "h1")
            if name == "controller.conf":
                text = text.replace(
                    "[fault_detector]\n", "[fault_detector]\nheartbeat_timeout = 15\n"
                )
                for old, new in self.conf_edits.items():
                    assert old in text, old
                    text = text.replace(old, new)
            (src / "deploy" / name).write_text(text)
        doc = yaml.safe_load((REPO / "topologies/wordcount.yaml").read_text())
        doc["spouts"][0]["args"]["rate"] = SOURCE_RATE
        doc["config"] = {"placement": "spread"}
        self.wordcount = doc
        (src / "topologies").mkdir()
        (src / "topologies/wordcount.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        for host in HOSTS:
            (self.work / host / "home").mkdir(parents=True)

    def substitute(self, text: str, host: str) -> str:
        m = self.machines[host]
        pairs = [
            ("10.0.0.1:2181", self.zk.hosts),
            ("10.0.0.1", self.machines["h1"].address),
            ("10.0.0.2", self.machines["h2"].address),
            ("/opt/typhoon-src/deploy", str(self.work / "src/deploy")),
            ("/opt/typhoon-src/topologies", str(self.work / "src/topologies")),
            ("/opt/typhoon-src", str(REPO)),
            ("/etc/typhoon", str(self.work / host / "etc")),
            ("/var/lib/typhoon", str(self.work / host / "var")),
            ("eth0", m.nic),
        ]
        for old, new in pairs:
            text = text.replace(old, new)
        return text

    def env(self, host: str) -> dict[str, str]:
        m = self.machines[host]
        return m.env(HOST=host, ADDR=m.address, HOME=str(self.work / host / "home"),
                     PATH=f"{BIN}:{os.environ['PATH']}")  # fmt: skip

    def run(self, host: str, argv: list[str], timeout: float = 240):
        out = subprocess.run(
            self.machines[host].argv(*argv),
            env=self.env(host),
            text=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
        self.outputs.append(out)
        return out

    def run_block(self, block: Block, host: str) -> subprocess.CompletedProcess[str]:
        # The block is this repository's own text (docs/deploy.md), run as written with
        # bash -e in the host's namespace: running it unchanged is the point of the test.
        out = self.run(host, ["bash", "-e", "-c", self.substitute(block.text, host)])
        assert out.returncode == 0, (
            f"docs/deploy.md:{block.line} on {host} exited {out.returncode}\n"
            f"--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}\n{self.logs()}"
        )
        return out

    def sent(self, host: str) -> dict[str, int]:
        """Packets sent per htb class of the host's underlay interface, as tc counts them."""
        m = self.machines[host]
        return cq.class_packets(m.run("tc", "-s", "class", "show", "dev", m.nic))

    def logs(self) -> str:
        parts = []
        for host in HOSTS:
            for name in ("controller.log", "agent.log"):
                path = self.work / host / "var" / name
                if path.exists():
                    tail = path.read_text(errors="replace").splitlines()[-30:]
                    parts.append(f"--- {host} {name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def close(self) -> None:
        self.net.close()  # every process of both namespaces: controller, agents, workers
        if self.zk is not None:
            self.zk.stop()


def test_the_deploy_guide_runs_as_written(tmp_path):
    guide = Guide(tmp_path)
    try:
        guide.start()
        labelled = {}
        applied = {}  # per host: packets per class right after apply, before any job
        for block in guide_blocks(GUIDE.read_text()):
            for host in block.hosts:
                out = guide.run_block(block, host)
                if block.label:
                    labelled[block.label] = out
                if block.label == "apply":
                    applied[host] = guide.sent(host)
        # the debugger, attached from h1, printed what split[1] on h2 sent
        debug = labelled["debug"]
        tuples = [line for line in debug.stdout.splitlines() if "split[1] -> count[" in line]
        assert len(tuples) == 5 and "word=" in tuples[0], debug.stdout + debug.stderr
        assert re.search(r"watching wordcount worker \d+ \(out\) .* on h2;", debug.stderr)
        # the merged report, read from h1 while the job had its workers on both hosts
        report = labelled["report"].stdout
        assert report.startswith("wordcount: finished, ok\n"), report
        assert "  count: " in report and '"total": ' in report
        # exact counts, read after `typhoon kill` (the report outlives the job)
        out = guide.run("h1", ["typhoon", "report", "wordcount", "--json"])
        assert out.returncode == 0, out.stdout + out.stderr
        doc = json.loads(out.stdout)["result"]
        assert doc["ok"] and doc["finished"], doc["problems"]
        assert {w["host"] for w in doc["worker_states"]} == set(HOSTS)
        assert all(w["exit_code"] == 0 for w in doc["worker_states"])
        check_exact(
            doc["results"]["count"]["counts"], reference(guide.wordcount["spouts"][0]["args"])
        )
        # the kill stopped every worker; no block printed the token
        url = guide.substitute("zk://10.0.0.1:2181/typhoon", "h1")
        with open_coordinator(url) as c:
            wait_for(lambda: not any("wordcount" in a.workers for a in c.agents().values()),
                     30, what="the agents to stop wordcount's workers")  # fmt: skip
            assert set(c.agents()) == set(HOSTS)
        token = (tmp_path / "h1/etc/api-token").read_text().strip()
        assert token and not any(token in o.stdout + o.stderr for o in guide.outputs)
        # the control class: installed by apply, reported by check, its counters moved
        control, data = cq.classes(cq.tunnel_queueing("eth0", 900, "vxlan", 4))
        moved = {}
        for host in HOSTS:
            assert {control, data} <= set(applied[host]), applied[host]
            m = guide.machines[host]
            after = guide.sent(host)
            moved[host] = {c: after[c] - applied[host][c] for c in (control, data)}
            conf = guide.substitute("/etc/typhoon/cluster.yaml", host)
            out = guide.run(host, ["typhoon", "cluster", "check", conf, "--host", host])
            assert out.returncode == 0, out.stdout + out.stderr
            line = re.search(
                rf"^{host}: control class: credit frames ahead of data on {m.nic} \(htb 900 "
                rf"Mbit/s; packets sent: control {control} (\d+), data {data} (\d+)\)$",
                out.stdout, re.M,
            )  # fmt: skip
            assert line is not None, out.stdout
            assert int(line.group(1)) >= after[control] and int(line.group(2)) >= after[data]
            assert moved[host][data] > 0, (host, moved)  # tunnels, OpenFlow, ZooKeeper
        print(f"packets per class of the underlay interfaces during the run: {moved}")
        # both hosts receive tuples over the tunnels (placement: spread), so both grant
        assert all(moved[h][control] > 0 for h in HOSTS), moved
        # without it, check says so on a line of its own; apply puts it back
        m = guide.machines["h2"]
        m.run("tc", "qdisc", "del", "dev", m.nic, "root")
        conf = guide.substitute("/etc/typhoon/cluster.yaml", "h2")
        out = guide.run("h2", ["typhoon", "cluster", "check", conf, "--host", "h2"])
        assert out.returncode == 1
        assert f"h2: control class on {m.nic} missing: no htb root 5: (run apply)" in (
            out.stdout.splitlines()
        ), out.stdout
        assert f"h2: control class: not installed on {m.nic}" in out.stdout.splitlines()
        out = guide.run("h2", ["typhoon", "cluster", "apply", conf, "--host", "h2"])
        assert out.returncode == 0, out.stdout + out.stderr
        assert set(guide.sent("h2")) >= {control, data}
    finally:
        guide.close()


def test_an_undeliverable_debugger_says_why_and_a_job_removes_itself(tmp_path):
    """The guide up to its debugger, with the trap the guide avoids: debug workers told to
    POST to the controller's loopback.  An attach to a worker on h2 ends within seconds
    with the cause; then a job submitted with --remove-when-done goes once finished, and
    its report stays."""
    url = "http://127.0.0.1:8080/typhoon/debug"
    guide = Guide(tmp_path, {"# report_url =\n": f"report_url = {url}\n"})
    try:
        guide.start()
        blocks = guide_blocks(GUIDE.read_text())
        for block in blocks[: next(i for i, b in enumerate(blocks) if b.label == "debug")]:
            for host in block.hosts:
                guide.run_block(block, host)
        started = time.monotonic()
        out = guide.run("h1", ["typhoon", "debug", "attach", "wordcount", "split[1]"], 60)
        took = time.monotonic() - started
        assert out.returncode == 1 and out.stdout == "", out.stdout + out.stderr
        assert (
            f"the debug worker on h2 cannot deliver at {url}: cannot reach the controller"
            in out.stderr
            and "connection refused" in out.stderr
            and "set [live_debugger] report_url to an address this host reaches" in out.stderr
        ), out.stderr
        assert took < 20, (took, out.stderr)  # not the silent_timeout, not an empty stream
        # the debug worker logged its failure once, not once per batch
        logs = list((tmp_path / "h2/var/work/debug").glob("*.log"))
        assert len(logs) == 1
        assert logs[0].read_text().count("cannot deliver to the controller") == 1
        # a job that removes itself once its report is stored
        doc = dict(guide.wordcount, name="wconce")
        doc["spouts"] = [dict(doc["spouts"][0], args={**doc["spouts"][0]["args"], "rate": 0})]
        path = tmp_path / "wconce.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out = guide.run("h1", ["typhoon", "submit", str(path), "--remove-when-done"])
        assert out.returncode == 0, out.stdout + out.stderr
        out = guide.run("h1", ["typhoon", "report", "wconce", "--wait", "--json"], 120)
        assert out.returncode == 0, out.stdout + out.stderr
        counts = json.loads(out.stdout)["result"]["results"]["count"]["counts"]
        check_exact(counts, reference(doc["spouts"][0]["args"]))

        def gone():
            listed = guide.run("h1", ["typhoon", "list"])
            return "wconce" not in listed.stdout and listed.stdout

        listing = wait_for(gone, 30, what="wconce to remove itself")
        assert listing.startswith("wordcount "), listing
        out = guide.run("h1", ["typhoon", "report", "wconce"])
        assert out.returncode == 0 and out.stdout.startswith("wconce: finished, ok\n"), out.stdout
    finally:
        guide.close()


@pytest.mark.skipif(KERNEL_MODULE.exists(), reason="this host has the openvswitch module")
def test_apply_with_the_kernel_datapath_but_no_module_says_so(tmp_path):
    """The sample cluster file as it is (``datapath: system``) on a host without the
    module: ``apply`` names the cause and the fix, not ``DPID none``."""
    net = Underlay(tmp_path, 1)
    try:
        net.start()
        (m,) = net.machines
        cluster = yaml.safe_load((REPO / "deploy/cluster.yaml").read_text())
        cluster["hosts"] = {"h1": {"address": m.address, "bridge": "br-typhoon", "dpid": 1}}
        path = tmp_path / "cluster.yaml"
        path.write_text(yaml.safe_dump(cluster))
        argv = ["typhoon", "cluster", "apply", str(path), "--host", "h1", "--no-coordinator"]
        env = m.env(PATH=f"{BIN}:{os.environ['PATH']}")
        out = subprocess.run(m.argv(*argv), env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, out.stdout + out.stderr
        problems = [line for line in out.stdout.splitlines() if not line.startswith("ran: ")]
        assert problems[0].startswith(
            "h1: bridge br-typhoon has no datapath: datapath: system needs the openvswitch "
            "kernel module, which is not loaded on this host (modprobe openvswitch); or set "
            "datapath: netdev"
        ), out.stdout
        assert not any("DPID" in p or "OpenFlow port None" in p for p in problems), problems
    finally:
        net.close()
