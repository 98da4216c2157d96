"""The Mininet part: build the bridges and links of a :class:`FabricPlan`, and tear down.

Bridges use the userspace datapath (no kernel module here), OpenFlow 1.3,
``fail_mode=secure`` (nothing is forwarded without a rule) and a remote
controller on this machine.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import subprocess
from functools import partial
from pathlib import Path

from mininet.link import Link, TCLink
from mininet.log import setLogLevel, warn
from mininet.net import Mininet
from mininet.node import OVSSwitch, RemoteController

from mininet_env.fabric import FabricPlan
from mininet_env.topo import FabricTopo
from typhoon import control_queue
from typhoon.cluster import Cluster

log = logging.getLogger(__name__)

LINK_MTU = 65000  # fits the largest worker frame (`config: {sdn: {mtu: ...}}` up to 64 KB)
# every emulated host's bridge: userspace datapath, OpenFlow 1.3, nothing forwarded unasked
BRIDGE = partial(OVSSwitch, datapath="user", failMode="secure", protocols="OpenFlow13")
RMEM_DEFAULT = Path("/proc/sys/net/core/rmem_default")


class SocketBuffers:
    """``net.core.rmem_default`` raised while emulated networks run on this machine.

    Userspace OVS reads each port through a packet socket whose receive buffer is
    rmem_default at the time the port is added (it sets none itself); frames that
    do not fit are dropped by the kernel, unseen by OVS.  The plan's
    ``socket_buffer`` is what flow control shares among the senders crossing a
    port, so it must be in force before the first bridge port and worker TAP is
    made.  Several emulations (a test and a benchmark, say) may overlap: a
    record under /run lists the processes holding the raise, and the old value
    comes back when the last of them releases it (dead holders are dropped).
    """

    SYSCTL = RMEM_DEFAULT
    RECORD = Path("/run/typhoon-rmem.json")
    LOCK = Path("/run/typhoon-rmem.lock")

    @classmethod
    def _update(cls, change) -> None:
        with open(cls.LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                record = json.loads(cls.RECORD.read_text())
            except (OSError, ValueError):
                record = {}
            holders = [p for p in record.get("holders", []) if _alive(p)]
            record = change({**record, "holders": holders})
            if record is None:
                cls.RECORD.unlink(missing_ok=True)
            else:
                cls.RECORD.write_text(json.dumps(record))

    @classmethod
    def acquire(cls, size: int) -> None:
        def change(record: dict) -> dict:
            current = int(cls.SYSCTL.read_text())
            if not record["holders"]:
                # a holder that died without releasing left its raise: keep its saved value
                left = record.get("ours") == current and "saved" in record
                record = {"saved": record["saved"] if left else current, "holders": []}
                if left:
                    record["ours"] = current
            if current < size:
                cls.SYSCTL.write_text(str(size))
                record["ours"] = size
            record["holders"].append(os.getpid())
            return record

        cls._update(change)

    @classmethod
    def release(cls) -> None:
        def change(record: dict) -> dict | None:
            holders = record["holders"]
            if os.getpid() in holders:
                holders.remove(os.getpid())
            if holders:
                return record
            ours, saved = record.get("ours"), record.get("saved")
            if ours is not None and saved is not None and int(cls.SYSCTL.read_text()) == ours:
                cls.SYSCTL.write_text(str(saved))
            return None

        cls._update(change)


def _no_ipv6(name: str) -> None:
    """A fabric link is not an IP interface: without this the kernel sends router
    solicitations on it, which meet the bridge's default drop rule (and would be
    reported as dropped frames of the run)."""
    Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class QuietRemoteController(RemoteController):
    """Mininet's remote controller, checked with a socket instead of telnet.

    Mininet pipes ``telnet`` to the controller and decodes what comes back as
    text; Ryu answers with a binary OpenFlow HELLO, which now and then fails to
    decode (UnicodeDecodeError) and aborts the cluster start."""

    def checkListening(self) -> None:
        try:
            socket.create_connection((self.ip, self.port), timeout=2).close()
        except OSError as e:
            warn(f"Unable to contact the remote controller at {self.ip}:{self.port}: {e}\n")


class EmulatedNetwork:
    """A started Mininet network made from a plan; ``stop()`` always removes it."""

    def __init__(self, plan: FabricPlan, controller_port: int) -> None:
        self.plan = plan
        self.controller_port = controller_port
        self.net: Mininet | None = None
        self.buffers = False

    def start(self) -> Cluster:
        setLogLevel("warning")
        SocketBuffers.acquire(self.plan.socket_buffer)
        self.buffers = True
        topo = FabricTopo(self.plan)
        net = Mininet(
            topo=topo,
            switch=BRIDGE,
            controller=None,
            link=TCLink if topo.shaped else Link,
            build=False,
            autoSetMacs=False,
            cleanup=False,
        )
        self.net = net
        net.addController(
            "c0", controller=QuietRemoteController, ip="127.0.0.1", port=self.controller_port
        )
        net.build()
        for link in net.links:  # before the bridges take the ports in
            for intf in (link.intf1, link.intf2):
                _no_ipv6(intf.name)
        net.start()
        cluster = self.plan.cluster()
        self._check_ports(cluster)
        self._jumbo_links()
        if self.plan.control_queue:
            self._control_queues()
        return cluster

    def _control_queues(self) -> None:
        """Credit frames get a class of their own, ahead of data, in every fabric
        interface's shaping (``typhoon/control_queue.py``)."""
        assert self.net is not None and self.plan.bw_mbit is not None
        for link in self.net.links:
            for intf in (link.intf1, link.intf2):
                q = control_queue.LinkQueueing(intf.name, self.plan.bw_mbit)
                for cmd in control_queue.tc_commands(q):
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
                    if done.returncode != 0:
                        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")

    def _jumbo_links(self) -> None:
        """Fabric links carry the workers' frames: 9000 bytes by default (links of
        LINK_MTU), else the plan's MTU, which the workers' frames then follow.  One
        ``ip -batch`` and one ``ovs-vsctl`` for every interface (a cluster's start
        made two calls per interface)."""
        assert self.net is not None
        mtu = str(self.plan.mtu or LINK_MTU)
        names = [i.name for link in self.net.links for i in (link.intf1, link.intf2)]
        if not names:
            return
        subprocess.run(
            ["ip", "-batch", "-"],
            input="".join(f"link set dev {n} mtu {mtu}\n" for n in names),
            text=True,
            check=True,
            capture_output=True,
            timeout=10,
        )
        sets = [a for n in names for a in ("--", "set", "Interface", n, f"mtu_request={mtu}")]
        subprocess.run(["ovs-vsctl", *sets], check=True, capture_output=True, timeout=10)

    def _check_ports(self, cluster: Cluster) -> None:
        """The plan's port numbers must be the ones Mininet gave the links."""
        assert self.net is not None
        by_bridge = {h.bridge: h.name for h in cluster.hosts.values()}
        actual = set()
        for link in self.net.links:
            i1, i2 = link.intf1, link.intf2
            actual.add(
                (
                    by_bridge[i1.node.name],
                    i1.node.ports[i1],
                    by_bridge[i2.node.name],
                    i2.node.ports[i2],
                )
            )
        planned = {(x.a, x.a_port, x.b, x.b_port) for x in cluster.links}
        if actual != planned:
            raise RuntimeError(f"fabric ports differ from the plan: {actual} != {planned}")

    def bridges(self) -> list[str]:
        return [self.plan.bridge(i) for i in range(1, self.plan.hosts + 1)]

    def stop(self) -> None:
        """Stop Mininet, then make sure no bridge of the plan is left."""
        if self.net is not None:
            try:
                self.net.stop()
            except Exception:  # keep tearing down whatever Mininet left
                log.exception("mininet stop failed; removing bridges directly")
            self.net = None
        for br in self.bridges():
            subprocess.run(
                ["ovs-vsctl", "--if-exists", "del-br", br], capture_output=True, timeout=30
            )
        if self.buffers:
            SocketBuffers.release()
            self.buffers = False
