"""The operator's cluster file: real hosts, their bridges, the fabric between them.

In the spirit of Faucet's ``dps:`` file, one YAML document describes every
host of a deployment, so each host can configure its own bridge from it
(``typhoon cluster apply FILE``) and all of them agree on the
:class:`typhoon.cluster.Cluster` the controller reads::

    controller: tcp:10.0.0.1:6653         # or ssl:HOST:PORT, or a list of them
    coordinator: zk://10.0.0.1:2181/typhoon
    fabric:
      type: vxlan                         # vxlan | geneve | ports
      mtu: 1500                           # IP MTU of the underlay (ports: of the links)
      key: 4242                           # tunnel VNI (optional, default 0)
      firewall: true                      # nftables: tunnel UDP from these hosts only
      ipsec: {psk_file: /etc/typhoon/fabric-psk}   # optional: OVS IPsec on every tunnel
      control_class: {rate_mbit: 900}     # optional: credit frames ahead of data (tc htb)
    hosts:
      h1: {address: 10.0.0.1, bridge: br-typhoon, dpid: 0x1}
      h2: {address: 10.0.0.2, bridge: br-typhoon, dpid: 0x2, datapath: netdev}
    links:                                # only with `type: ports`
      - [h1:eth1, h2:eth1]

Tunnels form a full mesh: on every bridge, OpenFlow port N leads to the N-th
host of the file (so port numbers stay below the worker range and never
depend on the order hosts were set up).  Physical links are numbered per host
in the order of ``links``.  This module is pure: it reads and checks the
file; :mod:`typhoon.bridge_plan` turns it into ``ovs-vsctl`` commands.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from typhoon.cluster import FIRST_WORKER_PORT, Cluster, FabricLink, HostInfo
from typhoon.wire import ETH_HLEN, MIN_MTU

FABRIC_TYPES = ("vxlan", "geneve", "ports")
DATAPATHS = ("system", "netdev")
TUNNEL_PREFIX = "tyt"  # tunnel ports are tyt1, tyt2, ...: "port N leads to host N"
MIN_FABRIC_MTU = 576  # what every IPv4 path carries; below that nothing useful fits
MAX_FABRIC_MTU = 65535
# encapsulation added to a worker frame (its Ethernet header included) by each
# tunnel type: outer IP + UDP + tunnel header (Geneve without options)
_TUNNEL_HEADER = {"vxlan": 8 + 8, "geneve": 8 + 8}
_IP_HEADER = {4: 20, 6: 40}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
_CONTROLLER = re.compile(r"^(tcp|ssl):(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_ZK = re.compile(r"^zk://[^/\s]+(/\S*)?$")

_TOP_KEYS = ("controller", "coordinator", "fabric", "hosts", "links")
_FABRIC_KEYS = ("type", "mtu", "key", "firewall", "ipsec", "control_class")
_IPSEC_KEYS = ("psk_file",)
_CONTROL_CLASS_KEYS = ("rate_mbit",)
MAX_RATE_MBIT = 400_000
_HOST_KEYS = ("address", "bridge", "dpid", "datapath")


class ClusterFileError(ValueError):
    """A cluster file that cannot be used; ``str()`` is ``file: where: sentence``."""


@dataclass(frozen=True)
class HostEntry:
    name: str
    address: str  # management address; also the tunnel endpoint
    bridge: str
    dpid: int
    datapath: str = "system"  # system (kernel) | netdev (userspace)


@dataclass(frozen=True)
class PhysicalLink:
    """Interface ``a_if`` of host ``a`` is cabled to interface ``b_if`` of host ``b``."""

    a: str
    a_if: str
    b: str
    b_if: str


@dataclass(frozen=True)
class Tunnel:
    """One tunnel port of a host's bridge: OpenFlow ``port`` leads to host ``peer``."""

    name: str  # OVS interface name
    port: int
    peer: str
    local_ip: str
    remote_ip: str


@dataclass(frozen=True)
class FabricPort:
    """One physical port of a host's bridge on the fabric."""

    interface: str
    port: int
    peer: str


@dataclass
class ClusterFile:
    controllers: list[str]  # OVS controller targets, e.g. "tcp:10.0.0.1:6653"
    coordinator: str
    fabric_type: str
    mtu: int  # IP MTU of the underlay (tunnels) or of the links (ports)
    key: int
    hosts: dict[str, HostEntry]
    links: list[PhysicalLink] = field(default_factory=list)
    source: str = "<cluster file>"
    # protection of the tunnels (typhoon/fabric_guard.py): the nftables filter, opt-out;
    # Open vSwitch IPsec with the pre-shared key in this file (mode 0600), opt-in
    firewall: bool = True
    ipsec_psk_file: str | None = None
    # fabric.control_class: the rate (Mbit/s) the underlay interface is shaped to, its
    # credit frames in a class ahead of data (typhoon/control_queue.py); None: no shaping
    control_rate_mbit: float | None = None

    @property
    def tunneled(self) -> bool:
        return self.fabric_type != "ports"

    @property
    def ipsec(self) -> bool:
        return self.ipsec_psk_file is not None

    def frame_mtu(self) -> int:
        """Bytes after a worker frame's Ethernet header that cross the fabric whole.

        A tunnel carries the worker's whole Ethernet frame inside an outer IP
        packet of at most ``mtu`` bytes, so a 1500-byte underlay leaves 1450
        (VXLAN or Geneve over IPv4) or 1430 (over IPv6) for the worker."""
        if not self.tunneled:
            return self.mtu
        family = max(ipaddress.ip_address(h.address).version for h in self.hosts.values())
        return self.mtu - _IP_HEADER[family] - _TUNNEL_HEADER[self.fabric_type] - ETH_HLEN

    def ip_version(self) -> int:
        """4 or 6: the tunnels' outer IP (the file's addresses are all of one family)."""
        return max(ipaddress.ip_address(h.address).version for h in self.hosts.values())

    def host_index(self, name: str) -> int:
        """1-based position of host ``name`` in the file."""
        return list(self.hosts).index(name) + 1

    def tunnels(self, host: str) -> list[Tunnel]:
        """The tunnel ports of ``host``'s bridge (empty for a ports fabric)."""
        if not self.tunneled:
            return []
        me = self.hosts[host]
        return [
            Tunnel(f"{TUNNEL_PREFIX}{i}", i, peer.name, me.address, peer.address)
            for i, peer in enumerate(self.hosts.values(), start=1)
            if peer.name != host
        ]

    def fabric_ports(self, host: str) -> list[FabricPort]:
        """The physical fabric ports of ``host``'s bridge, numbered in link order."""
        ports: list[FabricPort] = []
        for link in self.links:
            for me, my_if, peer in ((link.a, link.a_if, link.b), (link.b, link.b_if, link.a)):
                if me == host:
                    ports.append(FabricPort(my_if, len(ports) + 1, peer))
        return ports

    def cluster(self) -> Cluster:
        """The cluster as the controller and the agents see it."""
        hosts = {h.name: HostInfo(h.name, h.bridge, h.dpid, address=h.address)
                 for h in self.hosts.values()}  # fmt: skip
        links: list[FabricLink] = []
        if self.tunneled:
            names = list(self.hosts)
            for i, a in enumerate(names, start=1):
                for j, b in enumerate(names[i:], start=i + 1):
                    links.append(FabricLink(a, j, b, i))
        else:
            numbered: dict[str, int] = {}
            for link in self.links:
                numbered[link.a] = numbered.get(link.a, 0) + 1
                numbered[link.b] = numbered.get(link.b, 0) + 1
                links.append(FabricLink(link.a, numbered[link.a], link.b, numbered[link.b]))
        return Cluster(hosts, links, mtu=self.frame_mtu())


def load_cluster_file(path: str | Path) -> ClusterFile:
    """Read and check a cluster file; the first problem raises :class:`ClusterFileError`."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ClusterFileError(f"{source}: cannot read: {e.strerror or e}") from e
    return parse_cluster_text(text, source)


def parse_cluster_text(text: str, source: str = "<cluster file>") -> ClusterFile:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        what = getattr(e, "problem", None) or str(e)
        raise ClusterFileError(f"{source}: {where}not valid YAML: {what}") from e
    return _Reader(source).read(data)


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str) -> ClusterFileError:
        return ClusterFileError(f"{self.source}: {where}: {message}")

    def keys(self, where: str, value: Any, allowed: tuple[str, ...], required: tuple[str, ...]):
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a mapping, not {_show(value)}")
        for k in value:
            if k not in allowed:
                close = difflib.get_close_matches(str(k), allowed, n=1)
                hint = (
                    f"; did you mean '{close[0]}'?" if close else f" (known: {', '.join(allowed)})"
                )
                raise self.fail(where, f"unknown key '{k}'{hint}")
        for k in required:
            if k not in value:
                raise self.fail(where, f"missing '{k}'")
        return value

    def read(self, data: Any) -> ClusterFile:
        top = self.keys(
            "top level", data, _TOP_KEYS, ("controller", "coordinator", "fabric", "hosts")
        )
        controllers = self.controllers(top["controller"])
        coordinator = top["coordinator"]
        if not isinstance(coordinator, str) or not (
            _ZK.match(coordinator) or coordinator.startswith("sqlite:///")
        ):
            raise self.fail(
                "coordinator",
                f"must be zk://HOST:PORT[,HOST:PORT]/PREFIX (or sqlite:///PATH on one machine), "
                f"not {_show(coordinator)}",
            )
        fabric = self.keys("fabric", top["fabric"], _FABRIC_KEYS, ("type", "mtu"))
        ftype = fabric["type"]
        if ftype not in FABRIC_TYPES:
            raise self.fail(
                "fabric.type", f"must be one of {', '.join(FABRIC_TYPES)}, not {_show(ftype)}"
            )
        mtu = self.integer("fabric.mtu", fabric["mtu"], MIN_FABRIC_MTU, MAX_FABRIC_MTU)
        key = self.integer("fabric.key", fabric.get("key", 0), 0, (1 << 24) - 1)
        hosts = self.hosts(top["hosts"])
        links = self.links(top.get("links"), ftype, hosts)
        firewall = fabric.get("firewall", True)
        if not isinstance(firewall, bool):
            raise self.fail("fabric.firewall", f"must be true or false, not {_show(firewall)}")
        psk_file = self.ipsec(fabric.get("ipsec"), ftype, hosts)
        rate = self.control_class(fabric.get("control_class"), ftype, psk_file)
        cf = ClusterFile(controllers, coordinator, ftype, mtu, key, hosts, links, self.source,
                         firewall, psk_file, rate)  # fmt: skip
        if cf.tunneled:
            families = {ipaddress.ip_address(h.address).version for h in hosts.values()}
            if len(families) > 1:
                raise self.fail("hosts", "tunnel endpoints mix IPv4 and IPv6 addresses")
            if len(hosts) >= FIRST_WORKER_PORT:
                raise self.fail(
                    "hosts", f"a tunnel mesh takes at most {FIRST_WORKER_PORT - 1} hosts"
                )
        frame = cf.frame_mtu()
        if frame < MIN_MTU + 64:
            raise self.fail("fabric.mtu", f"{mtu} leaves {frame} bytes per worker frame: too small")
        return cf

    def ipsec(self, value: Any, ftype: str, hosts: dict[str, HostEntry]) -> str | None:
        """The pre-shared key file of ``fabric.ipsec`` (None: no IPsec)."""
        if value is None:
            return None
        self.keys("fabric.ipsec", value, _IPSEC_KEYS, ("psk_file",))
        if ftype == "ports":
            raise self.fail("fabric.ipsec", "a ports fabric has no tunnels to encrypt")
        path = value["psk_file"]
        if not isinstance(path, str) or not path.startswith("/"):
            raise self.fail("fabric.ipsec.psk_file", f"must be an absolute path, not {_show(path)}")
        netdev = [h.name for h in hosts.values() if h.datapath == "netdev"]
        if netdev:
            raise self.fail(
                "fabric.ipsec",
                f"Open vSwitch's IPsec needs the kernel datapath; {', '.join(netdev)} "
                "use datapath netdev",
            )
        return path

    def control_class(self, value: Any, ftype: str, psk_file: str | None) -> float | None:
        """The rate of ``fabric.control_class`` (None: none asked for)."""
        if value is None:
            return None
        self.keys("fabric.control_class", value, _CONTROL_CLASS_KEYS, ("rate_mbit",))
        rate = value["rate_mbit"]
        if type(rate) not in (int, float) or not 0 < rate <= MAX_RATE_MBIT:
            raise self.fail(
                "fabric.control_class.rate_mbit",
                f"must be a number of Mbit/s in (0, {MAX_RATE_MBIT}], not {_show(rate)}",
            )
        if ftype == "ports":
            raise self.fail(
                "fabric.control_class", "is for tunnels (an emulated ports fabric has its own)"
            )
        if psk_file is not None:
            raise self.fail(
                "fabric.control_class",
                "cannot tell credit frames from data inside IPsec (ESP encrypts the Typhoon "
                "header): remove one of fabric.ipsec and fabric.control_class",
            )
        return float(rate)

    def controllers(self, value: Any) -> list[str]:
        items = value if isinstance(value, list) else [value]
        if not items:
            raise self.fail("controller", "names no controller")
        for i, c in enumerate(items):
            where = "controller" if not isinstance(value, list) else f"controller[{i}]"
            m = _CONTROLLER.match(c) if isinstance(c, str) else None
            if m is None or not 1 <= int(m.group(3)) <= 65535:
                raise self.fail(where, f"must be tcp:HOST:PORT or ssl:HOST:PORT, not {_show(c)}")
        return list(items)

    def integer(self, where: str, value: Any, low: int, high: int) -> int:
        if type(value) is not int or not low <= value <= high:
            raise self.fail(where, f"must be an integer in {low}..{high}, not {_show(value)}")
        return value

    def hosts(self, value: Any) -> dict[str, HostEntry]:
        if not isinstance(value, dict) or not value:
            raise self.fail(
                "hosts", f"must be a non-empty mapping of host names, not {_show(value)}"
            )
        hosts: dict[str, HostEntry] = {}
        seen: dict[tuple[str, Any], str] = {}
        for name, h in value.items():
            where = f"hosts.{name}"
            if not isinstance(name, str) or not _NAME.match(name):
                raise self.fail(where, "host names are letters, digits, _ . - (not first)")
            self.keys(where, h, _HOST_KEYS, ("address", "bridge", "dpid"))
            try:
                address = str(ipaddress.ip_address(h["address"]))
            except ValueError:
                raise self.fail(
                    f"{where}.address", f"must be an IP address, not {_show(h['address'])}"
                ) from None
            bridge = h["bridge"]
            if not isinstance(bridge, str) or not _IFNAME.match(bridge):
                raise self.fail(
                    f"{where}.bridge",
                    f"must be an interface name (<= 15 chars), not {_show(bridge)}",
                )
            dpid = self.integer(f"{where}.dpid", h["dpid"], 1, (1 << 64) - 1)
            datapath = h.get("datapath", "system")
            if datapath not in DATAPATHS:
                raise self.fail(
                    f"{where}.datapath",
                    f"must be one of {', '.join(DATAPATHS)}, not {_show(datapath)}",
                )
            for what, v in (("dpid", dpid), ("address", address)):
                if (what, v) in seen:
                    raise self.fail(
                        f"{where}.{what}", f"{_show(v)} is also host {seen[(what, v)]}'s"
                    )
                seen[(what, v)] = name
            hosts[name] = HostEntry(name, address, bridge, dpid, datapath)
        return hosts

    def links(self, value: Any, ftype: str, hosts: dict[str, HostEntry]) -> list[PhysicalLink]:
        if ftype != "ports":
            if value:
                raise self.fail(
                    "links", f"a {ftype} fabric is a full mesh of tunnels: remove 'links'"
                )
            return []
        if not isinstance(value, list) or not value:
            raise self.fail(
                "links", "a ports fabric needs a list of [HOST:IFACE, HOST:IFACE] links"
            )
        links: list[PhysicalLink] = []
        used: set[tuple[str, str]] = set()
        for i, item in enumerate(value):
            where = f"links[{i}]"
            if not isinstance(item, list) or len(item) != 2:
                raise self.fail(where, f"must be [HOST:IFACE, HOST:IFACE], not {_show(item)}")
            ends = []
            for end in item:
                host, _, iface = str(end).partition(":")
                if host not in hosts:
                    close = difflib.get_close_matches(host, list(hosts), n=1)
                    hint = f"; did you mean '{close[0]}'?" if close else ""
                    raise self.fail(where, f"no host named '{host}'{hint}")
                if not _IFNAME.match(iface):
                    raise self.fail(where, f"'{end}' is not HOST:IFACE")
                if (host, iface) in used:
                    raise self.fail(where, f"interface {iface} of {host} is already linked")
                used.add((host, iface))
                ends.append((host, iface))
            if ends[0][0] == ends[1][0]:
                raise self.fail(where, "links a host to itself")
            links.append(PhysicalLink(ends[0][0], ends[0][1], ends[1][0], ends[1][1]))
        return links


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    return repr(value)
