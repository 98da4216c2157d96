"""Model check of partial rollback with upstream backup (``typhoon/checkpoint/partial.py``,
``typhoon/runtime/upstream_backup.py``) on the real framework layers of
``test_guarantee_model.py``'s model network.

Two jobs, each one failover region: a chain ``src -> mid -> count`` and a fan-in
``src_a, src_b -> mid -> count``.  A kill of a ``mid`` or ``count`` worker rolls
back only it and its downstream closure (a ``mid`` worker takes every ``count``
worker with it: fields grouping); the senders of that set replay their output
buffers after the restored epoch's anchor, as the controller would tell them
(ROLLBACK with ``replay``), and never restore.  Whatever the kill points and the
interleaving, the counts are exact under ``exactly_once``; a worker that no
kill's rollback set held never restores, and a source outside every set never
seeks back.  A kill whose set holds a source, or whose senders' buffers do not
reach back far enough, falls back to region rollback, and stays exact.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_guarantee_model import (
    REFERENCE,
    MemoryStore,
    Net,
    Numbers,
    actions,
    model_operators,  # noqa: F401 - the module's fixture registers the model operators
    play,
)

from controller.recovery.fault_detector import without
from typhoon.checkpoint.partial import PARTIAL, downstream_closure, partial_rollback
from typhoon.checkpoint.progress import recovery_point
from typhoon.checkpoint.regions import roll_back, worker_edges
from typhoon.runtime import upstream_backup
from typhoon.topology import load_topology_text, schedule
from typhoon.topology.routing import routes_for
from typhoon.wire import Control, ControlTuple

CONFIG = (
    "config: {{guarantee: exactly_once, checkpoint_interval_ms: 5, partial_rollback: true, "
    "upstream_backup_mb: {mb}}}"
)

CHAIN = (
    """
name: chain
"""
    + CONFIG
    + """
spouts:
  - {{id: src, operator: model_numbers, parallelism: 2}}
bolts:
  - {{id: mid, operator: model_keyed, parallelism: 2}}
  - {{id: count, operator: model_tally, parallelism: 2}}
streams:
  - {{from: src, to: mid, grouping: shuffle}}
  - {{from: mid, to: count, grouping: {{type: fields, fields: [key]}}}}
"""
)

FAN_IN = (
    """
name: fanin
"""
    + CONFIG
    + """
spouts:
  - {{id: src_a, operator: model_numbers, parallelism: 1}}
  - {{id: src_b, operator: model_numbers, parallelism: 2}}
bolts:
  - {{id: mid, operator: model_keyed, parallelism: 2}}
  - {{id: count, operator: model_tally, parallelism: 2}}
streams:
  - {{from: src_a, to: mid, grouping: shuffle}}
  - {{from: src_b, to: mid, grouping: shuffle}}
  - {{from: mid, to: count, grouping: {{type: fields, fields: [key]}}}}
"""
)

JOBS = {"chain": (CHAIN, 1), "fanin": (FAN_IN, 2)}  # job, sources per count reference


@pytest.fixture(autouse=True)
def frequent_purges(monkeypatch):
    """The model's runs last a few hundred ms: purge every few of them."""
    monkeypatch.setattr(upstream_backup, "PURGE_POLL_S", 0.003)


class Parts(dict):
    """epoch -> {part: data}, and called as the store's ``parts(epoch)`` listing."""

    def __call__(self, epoch: int) -> set[str]:
        return set(self.get(epoch, {}))


class ListedStore(MemoryStore):
    """The model's store, with the listing the workers' purge reads."""

    def __init__(self) -> None:
        self.parts = Parts()

    def epochs(self) -> list[int]:
        return sorted(self.parts)


class UpstreamNet(Net):
    def __init__(self, job: str, mb: float | str = 64) -> None:
        text, self.sources = JOBS[job]
        super().__init__(job=text.format(mb=mb), store=ListedStore())
        self.touched: set[int] = set()  # workers some kill's rollback set held
        self.dead: set[int] = set()
        self.version = 0
        self.paths: list[str] = []
        self.replayers: set[int] = set()

    def node_of(self, wid: int) -> str:
        return self.phys.by_id(wid).node

    def step(self, wid: int) -> None:
        if wid not in self.dead:
            super().step(wid)

    def deliver(self, link: tuple[int, int]) -> None:
        if link[1] in self.dead:
            self.links[link].popleft()  # the dead worker's address: the switch drops it
            return
        super().deliver(link)

    def senders_of(self, wid: int) -> list[int]:
        return sorted(a for a, b in worker_edges(self.topo, self.phys) if b == wid)

    def routing(self, wid: int, phys: Any) -> list[ControlTuple]:
        """ROUTING for worker ``wid`` as ``phys`` has it (what the fault detector sends)."""
        self.version += 1
        return [
            ControlTuple(Control.ROUTING, {**r.to_body(), "version": self.version})
            for r in routes_for(self.topo, phys, wid)
        ]

    def kill(self, wid: int, outage: int = 0) -> None:
        """The worker dies; its senders are routed around it at once (its key groups have
        no owner until the replacement runs), ``outage`` turns of the model pass, then
        the recovery."""
        self.fail(wid)
        if outage:
            self.run_out(limit=outage)
        self.recover(wid)

    def fail(self, wid: int) -> None:
        self.lose_inbound(wid)
        self.dead.add(wid)
        around = without(self.phys, {wid})
        for sender in self.senders_of(wid):
            if sender not in self.dead:
                for ct in self.routing(sender, around):
                    self.fws[sender].control(ct)

    def recover(self, wid: int) -> None:
        """The controller's plan: roll back the failed worker and its downstream closure
        to the newest checkpoint complete for them, and have their senders outside the
        set replay (or, where that cannot be, the region)."""
        self.settle_writes()
        self.generation += 1
        coverage = {w: fw.backup.coverage() for w, fw in self.fws.items() if fw.backup}
        # the epoch: the newest checkpoint complete for the failed worker's closure
        closure = downstream_closure(worker_edges(self.topo, self.phys), {wid})
        epoch = recovery_point(self.phys, self.store, set(closure))
        plan = partial_rollback(self.topo, self.phys, [wid], epoch, coverage)
        members = set(plan.workers)
        if plan.path != PARTIAL:
            epoch = recovery_point(self.phys, self.store, members)
        self.check_recovery_point(epoch, members)
        self.paths.append(plan.path)
        self.restored.append(epoch)
        self.phys = roll_back(self.phys, members, self.generation, epoch)
        self.fws[wid] = self.start(self.phys, wid)
        self.dead.discard(wid)
        self.touched |= members
        # its senders route to the replacement again, confirmed before any ROLLBACK goes out
        for sender in self.senders_of(wid):
            if sender not in self.dead:
                for ct in self.routing(sender, self.phys):
                    self.fws[sender].control(ct)
        body = {"generation": self.generation, "epoch": -1 if epoch is None else epoch}
        for other in sorted(members - {wid}):
            self.controls.append((other, ControlTuple(Control.ROLLBACK, body)))
        for sender, receivers in plan.replayers.items():
            self.replayers.add(sender)
            replay = {**body, "replay": list(receivers)}
            self.controls.append((sender, ControlTuple(Control.ROLLBACK, replay)))

    def check(self) -> None:
        want = {k: n * self.sources for k, n in REFERENCE.items()}
        assert self.counts() == want
        seeked = {index for index, _ in Numbers.seeks}
        for wid, fw in self.fws.items():
            if wid in self.touched:
                continue
            # outside every rollback set: never restored, never rolled back
            assert fw.rollbacks == 0 and fw.restored == [], (wid, fw.restored)
            assert "restored_epochs" not in fw.metrics() or not fw.metrics()["restored_epochs"]
            if fw.is_spout:
                assert fw.replayed_from is None and not fw.replays, wid
        sources = [w for w in self.ids if self.fws[w].is_spout]
        if not set(sources) & self.touched:
            # no source rolled back: none seeked (the replays came from buffers)
            assert not seeked, Numbers.seeks

    def members_of(self, node: str) -> list[int]:
        return [w for w in self.ids if self.node_of(w) == node]


@pytest.mark.parametrize("job", ["chain", "fanin"])
@pytest.mark.parametrize("victim", ["mid", "count"])
def test_partial_rollback_at_every_point_of_a_run_stays_exact(job, victim):
    """A sweep over kill points: the failed worker and its downstream closure roll back,
    the rest of the job (its sources, the other mids when a count dies) never restores,
    the sources never seek, the counts are exact, and the path is partial."""
    replayed = purged = orphans = 0
    restored: list[int | None] = []
    for point in range(0, 700, 23):
        net = UpstreamNet(job)
        net.run_out(limit=point)
        workers = net.members_of(victim)
        dead = workers[point % len(workers)]
        net.kill(dead, outage=point % 40)  # its senders keep what has no owner meanwhile
        net.run_out()
        net.check()
        assert net.paths == [PARTIAL]
        rolled = net.touched
        if victim == "count":
            assert rolled == {dead}, rolled  # a sink: its closure is itself
        else:
            assert rolled == {dead, *net.members_of("count")}, rolled
        replayed += sum(net.fws[w].backup.replayed for w in net.replayers)
        purged += sum(fw.backup.purged for fw in net.fws.values())
        orphans += sum(fw.backup_orphans for fw in net.fws.values())
        assert not any(fw.unrouted for fw in net.fws.values())
        restored += net.restored
    assert replayed > 0, "no sender replayed anything"
    assert purged > 0, "no buffer was ever purged"
    if victim == "count":
        assert orphans > 0, "no tuple of a dead owner's key group was kept"
    assert sum(e is not None for e in restored) > len(restored) // 2, restored


@pytest.mark.parametrize("job", ["chain", "fanin"])
def test_two_kills_in_a_row_middle_then_sink(job):
    for point in range(0, 600, 37):
        net = UpstreamNet(job)
        net.run_out(limit=point)
        net.kill(net.members_of("mid")[point % 2])
        net.run_out(limit=point // 3)
        net.kill(net.members_of("count")[(point // 7) % 2])
        net.run_out()
        net.check()
        assert net.paths == [PARTIAL, PARTIAL]


@pytest.mark.parametrize("job", ["chain", "fanin"])
def test_the_replays_of_two_kills_heard_newest_first(job):
    """The same count worker dies twice before its senders hear the first replay; they
    hear the second one first.  The older replay must then send nothing: after its
    older mark the receiver, already in the newer generation, would take it as new."""
    for point in range(50, 600, 61):
        net = UpstreamNet(job)
        net.run_out(limit=point)
        dead = net.members_of("count")[point % 2]
        net.kill(dead)
        net.kill(dead)
        while net.controls:
            net.control(len(net.controls) - 1)
        net.run_out()
        net.check()
        assert net.paths == [PARTIAL, PARTIAL]


def test_a_source_kill_falls_back_to_region_rollback_and_stays_exact():
    for point in range(0, 500, 41):
        net = UpstreamNet("fanin")
        net.run_out(limit=point)
        net.kill(net.members_of("src_b")[point % 2])
        net.run_out()
        net.check()
        assert net.paths == ["global"]  # one region: the whole job


def test_buffers_too_small_to_reach_back_fall_back_and_stay_exact(monkeypatch):
    """A bound of 10 bytes, purges every 2 ms: the sources wait for each purge before
    they emit again (backpressure, nothing lost), the mids give up what they cannot
    hold (trim), so a kill of a count worker finds their buffers short and rolls the
    region back instead; exact either way."""
    monkeypatch.setattr(upstream_backup, "PURGE_POLL_S", 0.002)  # (more often still)
    paths: list[str] = []
    trimmed = waited = 0
    for point in range(100, 600, 97):
        net = UpstreamNet("chain", mb="0.00001")
        for _ in range(point):
            net.run_out(limit=1)
            waited += sum(net.fws[w].backup_full() for w in net.members_of("src"))
        trimmed += sum(net.fws[w].backup.trimmed for w in net.members_of("mid"))
        net.kill(net.members_of("count")[point % 2])
        net.run_out()
        net.check()
        paths += net.paths
    assert trimmed and waited and "global" in paths, (trimmed, waited, paths)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["chain", "fanin"]), actions, st.integers(0, 3))
def test_partial_rollback_is_exact_whatever_the_interleaving(job: str, script: Any, kills: int):
    """Kills of any worker (a source's falls back), controls (ROLLBACK and replays) heard
    in any order, deliveries interleaved at random: exact counts."""
    net = UpstreamNet(job)
    play(net, script, kills, kill=lambda wid, n: net.kill(wid, outage=n % 7 * 5))
    net.check()


def test_a_worker_purges_by_the_checkpoints_of_its_own_region():
    """Two independent chains: each worker's purge waits for its chain's parts only (the
    region found without networkx equals ``failover_regions``)."""
    from test_region_model import JOB as TWO_CHAINS

    from typhoon.checkpoint.regions import failover_regions, region_parts

    text = TWO_CHAINS.replace("checkpoint_interval_ms: 5}", "checkpoint_interval_ms: 5, "
                              "partial_rollback: true}")  # fmt: skip
    net = UpstreamNet("chain")
    net.topo = load_topology_text(text)
    net.phys = schedule(net.topo, ["h1"], 3, first_port=10)
    regions = failover_regions(net.topo, net.phys)
    assert len(regions) == 2
    for w in net.phys.workers:
        fw = net.start(net.phys, w.worker_id)
        (mine,) = [r for r in regions if w.worker_id in r]
        assert fw.purge_parts == region_parts(net.phys, mine), w
