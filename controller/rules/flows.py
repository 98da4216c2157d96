"""The flow rules every host bridge should hold for an application (paper Table 3).

`compile_rules` is a pure function from (logical topology, physical topology,
cluster) to rule specs per host; `controller.rules.reconcile` diffs them against what
a switch holds and `controller.ofp` translates them to OpenFlow 1.3. Nothing
here knows Ryu, so the rules are tested by forwarding packets through a fake
table (tests/unit/fakeflows.py), not by reading flow text.

Table 0 of each bridge, by priority:

    200  TO_CONTROLLER  in_port=Pw, eth_src=w, eth_dst=controller, eth_type -> CONTROLLER
    100  data/credit    in_port, eth_src, eth_dst, eth_type -> worker port / fabric port(s)
     10  SPOOF_DROP     in_port=Pw -> drop (counts frames no rule above accepts)
      0  DEFAULT_DROP   everything else -> drop (fabric ports, unknown ports)

Every rule above 10 matches in_port together with eth_src, so a frame is
forwarded only if its source address belongs to the worker on its port (or,
on a fabric port, to the worker the path was computed for): spoofed frames and
frames claiming the controller's address fall through to SPOOF_DROP.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from controller.rules.cookies import RuleKind, make_cookie
from typhoon.cluster import Cluster
from typhoon.topology.chaining import by_call
from typhoon.topology.fabric import FabricGraph, fabric_graph, multicast_tree, shortest_paths
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment
from typhoon.topology.routing import stream_pairs
from typhoon.wire import ETHERTYPE, controller_mac, mac_str, multicast_mac, worker_mac

OFPP_CONTROLLER = 0xFFFFFFFD  # OpenFlow 1.3 reserved port; no Ryu import here

PRIO_DEFAULT_DROP = 0
PRIO_SPOOF_DROP = 10
PRIO_DATA = 100
PRIO_CONTROLLER = 200

MATCH_FIELDS = ("in_port", "eth_src", "eth_dst", "eth_type")
# "unknown" only comes back from a switch (controller.ofp) and is never installed;
# "meter" and "goto_table" are OpenFlow instructions, kept in the action list so a rule stays
# one tuple: a meter first (it applies before the actions), a goto_table last
ACTIONS = ("output", "group", "set_eth_dst", "meter", "goto_table", "unknown")
UNICAST_GROUPINGS = (
    "shuffle", "fields", "global", "direct", "local_or_shuffle", "sdn", "forward",
)  # fmt: skip
MULTICAST_GROUPINGS = ("all",)

_FULL_MAC_MASK = (1 << 48) - 1

Match = tuple[tuple[str, object], ...]
Action = tuple[str, object]


@dataclass(frozen=True)
class RuleSpec:
    """One flow entry as data: hashable, comparable, independent of any switch.

    `match` holds (field, value) pairs sorted by field; MACs are lowercase
    "02:..." strings, a masked field is a (value, mask) tuple. An empty
    `actions` means drop.
    """

    priority: int
    match: Match
    actions: tuple[Action, ...]
    cookie: int
    table_id: int = 0

    def __post_init__(self) -> None:
        fields = [name for name, _ in self.match]
        if len(set(fields)) != len(fields) or not set(fields) <= set(MATCH_FIELDS):
            raise ValueError(f"bad match fields {fields}")
        for action in self.actions:
            if not action or action[0] not in ACTIONS:
                raise ValueError(f"unknown action {action!r}")
        canonical = tuple(sorted((name, _canonical(value)) for name, value in self.match))
        object.__setattr__(self, "match", canonical)
        actions = tuple((a[0], _canonical(a[1])) if len(a) == 2 else a for a in self.actions)
        meters = tuple(a for a in actions if a[0] == "meter")
        gotos = tuple(a for a in actions if a[0] == "goto_table")
        if len(meters) > 1 or len(gotos) > 1:
            raise ValueError(f"at most one meter and one goto_table, not {actions}")
        goto = gotos[0][1] if gotos else None
        if gotos and not (isinstance(goto, int) and goto > self.table_id):
            raise ValueError(f"goto_table must go forward from table {self.table_id}")
        rest = tuple(a for a in actions if a[0] not in ("meter", "goto_table"))
        object.__setattr__(self, "actions", meters + rest + gotos)

    @property
    def key(self) -> tuple[int, int, Match]:
        """What identifies a flow entry on a switch (OpenFlow "strict" identity)."""
        return self.table_id, self.priority, self.match

    def match_dict(self) -> dict[str, object]:
        return dict(self.match)


def _canonical(value: object) -> object:
    """The form a switch reports: lowercase MACs, masked bits cleared, full masks dropped."""
    if isinstance(value, str):
        return value.lower()
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value):
        bits, mask = (int(v.replace(":", ""), 16) for v in value)
        if mask == _FULL_MAC_MASK:
            return _mac_of(bits)
        return _mac_of(bits & mask), _mac_of(mask)
    return value


def _mac_of(n: int) -> str:
    return n.to_bytes(6, "big").hex(":")


def match(**fields: object) -> Match:
    """A canonical match from keyword fields, e.g. match(in_port=1, eth_type=0x88B5)."""
    return tuple(sorted(fields.items()))


def output(port: int) -> Action:
    return ("output", port)


def meter(meter_id: int) -> Action:
    """The meter instruction: frames over its rate are dropped here (and go no further)."""
    return ("meter", meter_id)


def goto_table(table_id: int) -> Action:
    return ("goto_table", table_id)


def compile_default_rules() -> frozenset[RuleSpec]:
    """The priority-0 drop rule, installed once per bridge, owned by no application."""
    return frozenset({RuleSpec(PRIO_DEFAULT_DROP, (), (), make_cookie(0, RuleKind.DEFAULT_DROP))})


class _Rules:
    """Per-host rule sets being built: merges duplicates, refuses contradictions."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self.by_host: dict[str, dict[tuple[Any, ...], RuleSpec]] = {h: {} for h in hosts}

    def add(self, host: str, rule: RuleSpec) -> None:
        old = self.by_host[host].setdefault(rule.key, rule)
        if old.actions != rule.actions:
            raise ValueError(f"conflicting rules on {host}: {old} vs {rule}")
        if rule.cookie < old.cookie:  # same frame for two reasons: keep one, deterministically
            self.by_host[host][rule.key] = rule

    def frozen(self) -> dict[str, frozenset[RuleSpec]]:
        return {h: frozenset(rules.values()) for h, rules in sorted(self.by_host.items())}


class _Compiler:
    """Holds what every rule needs (app, addresses, fabric) while rules are emitted."""

    def __init__(self, physical: PhysicalTopology, cluster: Cluster, ethertype: int) -> None:
        self.app = physical.app_id
        self.ethertype = ethertype
        self.graph: FabricGraph = fabric_graph(cluster)
        self.paths = {h: shortest_paths(self.graph, h) for h in sorted(cluster.hosts)}
        self.rules = _Rules(cluster.hosts)
        self._check_ports(physical, cluster)

    def _check_ports(self, physical: PhysicalTopology, cluster: Cluster) -> None:
        fabric = {(h, p) for _, _, ports in self.graph.links() for h, p in ports.items()}
        seen: set[tuple[str, int]] = set()
        for w in physical.workers:
            if w.host not in cluster.hosts:
                raise ValueError(f"worker {w.worker_id} is on unknown host {w.host!r}")
            end = (w.host, w.port)
            if end in fabric or end in seen:
                raise ValueError(f"worker {w.worker_id}: port {w.port} of {w.host} is taken")
            seen.add(end)

    def mac(self, w: WorkerAssignment) -> str:
        return mac_str(worker_mac(self.app, w.worker_id))

    def frame_match(self, in_port: int, src: WorkerAssignment, eth_dst: str) -> Match:
        return match(
            in_port=in_port, eth_src=self.mac(src), eth_dst=eth_dst, eth_type=self.ethertype
        )

    def worker_port(self, w: WorkerAssignment) -> None:
        """Anti-spoofing drop and the worker -> controller rule of one worker port."""
        to_ctl = make_cookie(self.app, RuleKind.TO_CONTROLLER, w.worker_id)
        ctl_match = self.frame_match(w.port, w, mac_str(controller_mac(self.app)))
        self.rules.add(
            w.host, RuleSpec(PRIO_CONTROLLER, ctl_match, (output(OFPP_CONTROLLER),), to_ctl)
        )
        spoof = make_cookie(self.app, RuleKind.SPOOF_DROP, w.worker_id)
        self.rules.add(w.host, RuleSpec(PRIO_SPOOF_DROP, match(in_port=w.port), (), spoof))

    def unicast(self, src: WorkerAssignment, dst: WorkerAssignment, credit: bool) -> None:
        """Rules on every bridge along the path of frames from `src` to `dst`."""
        hops = self.paths[src.host].get(dst.host)
        if hops is None:
            raise ValueError(f"no fabric path from {src.host!r} to {dst.host!r}")

        def add(host: str, kind: RuleKind, in_port: int, out_port: int) -> None:
            cookie = make_cookie(self.app, kind, src.worker_id, dst.worker_id, credit=credit)
            rule_match = self.frame_match(in_port, src, self.mac(dst))
            self.rules.add(host, RuleSpec(PRIO_DATA, rule_match, (output(out_port),), cookie))

        if len(hops) == 1:
            add(src.host, RuleKind.LOCAL, src.port, dst.port)
            return
        # port[i][h]: host h's port on the link between hops[i] and hops[i + 1]
        port = [self.graph.ports(a, b) for a, b in zip(hops, hops[1:], strict=False)]
        add(src.host, RuleKind.REMOTE_SEND, src.port, port[0][src.host])
        for i in range(1, len(hops) - 1):
            here = hops[i]
            add(here, RuleKind.TRANSIT, port[i - 1][here], port[i][here])
        add(dst.host, RuleKind.REMOTE_RECV, port[-1][dst.host], dst.port)

    def multicast(
        self, stream_id: int, src: WorkerAssignment, dsts: list[WorkerAssignment]
    ) -> None:
        """One-to-many: local receivers plus one copy per tree child, on every tree host."""
        group = mac_str(multicast_mac(self.app, stream_id))
        cookie = make_cookie(self.app, RuleKind.MULTICAST, src.worker_id, stream_id)
        tree = multicast_tree(self.graph, src.host, (d.host for d in dsts))
        for host, hop in tree.items():
            local = sorted(d.port for d in dsts if d.host == host)
            outs = tuple(output(p) for p in local + [port for _, port in hop.children])
            in_port = src.port if hop.in_port is None else hop.in_port
            self.rules.add(
                host, RuleSpec(PRIO_DATA, self.frame_match(in_port, src, group), outs, cookie)
            )


def compile_rules(
    topology: Topology,
    physical: PhysicalTopology,
    cluster: Cluster,
    ethertype: int = ETHERTYPE,
) -> dict[str, frozenset[RuleSpec]]:
    """Every rule of one application on every host bridge of `cluster` (hosts without
    rules map to an empty set, so reconciling them removes what is left there).

    The default drop rule is not included: see `compile_default_rules`.
    """
    c = _Compiler(physical, cluster, ethertype)
    for w in physical.workers:
        c.worker_port(w)
    # a chain's inner edges are function calls in one process: no frame, no rule (unless
    # unchained live: physical.unchained)
    head = by_call(topology, physical)
    for stream in topology.streams:
        kind = stream.grouping.type
        if kind not in UNICAST_GROUPINGS + MULTICAST_GROUPINGS:
            raise ValueError(f"stream {stream.id}: unknown grouping {kind!r}")
        if kind in MULTICAST_GROUPINGS:
            for u in physical.of_node(stream.src):
                c.multicast(stream.id, u, physical.of_node(stream.dst))
        for u, v in stream_pairs(physical, stream):
            if v.worker_id in head and head[v.worker_id] == head.get(u.worker_id, u.worker_id):
                continue
            # a one-to-many link still needs unicast both ways: a receiver's base SYNC,
            # and the end of stream, which follows the frames once they are confirmed
            c.unicast(u, v, credit=kind in MULTICAST_GROUPINGS)
            c.unicast(v, u, credit=True)  # grants and NACKs, whatever the grouping
    return c.rules.frozen()
