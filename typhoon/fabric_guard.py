"""The fabric's protection on one host: an nftables filter for the tunnel ports.

VXLAN and Geneve carry worker frames without authentication: any machine that
can send UDP to a host's port 4789 or 6081 can put frames on its bridge.  The
fabric is therefore a trusted underlay, and ``typhoon cluster apply`` makes it
one: a table of its own (``inet typhoon_fabric``) accepts tunnel UDP only from
the other hosts of the cluster file and counts and drops the rest.  The table
is replaced in one ``nft -f`` transaction (idempotent) and removed by
``typhoon cluster teardown``.  ``fabric.firewall: false`` in the cluster file
opts out (a trusted underlay); ``fabric.ipsec`` adds Open vSwitch's IPsec on
every tunnel (:mod:`typhoon.bridge_plan`).

The kernel datapath decapsulates tunnels in the host's IP stack, after the
``input`` hook; the userspace (``netdev``) datapath reads the underlay NIC
itself, so its tunnel packets never meet this filter, which :func:`protection`
says.

Pure: the ruleset, what ``nft -j list table`` shows, and the sentences.
Running ``nft`` is :mod:`typhoon.host_setup`'s job.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field

from typhoon.cluster_file import ClusterFile

FAMILY = "inet"
TABLE = "typhoon_fabric"
TUNNEL_PORTS = (4789, 6081)  # VXLAN, Geneve (both filtered, whichever the fabric uses)
NFT = "nft"


def peers(cf: ClusterFile, host: str) -> list[str]:
    """The addresses tunnel packets may come from: every other host of the file."""
    return [h.address for h in cf.hosts.values() if h.name != host]


def ruleset(cf: ClusterFile, host: str) -> str:
    """The nft script (for ``nft -f -``) that installs or replaces the table, atomically."""
    by_family: dict[int, list[str]] = {4: [], 6: []}
    for a in peers(cf, host):
        by_family[ipaddress.ip_address(a).version].append(a)
    ports = ", ".join(str(p) for p in TUNNEL_PORTS)
    lines = [
        f"add table {FAMILY} {TABLE}",  # so that the delete below never fails
        f"delete table {FAMILY} {TABLE}",
        f"table {FAMILY} {TABLE} {{",
    ]
    for version, kind in ((4, "ipv4_addr"), (6, "ipv6_addr")):
        elements = (
            f" elements = {{ {', '.join(by_family[version])} }};" if by_family[version] else ""
        )
        lines.append(f"  set peers{version} {{ type {kind};{elements} }}")
    lines += [
        "  chain input {",
        "    type filter hook input priority -10; policy accept;",
        f"    udp dport {{ {ports} }} ip saddr @peers4 accept",
        f"    udp dport {{ {ports} }} ip6 saddr @peers6 accept",
        f"    udp dport {{ {ports} }} counter drop",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def removal() -> str:
    """The nft script that removes the table (nothing to remove is fine)."""
    return f"add table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n"


@dataclass
class FirewallState:
    """The table as ``nft -j list table`` shows it (``exists=False``: no table)."""

    exists: bool = False
    peers: set[str] = field(default_factory=set)
    hooked: bool = False  # a chain on the input hook
    drops: bool = False  # some rule drops
    dropped: int = 0  # packets the counter saw


def parse_listing(text: str) -> FirewallState:
    """What matters of ``nft -j list table inet typhoon_fabric``'s output."""
    state = FirewallState(exists=True)
    for item in json.loads(text).get("nftables", []):
        if "set" in item:
            for e in item["set"].get("elem", []):
                if isinstance(e, str):
                    state.peers.add(str(ipaddress.ip_address(e)))
        elif "chain" in item:
            state.hooked |= item["chain"].get("hook") == "input"
        elif "rule" in item:
            for expr in item["rule"].get("expr", []):
                state.drops |= "drop" in expr
                if "counter" in expr and isinstance(expr["counter"], dict):
                    state.dropped += int(expr["counter"].get("packets", 0))
    return state


def firewall_problems(
    cf: ClusterFile, host: str, state: FirewallState | None, nft_found: bool
) -> list[str]:
    """What is wrong with this host's filter, one sentence each (none when opted out)."""
    if not cf.tunneled or not cf.firewall:
        return []
    if not nft_found:
        return [nft_missing(cf)]
    if state is None or not state.exists:
        return [f"fabric firewall missing: nftables table {FAMILY} {TABLE} (run apply)"]
    want = {str(ipaddress.ip_address(a)) for a in peers(cf, host)}
    if state.peers != want or not state.hooked or not state.drops:
        return [f"fabric firewall {FAMILY} {TABLE} differs from the file (run apply)"]
    return []


def nft_missing(cf: ClusterFile) -> str:
    return (
        f"the fabric firewall needs nftables (the nft command is not installed): install it, "
        f"or set fabric.firewall: false in {cf.source} to trust the underlay"
    )


def protection(
    cf: ClusterFile, host: str, firewall_ok: bool, ipsec_ok: bool, dropped: int = 0
) -> str:
    """One sentence: which protection the fabric of ``host`` has now."""
    if not cf.tunneled:
        return "fabric protection: physical ports (no tunnels to filter)"
    parts = []
    if firewall_ok:
        n = len(peers(cf, host))
        if cf.hosts[host].datapath == "netdev":
            parts.append(
                "nftables filter installed, but datapath netdev tunnels bypass it "
                "(userspace tunneling reads the underlay NIC itself)"
            )
        else:
            parts.append(
                f"nftables (tunnel UDP from the file's {n} peer(s) only, {dropped} dropped)"
            )
    if ipsec_ok:
        parts.append("IPsec on every tunnel (pre-shared key)")
    if not parts:
        trusted = " (fabric.firewall: false)" if not cf.firewall and not cf.ipsec else ""
        return f"fabric protection: none: the underlay is trusted{trusted}"
    return "fabric protection: " + "; ".join(parts)
