"""Hash skew of the switch's select group and the balancer's trim, simulated end to end.

Pure logic: the real ``NodeBalancer`` (controller.load_balancing.balancer), the real
bucket layout (controller.rules.groups.bucket_weights) in OVS's hash table
(fakeflows.hash_entries, a hash fixed per address pair as on the userspace
datapath), the real sender's slot order (typhoon.runtime.policies.Router.lb_slot),
and a fluid model of the node between them: one sender, one group window of
``WINDOW`` frames, three workers serving 3:3:1 (the integration test's scenario,
tests/integration/test_load_balancer.py).  A worker processes its queue at its
own rate and returns credit for each frame it finishes; the sender sends
whenever the window has room.  A worker's ``queue`` metric is its backlog (what
it took and has not processed: typhoon/runtime/control.py), or 0 as it was
before (``sees_backlog=False``: it counted only what was left unread at its
last take, and it takes everything at once).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
from fakeflows import frame_hash, hash_entries

from controller.load_balancing.balancer import LbSettings, NodeBalancer
from controller.rules.groups import Bucket, GroupSpec, bucket_weights
from typhoon.runtime.policies import Router
from typhoon.topology.routing import Route
from typhoon.wire import lb_mac, mac_str, worker_mac

APP, NODE = 1, 1
SENDER = 1
RATES = {2: 3333.0, 3: 3333.0, 4: 1111.0}  # tuples/s: 300 us, 300 us, 900 us per tuple
CAPACITY = {w: r / sum(RATES.values()) for w, r in RATES.items()}
TUPLES = 256  # per frame
WINDOW = 27  # frames: the group window of the integration test's frames
DT = 0.01
SETTINGS = {"interval_s": 2.0, "settle_s": 1.0, "min_frames": 300, "min_tuples": 100}


def group_of(shares: dict[int, float]) -> GroupSpec:
    return GroupSpec(
        1, tuple(Bucket(w, (("set_eth_dst", mac_str(worker_mac(APP, wid))),)) for wid, w in
                 bucket_weights(shares))
    )  # fmt: skip


def slot_worker(group: GroupSpec) -> list[int]:
    """The worker each of the 256 slot addresses of the sender goes to."""
    table = hash_entries(group)
    src = mac_str(worker_mac(APP, SENDER))
    out = []
    for slot in range(256):
        bucket = group.buckets[table[frame_hash(src, mac_str(lb_mac(APP, NODE, slot))) % 64]]
        mac = bucket.worker_mac()
        out.append(next(w for w in RATES if mac_str(worker_mac(APP, w)) == mac))
    return out


@dataclass
class Node:
    """The sender, the switch's group and the three workers (module docstring)."""

    balancer: NodeBalancer
    sees_backlog: bool = True
    router: Router = field(default_factory=lambda: Router(Route(1, "sdn", [2, 3, 4])))
    queues: dict[int, deque] = field(default_factory=lambda: {w: deque() for w in RATES})
    done: dict[int, float] = field(default_factory=lambda: dict.fromkeys(RATES, 0.0))
    frames: dict[int, int] = field(default_factory=lambda: dict.fromkeys(RATES, 0))
    inflight: int = 0
    route: list[int] = field(default_factory=list)
    log: list[tuple[float, dict[int, float]]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # of the installs

    def install(self, shares: dict[int, float]) -> None:
        self.route = slot_worker(group_of(shares))

    def step(self) -> None:
        while self.inflight < WINDOW:
            w = self.route[self.router.lb_slot()]
            self.queues[w].append(float(TUPLES))
            self.frames[w] += 1
            self.inflight += 1
        for w, q in self.queues.items():
            work = RATES[w] * DT
            while q and work > 0:
                took = min(work, q[0])
                q[0] -= took
                work -= took
                self.done[w] += took
                if q[0] <= 1e-9:
                    q.popleft()
                    self.inflight -= 1

    def run(self, seconds: float) -> None:
        nb = self.balancer
        t = 0.0
        self.install(nb.decide(t).install or {})
        for i in range(1, int(seconds / DT) + 1):
            self.step()
            t = i * DT
            if i % 50 == 0:  # metrics every 0.5 s, bucket counters too
                for w in RATES:
                    queue = int(sum(self.queues[w])) if self.sees_backlog else 0
                    metrics = {"in": {"1": int(self.done[w])}, "proc_us": 1e6 / RATES[w]}
                    nb.on_metrics(w, {**metrics, "queue": queue}, t)
                nb.on_buckets(dict(self.frames), t)
                self.log.append((t, dict(self.done)))
            if i % 200 == 0:
                d = nb.decide(t)
                if d.install is not None:
                    self.reasons.append(d.reason)
                    self.install(d.install)

    def windows(self, start: float, seconds: float = 5.0) -> list[dict[int, float]]:
        """Share of the tuples each worker processed, per window ending at ``start`` or later."""
        out = []
        for i, (t, done) in enumerate(self.log):
            if t < start:
                continue
            first = next(d for s, d in self.log[: i + 1] if t - s <= seconds)
            n = {w: done[w] - first[w] for w in RATES}
            out.append({w: v / sum(n.values()) for w, v in n.items()})
        return out


def points(a: dict[int, float], b: dict[int, float]) -> float:
    return max(abs(a[k] - b[k]) * 100 for k in a)


def slots_split(shares: dict[int, float]) -> dict[int, float]:
    """The split the sender's 256 slots get from a group of these shares."""
    route = slot_worker(group_of(shares))
    return {w: route.count(w) / 256 for w in RATES}


def test_the_scenario_is_skewed():
    # the capacity split in 64ths lands more than 3 points off: the case the trim is for
    assert points(slots_split(CAPACITY), CAPACITY) > 3.0


def test_blind_to_backlogs_and_without_trim_the_node_runs_at_the_hash_split():
    """As it was: the over-fed worker's queue holds the window, the node follows the slots."""
    node = Node(NodeBalancer("app", "work", LbSettings(**SETTINGS, trim=False)), False)
    node.balancer.set_members(RATES)
    node.run(50.0)
    late = node.windows(30.0)
    # the over-fed worker's queue holds the window: the node follows the slots' split
    assert all(points(sh, CAPACITY) > 3.0 for sh in late), late
    hashed = slots_split(node.balancer.installed)
    mean = {w: sum(sh[w] for sh in late) / len(late) for w in RATES}
    assert points(mean, hashed) < 1.5, (mean, hashed)
    assert node.balancer.trims == 0


def test_blind_to_backlogs_trim_brings_the_split_to_capacity_and_the_node_follows():
    """The trim alone (no queue term): slowly, the backlog built before it drains late."""
    node = Node(NodeBalancer("app", "work", LbSettings(**SETTINGS)), False)
    node.balancer.set_members(RATES)
    node.run(60.0)
    assert 1 <= node.balancer.trims
    # what the switch gives each worker is now its capacity share, within an entry
    assert points(slots_split(node.balancer.installed), CAPACITY) <= 1.5
    late = node.windows(45.0)
    assert all(points(sh, CAPACITY) <= 2.0 for sh in late), late


def test_with_backlogs_seen_every_worker_keeps_its_capacity_share():
    """The queue term sees the over-fed worker's backlog and shifts frames away from it
    until the queues even out: every worker always has work, whatever the hash gives."""
    node = Node(NodeBalancer("app", "work", LbSettings(**SETTINGS)))
    node.balancer.set_members(RATES)
    node.run(50.0)
    windows = node.windows(10.0)
    assert all(points(sh, CAPACITY) <= 1.5 for sh in windows), windows
    assert any("queue" in d for d in node.reasons)


def test_a_trim_moves_only_the_entries_at_the_edges_of_the_runs():
    before = hash_entries(group_of(CAPACITY))
    g1 = group_of(CAPACITY)
    moved = {2: CAPACITY[2] - 2 / 64, 3: CAPACITY[3] + 2 / 64, 4: CAPACITY[4]}
    g2 = group_of(moved)
    owner1 = [g1.buckets[i].worker_mac() for i in before]
    owner2 = [g2.buckets[i].worker_mac() for i in hash_entries(g2)]
    assert sum(a != b for a, b in zip(owner1, owner2, strict=True)) == 2


@pytest.mark.parametrize("start", [0, 100, 255])
def test_the_sender_takes_every_slot_once_per_256_batches(start):
    r = Router(Route(1, "sdn", [2, 3, 4]))
    r.lb_next = start
    slots = [r.lb_slot() for _ in range(512)]
    assert sorted(slots[:256]) == list(range(256)) == sorted(slots[256:])
