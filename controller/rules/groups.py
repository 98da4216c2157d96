"""Load-balancer select groups and the rules that feed them, as data (docs/design.md §6).

A stream with the ``sdn`` grouping, once the load-balancer app balances it,
sends every batch to a random *slot* address of the receiving node
(``typhoon.wire.lb_mac``: 256 slots, so the datapath's flow cache stays warm).
On each bridge that holds a sender, one rule per sender matches the node's
slot addresses with a mask and hands the frame to the node's OpenFlow select
group there; each bucket rewrites ``eth_dst`` to one worker's address and
outputs it toward that worker (its port, or the fabric port on the path to its
host, where the ordinary unicast rules of the pair carry it on).  So past the
group a balanced frame is an ordinary unicast frame.

    100  LB_GROUP  in_port=Pu, eth_src=u, eth_dst=<node LB prefix>/ff:ff:ff:ff:ff:00,
                   eth_type -> group:<app, node>

Buckets.  OVS picks a bucket by a hash of the frame (``dp_hash``; on the
userspace datapath a hash of the frame's addresses, so it is fixed per slot
address: measured, every frame of one slot counted in the same bucket) looked
up in a table of at most 64 entries that it divides among the buckets by
weight (Webster's method, ties to the first bucket); it sizes the table as
``max(16, pow2(ceil(total / min weight)))``.  So a group of 64 buckets of
weight 1 has a 64-entry table with entry ``i`` in bucket ``i``: each bucket is
one hash entry.  A worker's share is apportioned in 64ths and the worker gets
that many buckets, in one run of consecutive positions of an *entry order*
(workers in id order).  Which slots hash to which entry is fixed (each entry
holds 0 to ~10 of the 256 slots), so runs over the entries in plain order
(0..63) get a split a few points off the configured one (3.4 points on
average over random splits).  The order is the one ``controller.rules.dp_hash``
computes from OVS's hash of the senders' slot addresses on that host: every
prefix of it holds about its share of the slots, so the runs get within about
a point (0.8 on average).  A change of shares moves only the entries at the
boundaries of the runs: the other slots stay with their worker, what skew is
left is not re-drawn, and the balancer can trim it away
(``controller.load_balancing.balancer``).  With
weighted buckets (27:27:9) a change of weights re-interleaves the whole table
and re-draws the skew (measured on OVS 3.1 with the 256 slots of one sender:
weights 3:3:1 give a 16-entry table and 39/49/11 %; 27+1:27:9 give 43/41/16 %).

Group ids, like cookies, say whose a group is: ``0x54`` ('T') in the top byte,
then the application id and the node index, so a stateless controller can
tell its groups from others' when it reconciles a switch.

Pure Python: tested with a fake switch (tests/unit/fakeflows.py), no Ryu.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller.rules.cookies import RuleKind, make_cookie
from controller.rules.dp_hash import slot_order
from controller.rules.flows import PRIO_DATA, Action, RuleSpec, match, output
from typhoon.cluster import Cluster
from typhoon.topology.fabric import fabric_graph, next_hop_port
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment
from typhoon.topology.routing import node_index
from typhoon.wire import ETHERTYPE, lb_mac, mac_bytes, mac_str, parse_mac, worker_mac

GROUP_MAGIC = 0x54
HASH_ENTRIES = 64  # OVS's dp_hash table for a select group without a selection method
LB_MASK = "ff:ff:ff:ff:ff:00"  # node prefix of a slot address: any slot matches


def lb_group_id(app_id: int, node: int) -> int:
    """Id of the select group of receiving node ``node`` (its index) of ``app_id``."""
    if not 0 <= app_id <= 0xFFFF or not 0 <= node <= 0xFF:
        raise ValueError(f"app id {app_id} or node index {node} out of range")
    return GROUP_MAGIC << 24 | app_id << 8 | node


def parse_group_id(group_id: int) -> tuple[int, int] | None:
    """(app id, node index) of a Typhoon group id; None for anyone else's."""
    if group_id >> 24 != GROUP_MAGIC:
        return None
    return (group_id >> 8) & 0xFFFF, group_id & 0xFF


def is_typhoon_group(group_id: int) -> bool:
    return parse_group_id(group_id) is not None


@dataclass(frozen=True)
class Bucket:
    """One bucket of a select group: its weight and its actions (flows.py vocabulary)."""

    weight: int
    actions: tuple[Action, ...]

    def worker_mac(self) -> str | None:
        """The worker this bucket rewrites frames to (None if it does not)."""
        macs = (arg for name, arg in self.actions if name == "set_eth_dst")
        return next((mac for mac in macs if isinstance(mac, str)), None)


@dataclass(frozen=True)
class GroupSpec:
    """One OpenFlow group as data: hashable, comparable, independent of any switch.

    Bucket order matters (OVS numbers buckets by position and reports counters
    that way), so buckets are a tuple, sorted by the compiler.
    """

    group_id: int
    buckets: tuple[Bucket, ...]
    type: str = "select"

    def packets_per_worker(self, bucket_packets: Iterable[int]) -> dict[int, int]:
        """Worker id -> packets, from the switch's per-bucket counters (in bucket order)."""
        counts: dict[int, int] = {}
        for bucket, n in zip(self.buckets, bucket_packets, strict=True):
            mac = bucket.worker_mac()
            if mac is not None:
                wid = parse_mac(mac_bytes(mac)).value
                counts[wid] = counts.get(wid, 0) + n
        return counts

    def weights(self) -> dict[str, int]:
        """Worker address -> total weight of its buckets."""
        out: dict[str, int] = {}
        for b in self.buckets:
            mac = b.worker_mac()
            if mac is not None:
                out[mac] = out.get(mac, 0) + b.weight
        return out


@dataclass(frozen=True)
class GroupPlan:
    """Group mods to send; adds and modifies go before flow mods, deletes after."""

    add: tuple[GroupSpec, ...] = ()
    modify: tuple[GroupSpec, ...] = ()
    delete: tuple[GroupSpec, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.add or self.modify or self.delete)


def diff_groups(desired: Iterable[GroupSpec], installed: Iterable[GroupSpec]) -> GroupPlan:
    """What to add, modify and delete so a switch holds exactly ``desired`` of our groups.

    Groups that are already right are not touched (their counters survive);
    groups that are not ours are left alone.
    """
    want = {g.group_id: g for g in desired}
    have = {g.group_id: g for g in installed}
    add = [g for gid, g in want.items() if gid not in have]
    modify = [g for gid, g in want.items() if gid in have and have[gid] != g]
    delete = [g for gid, g in have.items() if gid not in want and is_typhoon_group(gid)]

    def key(g: GroupSpec) -> int:
        return g.group_id

    return GroupPlan(
        tuple(sorted(add, key=key)), tuple(sorted(modify, key=key)), tuple(sorted(delete, key=key))
    )


# ----------------------------------------------------------------------------- weights


def apportion(shares: Mapping[int, float], total: int) -> dict[int, int]:
    """Integer weights summing to ``total``, proportional to ``shares``, each at least 1.

    Largest remainder; a worker rounded down to 0 gets 1, taken from the largest.
    Ties go to the smaller key, so the result is deterministic.
    """
    if not shares:
        return {}
    if total < len(shares):
        raise ValueError(f"cannot give {len(shares)} workers at least 1 of {total}")
    keys = sorted(shares)
    clean = {k: max(0.0, float(shares[k])) for k in keys}
    s = sum(clean.values())
    if s <= 0:
        clean = dict.fromkeys(keys, 1.0)
        s = float(len(keys))
    exact = {k: total * clean[k] / s for k in keys}
    out = {k: int(exact[k]) for k in keys}
    left = total - sum(out.values())
    for k in sorted(keys, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    for k in keys:
        if out[k] == 0:
            big = max(keys, key=lambda j: (out[j], -j))
            out[big] -= 1
            out[k] = 1
    return out


def bucket_weights(
    shares: Mapping[int, float], order: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """(worker id, weight) per bucket, in bucket order (module docstring: one hash entry each).

    64 buckets of weight 1, each worker its 64ths in one run of consecutive
    positions of ``order`` (the entries in the order to fill them; default 0..63),
    workers in id order.  With more workers than fit in 64ths, plain weights (out of 1000).
    """
    if len(shares) > HASH_ENTRIES // 2:
        return sorted(apportion(shares, 1000).items())
    weights = apportion(shares, HASH_ENTRIES)
    runs = [k for k in sorted(weights) for _ in range(weights[k])]
    if order is None:
        return [(k, 1) for k in runs]
    if sorted(order) != list(range(HASH_ENTRIES)):
        raise ValueError(f"entry order {list(order)} is not an order of the {HASH_ENTRIES} entries")
    owner = [0] * HASH_ENTRIES
    for position, entry in enumerate(order):
        owner[entry] = runs[position]
    return [(k, 1) for k in owner]


# ----------------------------------------------------------------------------- compile


@dataclass(frozen=True)
class Balanced:
    """One balanced stream: who sends, which node receives, at which address."""

    stream: int
    node: str
    node_index: int
    senders: tuple[WorkerAssignment, ...]
    receivers: tuple[WorkerAssignment, ...]


def balanced_streams(topology: Topology, physical: PhysicalTopology) -> list[Balanced]:
    """The ``sdn`` streams of an application with their current (active) workers."""
    out = []
    for s in topology.streams:
        if s.grouping.type != "sdn":
            continue
        out.append(
            Balanced(
                s.id,
                s.dst,
                node_index(topology, s.dst),
                tuple(physical.active_of_node(s.src)),
                tuple(physical.active_of_node(s.dst)),
            )
        )
    return out


def compile_lb(
    topology: Topology,
    physical: PhysicalTopology,
    cluster: Cluster,
    weights: Mapping[int, float] | None = None,
    down: Iterable[int] = (),
    ethertype: int = ETHERTYPE,
) -> tuple[dict[str, frozenset[GroupSpec]], dict[str, frozenset[RuleSpec]]]:
    """Select groups and LB rules of one application, per host: (groups, rules).

    ``weights``: relative weight per receiving worker id (any scale; a worker
    without one gets the mean of the node's others, or 1).  Workers in ``down``
    are left out of the groups, unless that would leave a node with none.
    The frames' onward path beyond the group is the ordinary unicast rules of
    ``compile_rules`` (``sdn`` is a unicast grouping there), so they are not
    repeated here.
    """
    app = physical.app_id
    graph = fabric_graph(cluster)
    down = set(down)
    weights = dict(weights or {})
    groups: dict[str, dict[int, GroupSpec]] = {}
    rules: dict[str, set[RuleSpec]] = {}
    for b in balanced_streams(topology, physical):
        members = [w for w in b.receivers if w.worker_id not in down] or list(b.receivers)
        if not members or not b.senders:
            continue
        known = [weights[w.worker_id] for w in members if w.worker_id in weights]
        default = sum(known) / len(known) if known else 1.0
        shares = {w.worker_id: weights.get(w.worker_id, default) for w in members}
        by_id = {w.worker_id: w for w in members}
        gid = lb_group_id(app, b.node_index)
        prefix = mac_str(lb_mac(app, b.node_index, 0))
        for host in sorted({u.host for u in b.senders}):
            here = [u.worker_id for u in b.senders if u.host == host]
            order = slot_order(app, b.node_index, here, HASH_ENTRIES, ethertype)
            buckets = []
            for wid, weight in bucket_weights(shares, order):
                w = by_id[wid]
                port = w.port if w.host == host else next_hop_port(graph, host, w.host)
                mac = mac_str(worker_mac(app, wid))
                buckets.append(Bucket(weight, (("set_eth_dst", mac), output(port))))
            groups.setdefault(host, {})[gid] = GroupSpec(gid, tuple(buckets))
        for u in b.senders:
            cookie = make_cookie(app, RuleKind.LB_GROUP, u.worker_id, b.node_index)
            rule_match = match(
                in_port=u.port,
                eth_src=mac_str(worker_mac(app, u.worker_id)),
                eth_dst=(prefix, LB_MASK),
                eth_type=ethertype,
            )
            rules.setdefault(u.host, set()).add(
                RuleSpec(PRIO_DATA, rule_match, (("group", gid),), cookie)
            )
    return (
        {h: frozenset(g.values()) for h, g in sorted(groups.items())},
        {h: frozenset(r) for h, r in sorted(rules.items())},
    )


def compile_lb_all(
    apps: Mapping[str, tuple[Topology, PhysicalTopology]],
    cluster: Cluster,
    weights: Mapping[str, Mapping[int, float]],
    down: Mapping[str, Iterable[int]],
    on_error: Callable[[str, ValueError], None],
) -> tuple[dict[str, frozenset[GroupSpec]], dict[str, frozenset[RuleSpec]]]:
    """``compile_lb`` of every application with a balanced stream, merged per host.

    An application whose groups cannot be compiled is reported to ``on_error``
    and left out; the others still get theirs."""
    groups: dict[str, frozenset[GroupSpec]] = {}
    rules: dict[str, frozenset[RuleSpec]] = {}
    for name, (topology, physical) in apps.items():
        if not balanced_streams(topology, physical):
            continue
        try:
            g, r = compile_lb(
                topology, physical, cluster, weights.get(name, {}), down.get(name, ())
            )
        except ValueError as e:
            on_error(name, e)
            continue
        for host, gs in g.items():
            groups[host] = groups.get(host, frozenset()) | gs
        for host, rs in r.items():
            rules[host] = rules.get(host, frozenset()) | rs
    return groups, rules
