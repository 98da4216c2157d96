"""A fake OpenFlow table and fabric for tests, in the spirit of Faucet's fakeoftable.

Tests ask "where does this frame end up?" instead of reading flow text: a
`FakeTable` applies one bridge's RuleSpecs to a packet (highest priority wins,
an ambiguous tie is an error, as OpenFlow leaves it undefined), and a
`FakeFabric` follows outputs across the cluster's links until every copy is
delivered to a worker port, to the controller, or dropped.

Select groups (GroupSpecs) are applied as OVS does without a selection method:
a hash of the frame picks one of 16..64 table entries that the buckets share by
weight (Webster's method, as ``group_setup_dp_hash_table`` in OVS).  The hash
is crc32 of the addresses, not OVS's, so a test can check that the split
follows the weights but not which slot lands where.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from controller.rules.flows import OFPP_CONTROLLER, RuleSpec
from controller.rules.groups import HASH_ENTRIES, Bucket, GroupSpec
from typhoon.cluster import Cluster, FabricLink, HostInfo
from typhoon.wire import ETHERTYPE

MAX_HOPS = 64


@dataclass(frozen=True)
class Packet:
    in_port: int
    eth_src: str
    eth_dst: str
    eth_type: int = ETHERTYPE

    def field(self, name: str) -> object:
        return getattr(self, name)


def _matches(rule: RuleSpec, pkt: Packet) -> bool:
    for name, want in rule.match:
        have = pkt.field(name)
        if isinstance(want, tuple):  # (value, mask) on a MAC
            value, mask = (int(x.replace(":", ""), 16) for x in want)
            if int(str(have).replace(":", ""), 16) & mask != value & mask:
                return False
        elif have != want:
            return False
    return True


def hash_entries(group: GroupSpec) -> list[int]:
    """The bucket index of each dp_hash table entry, built the way OVS 3.1 builds it."""
    weights = [b.weight for b in group.buckets]
    total = sum(weights)
    assert total > 0, f"group {group.group_id:#x} has no live bucket"
    smallest = min(w for w in weights if w > 0)
    n_hash = max(16, 1 << math.ceil(math.log2(math.ceil(total / smallest))))
    assert n_hash <= HASH_ENTRIES, f"OVS would not use dp_hash for weights {weights}"
    divisor = [1] * len(weights)
    value = [float(w) for w in weights]
    table = []
    for _ in range(n_hash):
        i = max(range(len(weights)), key=lambda k: (value[k], -k))
        divisor[i] += 2
        value[i] = weights[i] / divisor[i]
        table.append(i)
    return table


def hash_table(group: GroupSpec) -> list[Bucket]:
    """The bucket of each dp_hash table entry."""
    return [group.buckets[i] for i in hash_entries(group)]


def frame_hash(eth_src: str, eth_dst: str) -> int:
    """The fake dp_hash of a frame: fixed per address pair, as on OVS's userspace datapath."""
    return zlib.crc32(f"{eth_src}>{eth_dst}".encode())


class FakeTable:
    """One bridge's flow tables (goto_table goes on to another), groups and meters.

    A meter passes every frame unless its id is in ``closed`` (then it drops every
    frame, as a meter over its rate does): the frame goes no further, but what the
    tables before it output stays output, as in OVS.
    """

    def __init__(
        self,
        rules: Iterable[RuleSpec],
        groups: Iterable[GroupSpec] = (),
        closed: Iterable[int] = (),
    ) -> None:
        self.rules = sorted(rules, key=lambda r: -r.priority)
        keys = [r.key for r in self.rules]
        assert len(keys) == len(set(keys)), "two rules with one (table, priority, match)"
        self.groups = {g.group_id: g for g in groups}
        self.bucket_hits: Counter = Counter()  # (group id, bucket index) -> frames
        self.closed = set(closed)
        self.meter_hits: Counter = Counter()  # meter id -> frames it let through

    def lookup(self, pkt: Packet, table: int = 0) -> RuleSpec | None:
        """The rule that handles `pkt`, None on a table miss (secure mode: drop)."""
        hits = [r for r in self.rules if r.table_id == table and _matches(r, pkt)]
        if not hits:
            return None
        top = [r for r in hits if r.priority == hits[0].priority]
        assert len(top) == 1, f"ambiguous overlapping rules for {pkt}: {top}"
        return top[0]

    def apply(self, pkt: Packet) -> list[tuple[int, Packet]]:
        """(out port, packet as sent) for every output; [] means dropped."""
        rule = self.lookup(pkt)
        return self._actions(rule.actions if rule else (), pkt)

    def _actions(self, actions, pkt: Packet) -> list[tuple[int, Packet]]:
        out = []
        for name, arg in actions:
            if name == "meter":
                if arg in self.closed:
                    return out
                self.meter_hits[arg] += 1
            elif name == "goto_table":
                rule = self.lookup(pkt, arg)
                out.extend(self._actions(rule.actions if rule else (), pkt))
            elif name == "output":
                out.append((arg, pkt))
            elif name == "set_eth_dst":
                pkt = replace(pkt, eth_dst=arg)
            elif name == "group":
                assert arg in self.groups, f"rule points at missing group {arg:#x}"
                bucket = self.select(self.groups[arg], pkt)
                out.extend(self._actions(bucket.actions, pkt))
            else:
                raise NotImplementedError(f"fake table cannot apply {name!r}")
        return out

    def select(self, group: GroupSpec, pkt: Packet) -> Bucket:
        """The bucket a select group gives this packet (counted in ``bucket_hits``)."""
        table = hash_entries(group)
        index = table[frame_hash(pkt.eth_src, pkt.eth_dst) % len(table)]
        self.bucket_hits[(group.group_id, index)] += 1
        return group.buckets[index]


@dataclass
class Trace:
    """Where the copies of one frame went."""

    delivered: Counter = field(default_factory=Counter)  # (host, port) -> copies
    links: Counter = field(default_factory=Counter)  # (from host, to host) -> copies
    controller: Counter = field(default_factory=Counter)  # host -> copies sent to controller
    drops: list = field(default_factory=list)  # (host, rule or None) where a copy died

    def ports(self) -> set[tuple[str, int]]:
        return set(self.delivered)


class FakeFabric:
    """Every bridge of a cluster, wired by its fabric links."""

    def __init__(
        self,
        cluster: Cluster,
        rules: dict[str, Iterable[RuleSpec]],
        groups: dict[str, Iterable[GroupSpec]] | None = None,
        closed: dict[str, Iterable[int]] | None = None,
    ) -> None:
        groups, closed = groups or {}, closed or {}
        self.tables = {
            h: FakeTable(rules.get(h, ()), groups.get(h, ()), closed.get(h, ()))
            for h in cluster.hosts
        }
        self.peer: dict[tuple[str, int], tuple[str, int]] = {}
        for link in cluster.links:
            self.peer[(link.a, link.a_port)] = (link.b, link.b_port)
            self.peer[(link.b, link.b_port)] = (link.a, link.a_port)

    def send(self, host: str, pkt: Packet) -> Trace:
        """Inject `pkt` on `host` (arriving on pkt.in_port) and follow every copy."""
        trace = Trace()
        queue = [(host, pkt, 0)]
        while queue:
            here, p, hops = queue.pop()
            assert hops < MAX_HOPS, f"forwarding loop: {p} at {here}"
            outs = self.tables[here].apply(p)
            if not outs:
                trace.drops.append((here, self.tables[here].lookup(p)))
            for port, sent in outs:
                if port == OFPP_CONTROLLER:
                    trace.controller[here] += 1
                elif (here, port) in self.peer:
                    there, in_port = self.peer[(here, port)]
                    trace.links[(here, there)] += 1
                    queue.append((there, replace(sent, in_port=in_port), hops + 1))
                else:
                    trace.delivered[(here, port)] += 1
        return trace


# ----------------------------------------------------------------------------- clusters


def cluster_of(names: list[str], edges: Iterable[tuple[str, str]]) -> Cluster:
    """Hosts with dpids 1..n and links numbered per host from port 1, in edge order."""
    hosts = {n: HostInfo(n, f"br-{n}", i + 1) for i, n in enumerate(names)}
    next_port = dict.fromkeys(names, 1)
    links = []
    for a, b in edges:
        links.append(FabricLink(a, next_port[a], b, next_port[b]))
        next_port[a] += 1
        next_port[b] += 1
    return Cluster(hosts, links)


def line_cluster(n: int) -> Cluster:
    names = [f"h{i + 1}" for i in range(n)]
    return cluster_of(names, zip(names, names[1:], strict=False))


def mesh_cluster(n: int) -> Cluster:
    names = [f"h{i + 1}" for i in range(n)]
    return cluster_of(names, [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]])
