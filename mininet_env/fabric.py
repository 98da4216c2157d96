"""Emulated cluster fabric: one userspace OVS bridge per host, links between bridges.

One description (:class:`FabricPlan`) yields both the Mininet network and the
:class:`typhoon.cluster.Cluster` the controller reads, so the two cannot
disagree about which port leads where (Faucet's "one generator" rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from typhoon.cluster import FIRST_WORKER_PORT, Cluster, FabricLink, HostInfo
from typhoon.cluster_file import MIN_FABRIC_MTU
from typhoon.runtime.truesize import MAX_TRUESIZE

SHAPES = ("mesh", "line", "star")
# net.core.rmem_default while an emulation runs: every switch port's socket holds this
# many bytes of frames (truesize), shared by the senders that cross it (docs/flow_control.md)
EMULATED_SOCKET_BUFFER = 4 << 20


@dataclass(frozen=True)
class FabricPlan:
    """How many hosts, how they are wired, and what the links are like."""

    hosts: int = 3
    shape: str = "mesh"
    prefix: str = "tys"  # bridge names: tys1, tys2, ... (short: Linux names are <= 15 chars)
    bw_mbit: float | None = None
    delay: str | None = None  # e.g. "1ms"
    dpid_base: int = 0x7479_0000
    socket_buffer: int = EMULATED_SOCKET_BUFFER  # bytes; see mininet_env.network
    # MTU of the fabric links, which the workers' frames then follow (as a cluster
    # file's fabric would: 1450 is VXLAN on a 1500-byte underlay); None: jumbo links
    mtu: int | None = None
    # a strict-priority queue for credit frames on every fabric interface
    # (typhoon/control_queue.py; docs/flow_control.md "Control traffic apart from data")
    control_queue: bool = False

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise ValueError("a cluster needs at least one host")
        if self.shape not in SHAPES:
            raise ValueError(f"fabric shape must be one of {', '.join(SHAPES)}")
        if len(self.prefix) + len(str(self.hosts)) + len("-eth99") > 15:
            raise ValueError("bridge prefix too long for Linux interface names")
        if self.mtu is not None and not MIN_FABRIC_MTU <= self.mtu <= 65000:
            raise ValueError(f"fabric mtu must be between {MIN_FABRIC_MTU} and 65000 bytes")
        if self.control_queue and (self.bw_mbit is None or self.delay is not None):
            raise ValueError(
                "a control queue needs links shaped by a rate (an unshaped link never "
                "queues) and no delay (netem's queue is not split): set bw_mbit only"
            )
        if not 16 * MAX_TRUESIZE <= self.socket_buffer <= 1 << 30:
            raise ValueError(
                f"socket buffer must be between {16 * MAX_TRUESIZE} and {1 << 30} bytes"
            )

    def host_names(self) -> list[str]:
        return [f"h{i}" for i in range(1, self.hosts + 1)]

    def bridge(self, host_index: int) -> str:
        return f"{self.prefix}{host_index}"

    def dpid(self, host_index: int) -> int:
        return self.dpid_base + host_index

    def pairs(self) -> list[tuple[int, int]]:
        """Host index pairs (1-based) joined by a link, in a fixed order."""
        n = self.hosts
        if self.shape == "mesh":
            return [(a, b) for a in range(1, n + 1) for b in range(a + 1, n + 1)]
        if self.shape == "line":
            return [(a, a + 1) for a in range(1, n)]
        return [(1, b) for b in range(2, n + 1)]

    def cluster(self) -> Cluster:
        """The cluster as the controller sees it: Mininet numbers a bridge's link
        ports 1, 2, ... in the order links are added, which ``pairs`` fixes."""
        next_port = {i: 1 for i in range(1, self.hosts + 1)}
        links = []
        for a, b in self.pairs():
            links.append(FabricLink(f"h{a}", next_port[a], f"h{b}", next_port[b]))
            next_port[a] += 1
            next_port[b] += 1
        if max(next_port.values()) >= FIRST_WORKER_PORT:
            raise ValueError("too many fabric links for the worker port range")
        buf = self.socket_buffer  # EmulatedNetwork sets it before any port exists
        hosts = {
            f"h{i}": HostInfo(f"h{i}", self.bridge(i), self.dpid(i), socket_buffer=buf)
            for i in range(1, self.hosts + 1)
        }
        return Cluster(hosts, links, mtu=self.mtu)
