"""Several "machines" on one host: network namespaces, each with an Open vSwitch of its own.

This machine has no Open vSwitch kernel module, so bridges use the userspace
(``netdev``) datapath, whose ports must be in ``ovs-vswitchd``'s network
namespace.  Each machine therefore runs its own ``ovsdb-server`` and
``ovs-vswitchd`` inside its namespace, with database, sockets, pid and log
files in its own run directory; every ``ovs-vsctl`` started with
``OVS_RUNDIR`` set to it (``Machine.env``) talks to that database, so
``typhoon cluster apply`` and ``typhoon-agent`` need nothing else.

The underlay: one veth pair per machine, its outer end on a Linux bridge in
the root namespace (the "LAN", which also carries the gateway address where
ZooKeeper and the controller listen; ``ethtool`` turns its checksum offload
off), its inner end a port of the machine's
``br-phy`` bridge, which holds the machine's address.  This is Open vSwitch's
userspace tunneling setup: a VXLAN port of the netdev datapath sends its
packets out of the bridge that owns the route to the remote address.  The
Typhoon bridges of two machines reach each other only through VXLAN.

Everything is removed by :meth:`Underlay.close` (every process in each
namespace is killed, the veth pairs, the namespaces and the LAN bridge
deleted), also when a test fails half way.  A veth pair is deleted by its
outer end, not left to its namespace: ``ip netns del`` only drops the
namespace's name, and the namespace (with the pair) lives on while anything
holds it, for instance for minutes a TCP connection of a process killed after
its machine's link went down (a power cut: its Open vSwitch, which carried the
address, died first), whose FIN is retransmitted as an orphan socket.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
UNDERLAY_BRIDGE = "br-phy"


def run(*argv: str, env: dict[str, str] | None = None, timeout: float = 20) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class Machine:
    """One namespace with its own OVS daemons and an address on the underlay."""

    name: str  # the host's name in the cluster file
    netns: str
    address: str
    rundir: Path
    nic: str = ""  # the underlay interface inside the namespace (a veth end)
    ovs_pids: list[int] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "OVS_RUNDIR": str(self.rundir), **extra}

    def argv(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, *argv: str, timeout: float = 20) -> str:
        return run(*self.argv(*argv), env=self.env(), timeout=timeout)

    def pids(self) -> list[int]:
        proc = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
        return [int(p) for p in proc.stdout.split()]

    def kill(self, keep_switch: bool = True) -> list[int]:
        """SIGKILL every process of the machine (but its Open vSwitch, if ``keep_switch``)."""
        victims = [p for p in self.pids() if not (keep_switch and p in self.ovs_pids)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return victims

    def power_cut(self, bridge: str) -> list[int]:
        """The machine loses power: ``bridge`` goes (its VXLAN ports with it, so its
        OpenFlow connection and every tunnel to it die) and every process is SIGKILLed at
        once, its Open vSwitch too.  Nothing it ran says goodbye: its agent's record stays
        in the coordinator, with a heartbeat that stops."""
        self.run("ovs-vsctl", "--if-exists", "del-br", bridge)
        return self.kill(keep_switch=False)

    def start_ovs(self) -> None:
        """ovsdb-server and ovs-vswitchd of this namespace, detached, files in ``rundir``."""
        r = self.rundir
        r.mkdir(parents=True, exist_ok=True)
        run("ovsdb-tool", "create", str(r / "conf.db"), str(SCHEMA))
        common = ["--detach", "--no-chdir"]
        self.run(
            "ovsdb-server", str(r / "conf.db"), f"--remote=punix:{r / 'db.sock'}",
            f"--pidfile={r / 'ovsdb-server.pid'}", f"--unixctl={r / 'ovsdb-server.ctl'}",
            f"--log-file={r / 'ovsdb-server.log'}", *common,
        )  # fmt: skip
        self.ovs_pids.append(int((r / "ovsdb-server.pid").read_text()))
        self.run("ovs-vsctl", "--no-wait", "init")
        self.run(
            "ovs-vswitchd", f"unix:{r / 'db.sock'}", f"--pidfile={r / 'ovs-vswitchd.pid'}",
            f"--unixctl={r / 'ovs-vswitchd.ctl'}", f"--log-file={r / 'ovs-vswitchd.log'}",
            *common,
        )  # fmt: skip
        self.ovs_pids.append(int((r / "ovs-vswitchd.pid").read_text()))


class Underlay:
    """A LAN of machines (namespaces) and the root namespace's gateway address on it."""

    def __init__(self, workdir: Path, count: int) -> None:
        token = secrets.token_hex(2)
        self.prefix = f"ty{token}"
        self.subnet = f"198.18.{secrets.randbelow(250) + 1}"  # RFC 2544 benchmark range
        self.gateway = f"{self.subnet}.254"
        self.lan = f"{self.prefix}lan"
        self.machines = [
            Machine(f"m{i}", f"{self.prefix}m{i}", f"{self.subnet}.{i}", workdir / f"m{i}" / "ovs")
            for i in range(1, count + 1)
        ]
        self._made_lan = False
        self._veths: list[str] = []  # outer ends of the pairs made so far

    def start(self, phy: bool = True) -> None:
        """The LAN and the machines; ``phy=False`` leaves each ``nic`` without an address and
        without ``br-phy`` (docs/deploy.md's commands make them)."""
        run("ip", "link", "add", self.lan, "type", "bridge")
        self._made_lan = True
        run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.lan)
        # The root namespace's own packets (to ZooKeeper, to the controller) leave with the
        # checksum left to the NIC; the userspace datapath reads them off the veth as they
        # are and hands them on unfinished, and the machine's kernel drops them.  (Between
        # two machines nothing is offloaded: their br-phy is a TAP without it.)
        run("ethtool", "-K", self.lan, "tx", "off")
        run("ip", "link", "set", self.lan, "up")
        for i, m in enumerate(self.machines, 1):
            outer, inner = f"{self.prefix}o{i}", f"{self.prefix}i{i}"
            run("ip", "netns", "add", m.netns)
            run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            self._veths.append(outer)
            run("ip", "link", "set", inner, "netns", m.netns)
            run("ip", "link", "set", outer, "master", self.lan, "up")
            m.run("ip", "link", "set", "lo", "up")
            m.run("ip", "link", "set", inner, "up")
            m.nic = inner
            m.start_ovs()
            if not phy:
                continue
            m.run("ovs-vsctl", "add-br", UNDERLAY_BRIDGE, "--", "set", "Bridge", UNDERLAY_BRIDGE,
                  "datapath_type=netdev", "--", "add-port", UNDERLAY_BRIDGE, inner)  # fmt: skip
            m.run("ip", "addr", "add", f"{m.address}/24", "dev", UNDERLAY_BRIDGE)
            m.run("ip", "link", "set", UNDERLAY_BRIDGE, "up")

    def close(self) -> None:
        """Kill every process of every machine, delete the veth pairs (by their outer
        ends: see the module docstring), the namespaces and the LAN."""
        for m in self.machines:
            for _ in range(50):
                if not m.kill(keep_switch=False):
                    break
                time.sleep(0.1)
        for outer in self._veths:
            subprocess.run(["ip", "link", "del", outer], capture_output=True)
        for m in self.machines:
            subprocess.run(["ip", "netns", "del", m.netns], capture_output=True)
        if self._made_lan:
            subprocess.run(["ip", "link", "del", self.lan], capture_output=True)


def links_named(prefix: str) -> list[str]:
    """The root namespace's network devices whose names start with ``prefix``."""
    return sorted(d.name for d in Path("/sys/class/net").iterdir() if d.name.startswith(prefix))
