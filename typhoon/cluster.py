"""The compute cluster: hosts with their OVS bridge, and the fabric links between bridges.

Written to the coordinator by whoever builds the cluster (``mininet_env`` for
emulation, an operator's file on real hosts), read by the controller to
compute paths and by agents to find their bridge.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FIRST_WORKER_PORT = 100  # OpenFlow ports below this are left for fabric links and tunnels


DEFAULT_SOCKET_BUFFER = 212992  # Linux net.core.rmem_default


@dataclass(frozen=True)
class HostInfo:
    name: str  # scheduler host name, e.g. "h1"
    bridge: str  # OVS bridge of the host
    dpid: int  # datapath ID of that bridge
    first_worker_port: int = FIRST_WORKER_PORT
    # bytes (kernel truesize) each port socket of the bridge holds: net.core.rmem_default
    # of the host when OVS opened the port; flow control shares it (typhoon.port_budgets)
    socket_buffer: int = DEFAULT_SOCKET_BUFFER
    address: str = ""  # management address (a cluster file's host); "" when emulated

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostInfo:
        return cls(**d)


@dataclass(frozen=True)
class FabricLink:
    """A link between two bridges: ``a``'s OpenFlow port ``a_port`` to ``b``'s ``b_port``."""

    a: str
    a_port: int
    b: str
    b_port: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FabricLink:
        return cls(**d)


@dataclass
class Cluster:
    hosts: dict[str, HostInfo] = field(default_factory=dict)
    links: list[FabricLink] = field(default_factory=list)
    # bytes after a worker frame's Ethernet header that cross the fabric whole (a
    # cluster file's fabric MTU less tunnel headers); None: the emulation's jumbo links
    mtu: int | None = None

    def host_names(self) -> list[str]:
        return list(self.hosts)

    def by_dpid(self, dpid: int) -> HostInfo | None:
        for h in self.hosts.values():
            if h.dpid == dpid:
                return h
        return None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "hosts": [h.to_dict() for h in self.hosts.values()],
            "links": [link.to_dict() for link in self.links],
        }
        if self.mtu is not None:
            d["mtu"] = self.mtu
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cluster:
        hosts = [HostInfo.from_dict(h) for h in d.get("hosts", [])]
        return cls(
            {h.name: h for h in hosts},
            [FabricLink.from_dict(x) for x in d.get("links", [])],
            d.get("mtu"),
        )
