"""Emulated hosts for the ``tcp`` baseline: the same kind of network the ``sdn`` runs cross.

A ``tcp`` run on one machine would otherwise talk over loopback, which no
remote worker of a real cluster does.  So the baseline's workers run inside
Mininet hosts (network namespaces), one per emulated host, each attached to
its own userspace Open vSwitch bridge; the bridges are linked in a full mesh
of 65,000-byte links, built from the same ``FabricPlan`` and Mininet topology
(``mininet_env/topo.py``) as the ``sdn`` fabric.  A
tuple between two hosts thus crosses veth -> userspace OVS -> veth -> userspace
OVS -> veth in both systems; only the end points differ (a TCP socket here, a
TAP port there).

Forwarding is plain L2, as a Storm cluster's network would do it: one static
rule per destination MAC on every bridge (``fail_mode=secure``, no controller,
no learning, so the mesh's loops cannot flood) and static ARP entries.  The
first bridge's internal port, in the root namespace, gets an address too: the
run coordinator (:class:`~typhoon.tcp_cluster.TcpCluster`, in this process)
listens there for the workers' control connections.

Userspace OVS does not complete checksums that a sender left to the NIC
(veth TX checksum offload), so the hosts turn that offload off; without it
every TCP segment arrives with a bad checksum and is dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import networkx as nx
from mininet.link import Link
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import Host, OVSSwitch

from mininet_env.fabric import FabricPlan
from mininet_env.network import BRIDGE, SocketBuffers
from mininet_env.topo import FabricTopo
from typhoon.supervised import Supervised
from typhoon.tcp_cluster import Launcher, RunOptions, TcpCluster
from typhoon.topology.model import Topology

log = logging.getLogger(__name__)

LINK_MTU = 65000  # as the sdn fabric (mininet_env/network.py): the same links for both
DPID_BASE = 0x7474_0000
SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17  # struct ethtool_value {u32 cmd; u32 data}

# Run in each host's namespace: turn TX checksum offload off on its interface.
_TX_CSUM_OFF = (
    "import array,fcntl,socket,struct,sys;"
    f"v=array.array('I',[{ETHTOOL_STXCSUM},0]);"
    "r=struct.pack('16sP',sys.argv[1].encode(),v.buffer_info()[0]);"
    "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
    f"fcntl.ioctl(s,{SIOCETHTOOL},r)"
)


class TcpFabric:
    """``hosts`` Mininet hosts ``h1..hN`` on a mesh of userspace OVS bridges.

    Names carry ``prefix`` (bridges ``<prefix>1``, hosts ``<prefix>h1``) so
    nothing clashes with the sdn fabric or another user's bridges; addresses
    are ``<subnet>.i`` for host ``hi`` and ``<subnet>.254`` for the root
    namespace (the coordinator).
    """

    def __init__(
        self, hosts: int = 3, prefix: str = "tyt", subnet: str = "10.213.0", shape: str = "mesh"
    ) -> None:
        if not 1 <= hosts <= 200:
            raise ValueError("hosts must be in 1..200")
        # the sdn emulation's plan (a full mesh unless asked otherwise: the static rules
        # below route over the shortest path, the direct link in a mesh) with its own
        # bridge names and datapath ids
        self.plan = FabricPlan(hosts, shape, prefix=prefix, dpid_base=DPID_BASE)
        self.n = hosts
        self.prefix = prefix
        self.subnet = subnet
        self.net: Mininet | None = None
        self.hosts: dict[str, Host] = {}
        self.control_ip = f"{subnet}.254"
        self.buffers = False

    # ----- addresses -----------------------------------------------------------------------

    def host_names(self) -> list[str]:
        return self.plan.host_names()

    def ip(self, i: int) -> str:
        return f"{self.subnet}.{i}"

    @staticmethod
    def mac(i: int) -> str:
        return f"02:54:43:50:00:{i:02x}"  # locally administered, "TCP"

    def bridge(self, i: int) -> str:
        return self.plan.bridge(i)

    def bind(self) -> dict[str, str]:
        """Host -> the address its workers listen on (``RunOptions.bind``)."""
        return {f"h{i}": self.ip(i) for i in range(1, self.n + 1)}

    # ----- life ----------------------------------------------------------------------------

    def start(self) -> None:
        setLogLevel("warning")
        # the same port socket buffers as the sdn fabric (mininet_env.network.SocketBuffers)
        SocketBuffers.acquire(self.plan.socket_buffer)
        self.buffers = True
        namespaces = {
            i: (f"{self.prefix}h{i}", {"ip": f"{self.ip(i)}/24", "mac": self.mac(i)})
            for i in range(1, self.n + 1)
        }
        net = Mininet(
            topo=FabricTopo(self.plan, namespaces),
            switch=BRIDGE,
            controller=None,
            link=Link,
            build=False,
            autoSetMacs=False,
            cleanup=False,
        )
        self.net = net
        net.build()
        net.start()
        n = self.n
        switches = {i: net.get(self.bridge(i)) for i in range(1, n + 1)}
        hosts = {i: net.get(namespaces[i][0]) for i in range(1, n + 1)}
        self.hosts = {f"h{i}": hosts[i] for i in range(1, n + 1)}
        self._mtu()
        self._flows(switches, hosts)
        self._arp(hosts)

    def _mtu(self) -> None:
        assert self.net is not None
        for link in self.net.links:
            for intf in (link.intf1, link.intf2):
                if isinstance(intf.node, OVSSwitch):
                    _run("ip", "link", "set", "dev", intf.name, "mtu", str(LINK_MTU))
                    _run("ovs-vsctl", "set", "Interface", intf.name, f"mtu_request={LINK_MTU}")
                else:
                    intf.node.cmd(f"ip link set dev {intf.name} mtu {LINK_MTU}")
                    out = intf.node.cmd(f'{sys.executable} -c "{_TX_CSUM_OFF}" {intf.name}')
                    if out.strip():
                        raise RuntimeError(f"cannot turn TX checksum offload off: {out}")
        # the coordinator's address: the first bridge's internal port, in the root namespace
        local = self.bridge(1)
        _run("ovs-vsctl", "set", "Interface", local, f"mtu_request={LINK_MTU}")
        _run("ip", "link", "set", "dev", local, "mtu", str(LINK_MTU), "up")
        _run("ip", "addr", "replace", f"{self.control_ip}/24", "dev", local)

    def _flows(self, switches: dict[int, OVSSwitch], hosts: dict[int, Host]) -> None:
        """Per-destination rules on every bridge: to the local host, or the link to the
        next bridge on the shortest path (the direct link in a mesh)."""
        assert self.net is not None
        port: dict[tuple[str, str], int] = {}
        for link in self.net.links:
            for a, b in ((link.intf1, link.intf2), (link.intf2, link.intf1)):
                if isinstance(a.node, OVSSwitch):
                    port[(a.node.name, b.node.name)] = a.node.ports[a]
        local_mac = Path(f"/sys/class/net/{self.bridge(1)}/address").read_text().strip()
        self.control_mac = local_mac
        hop = next_hops(self.plan)
        for i, sw in switches.items():
            rules = []
            for j, h in hosts.items():
                out = (
                    port[(sw.name, h.name)] if i == j else port[(sw.name, switches[hop[i, j]].name)]
                )
                rules.append(f"priority=100,dl_dst={self.mac(j)},actions=output:{out}")
            out_local = "LOCAL" if i == 1 else str(port[(sw.name, switches[hop[i, 1]].name)])
            rules.append(f"priority=100,dl_dst={local_mac},actions=output:{out_local}")
            for rule in rules:
                _run("ovs-ofctl", "-O", "OpenFlow13", "add-flow", sw.name, rule)

    def _arp(self, hosts: dict[int, Host]) -> None:
        for i, h in hosts.items():
            dev = h.defaultIntf().name
            neighbours = [(self.ip(j), self.mac(j)) for j in hosts if j != i]
            for ip, mac in [*neighbours, (self.control_ip, self.control_mac)]:
                h.cmd(f"ip neigh replace {ip} lladdr {mac} dev {dev} nud permanent")
            _run(
                "ip", "neigh", "replace", self.ip(i), "lladdr", self.mac(i), "dev",
                self.bridge(1), "nud", "permanent",
            )  # fmt: skip

    def launcher(self) -> Launcher:
        """Start a worker inside its emulated host's namespace (``TcpCluster`` launcher)."""

        def launch(host: str, argv: list[str], logfile: Path) -> Supervised:
            with open(logfile, "wb") as out:  # the child has its own copy
                proc = self.hosts[host].popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            return Supervised(logfile.stem, proc, log=logfile, own_session=False)

        return launch

    def stop(self) -> None:
        """Stop Mininet, then make sure no bridge of ours is left."""
        if self.net is not None:
            try:
                self.net.stop()
            except Exception:  # keep tearing down whatever Mininet left
                log.exception("mininet stop failed; removing bridges directly")
            self.net = None
        for i in range(1, self.n + 1):
            subprocess.run(
                ["ovs-vsctl", "--if-exists", "del-br", self.bridge(i)],
                capture_output=True,
                timeout=30,
            )
        if self.buffers:
            SocketBuffers.release()
            self.buffers = False


class FabricTcpCluster(TcpCluster):
    """A :class:`TcpCluster` whose workers live in a :class:`TcpFabric`'s namespaces.

    The only difference: workers reach the coordinator at the fabric's root
    namespace address, not at their own host's address (which, in a namespace,
    is not where this process listens).
    """

    def __init__(
        self,
        topology: Topology,
        options: RunOptions,
        fabric: TcpFabric,
        workdir: Path | None = None,
        **kwargs: Any,
    ) -> None:
        # the coordinator listens only where the namespaces reach it
        options = dataclasses.replace(options, control_bind=fabric.control_ip)
        super().__init__(topology, options, workdir=workdir, launcher=fabric.launcher(), **kwargs)
        self.fabric = fabric

    def control_address(self, host: str) -> tuple[str, int]:
        return (self.fabric.control_ip, self.server.getsockname()[1])


def next_hops(plan: FabricPlan) -> dict[tuple[int, int], int]:
    """(bridge i, destination bridge j) -> the bridge after i on a shortest path to j."""
    graph: nx.Graph[int] = nx.Graph(plan.pairs())
    graph.add_nodes_from(range(1, plan.hosts + 1))
    hops = {}
    for i, paths in nx.all_pairs_shortest_path(graph):
        for j, path in paths.items():
            if i != j:
                hops[i, j] = path[1]
    return hops


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
