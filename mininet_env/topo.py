"""The Mininet ``Topo`` of a :class:`FabricPlan`: one bridge per host, the plan's links.

Both emulated networks are built from it: the ``sdn`` emulation
(``mininet_env/network.py``, bridges only: workers attach TAPs to them) and the
``tcp`` baseline's fabric (``benchmarks/tcp_fabric.py``, which adds one Mininet
host, a network namespace, per bridge).  So the two cross the same bridges and
links, and the fabric links get the port numbers that ``FabricPlan.cluster()``
promises the controller: Mininet numbers a bridge's ports in the order links are
added here, fabric links first.
"""

from __future__ import annotations

from typing import Any

from mininet.topo import Topo

from mininet_env.fabric import FabricPlan


class FabricTopo(Topo):
    """Bridges ``plan.bridge(i)`` with ``plan.dpid(i)``, linked as ``plan.pairs()`` says.

    ``hosts`` (host index -> Mininet host name and options) adds those hosts, each
    linked to its own bridge after the fabric links.
    """

    def build(  # type: ignore[override]
        self, plan: FabricPlan, hosts: dict[int, tuple[str, dict[str, Any]]] | None = None
    ) -> None:
        self.plan = plan
        # batch=False: each bridge started on its own, as Mininet does without a Topo
        bridges = {
            i: self.addSwitch(plan.bridge(i), dpid=f"{plan.dpid(i):016x}", batch=False)
            for i in range(1, plan.hosts + 1)
        }
        shaping: dict[str, Any] = {}
        if plan.bw_mbit is not None:
            shaping["bw"] = plan.bw_mbit
        if plan.delay is not None:
            shaping["delay"] = plan.delay
        for a, b in plan.pairs():
            self.addLink(bridges[a], bridges[b], **shaping)
        for i, (name, opts) in sorted((hosts or {}).items()):
            self.addLink(self.addHost(name, **opts), bridges[i])

    @property
    def shaped(self) -> bool:
        """The fabric links need Mininet's TCLink (bandwidth or delay)."""
        return self.plan.bw_mbit is not None or self.plan.delay is not None
