"""The fabric firewall on a real kernel: tunnel UDP from the cluster file's peers only.

Three network namespaces: ``a`` (a host of the file, 10.77.0.1 toward ``b``
and 10.77.1.1 toward ``c``), ``b`` (the other host of the file, 10.77.0.2)
and ``c`` (10.77.1.3, not in the file).  ``a`` listens on UDP 4789 and 6081.
Before the filter both ``b`` and ``c`` reach it; once ``typhoon.host_setup``
installed the rules in ``a`` (the code ``typhoon cluster apply`` runs), ``c``'s
datagrams are counted and dropped and ``b``'s still arrive; a second install
changes nothing; removing it lets ``c`` through again.  Nothing is changed in
the root namespace.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run, wait_for

LISTENER = """
import select, socket, sys
socks = []
for port in (4789, 6081):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    socks.append(s)
print("ready", flush=True)
while True:
    for s in select.select(socks, [], [])[0]:
        data, (addr, _) = s.recvfrom(2048)
        print(f"{s.getsockname()[1]} {addr} {data.decode()}", flush=True)
"""

SENDER = "import socket, sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(" \
         "sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))"  # fmt: skip

INSTALL = """
import sys
from typhoon import host_setup
from typhoon.cluster_file import load_cluster_file
cf = load_cluster_file(sys.argv[1])
print(host_setup.install_guard(cf, "a") if sys.argv[2] == "install" else host_setup.remove_guard())
"""


class Namespaces:
    def __init__(self) -> None:
        token = secrets.token_hex(3)
        self.ns = {n: f"tyfw{token}{n}" for n in "abc"}
        self.links: list[str] = []

    def ip(self, ns: str, *args: str) -> str:
        return run("ip", "-n", self.ns[ns], *args)

    def exec(self, ns: str, *argv: str, **kw) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.ns[ns], *argv], capture_output=True,
                              text=True, timeout=30, cwd=REPO, **kw)  # fmt: skip

    def start(self) -> None:
        for name in self.ns.values():
            run("ip", "netns", "add", name)
        for peer, net, addr in (("b", "10.77.0", 2), ("c", "10.77.1", 3)):
            here, there = f"{self.ns['a'][-8:]}{peer}", f"{self.ns[peer][-8:]}a"
            run("ip", "link", "add", here, "netns", self.ns["a"], "type", "veth", "peer",
                "name", there, "netns", self.ns[peer])  # fmt: skip
            self.ip("a", "addr", "add", f"{net}.1/24", "dev", here)
            self.ip(peer, "addr", "add", f"{net}.{addr}/24", "dev", there)
            for ns, dev in (("a", here), (peer, there)):
                self.ip(ns, "link", "set", dev, "up")
        for ns in self.ns:
            self.ip(ns, "link", "set", "lo", "up")

    def close(self) -> None:
        for name in self.ns.values():
            run("ip", "netns", "del", name, check=False)


@pytest.fixture
def spaces():
    n = Namespaces()
    try:
        n.start()
        yield n
    finally:
        n.close()


def test_tunnel_udp_only_from_the_files_peers(tmp_path, spaces):
    cfile = tmp_path / "cluster.yaml"
    cfile.write_text(yaml.safe_dump({
        "controller": "tcp:10.77.0.1:6653",
        "coordinator": "zk://10.77.0.1:2181/typhoon",
        "fabric": {"type": "vxlan", "mtu": 1500, "key": 5},
        "hosts": {"a": {"address": "10.77.0.1", "bridge": "br-ty", "dpid": 1},
                  "b": {"address": "10.77.0.2", "bridge": "br-ty", "dpid": 2}},
    }))  # fmt: skip
    out = tmp_path / "received.txt"
    with open(out, "w") as sink:
        listener = subprocess.Popen(
            ["ip", "netns", "exec", spaces.ns["a"], sys.executable, "-c", LISTENER],
            stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: "ready" in out.read_text(), 20, what="the listener in a")
        seen = 0

        def send(ns: str, to: str, port: int, text: str) -> None:
            proc = spaces.exec(ns, sys.executable, "-c", SENDER, to, str(port), text)
            assert proc.returncode == 0, proc.stderr

        def arrives(text: str) -> None:
            wait_for(lambda: text in out.read_text(), 10, what=f"'{text}' in a")

        def dropped() -> int:
            proc = spaces.exec("a", "nft", "-j", "list", "table", "inet", "typhoon_fabric")
            if proc.returncode != 0:
                return -1
            rules = [i["rule"] for i in json.loads(proc.stdout)["nftables"] if "rule" in i]
            return sum(e["counter"]["packets"] for r in rules for e in r["expr"] if "counter" in e)

        send("c", "10.77.1.1", 4789, "c-before")  # no filter yet: anyone reaches a
        arrives("c-before")
        env = {"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        for _ in range(2):  # installing twice is the same table
            proc = spaces.exec("a", sys.executable, "-c", INSTALL, str(cfile), "install", env=env)
            assert proc.returncode == 0 and "nft" in proc.stdout, proc.stdout + proc.stderr
        assert dropped() == 0
        for port in (4789, 6081):
            seen += 1
            send("c", "10.77.1.1", port, f"c-after-{port}")
            wait_for(lambda n=seen: dropped() == n, 10, what=f"the drop of c's datagram {seen}")
            send("b", "10.77.0.1", port, f"b-after-{port}")
            arrives(f"b-after-{port}")
        text = out.read_text()
        assert "c-after" not in text and "10.77.1.3" not in text.split("c-before", 1)[1], text
        proc = spaces.exec("a", sys.executable, "-c", INSTALL, str(cfile), "remove", env=env)
        assert proc.returncode == 0, proc.stderr
        assert dropped() == -1  # the table is gone
        send("c", "10.77.1.1", 4789, "c-again")
        arrives("c-again")
    finally:
        listener.kill()
        listener.wait(timeout=10)
    root = run("nft", "list", "tables")
    assert "typhoon_fabric" not in root  # the root namespace was never touched


def test_apply_refuses_without_nft_unless_the_file_opts_out(tmp_path):
    """A host without the nft command: apply says so in one sentence and changes nothing."""
    doc = {
        "controller": "tcp:127.0.0.1:6653",
        "coordinator": "sqlite:///" + str(tmp_path / "c.db"),
        "fabric": {"type": "vxlan", "mtu": 1500, "key": 5},
        "hosts": {"a": {"address": "192.0.2.1", "bridge": "tyfwnone", "dpid": 1},
                  "b": {"address": "192.0.2.2", "bridge": "br-ty", "dpid": 2}},
    }  # fmt: skip
    cfile = tmp_path / "cluster.yaml"
    cfile.write_text(yaml.safe_dump(doc))
    bare = tmp_path / "bin"  # a PATH with ovs-vsctl and ip but no nft
    bare.mkdir()
    for tool in ("ovs-vsctl", "ip"):
        (bare / tool).symlink_to(Path(run("sh", "-c", f"command -v {tool}").strip()))
    env = {"PATH": str(bare), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "typhoon_cli", "cluster", "apply", str(cfile), "--host", "a",
            "--no-coordinator"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "error: the fabric firewall needs nftables (the nft command is not installed): "
        f"install it, or set fabric.firewall: false in {cfile} to trust the underlay"
    )
    assert "tyfwnone" not in run("ovs-vsctl", "list-br").split()  # refused before any change
