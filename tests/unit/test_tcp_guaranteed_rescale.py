"""Model check of a tcp rescale under a guarantee, with a worker killed during or right
after it (typhoon/tcp_reconfig.py, typhoon/tcp_recovery.py, docs/guarantees.md).

The real tcp executor (:class:`typhoon.tcp_reconfig.Rescaler`) runs the real plan of a
``Scale`` against the model of ``test_guaranteed_migration``: the real framework
layers of source x2 -> running_count -> max_by_key under a guarantee, in-memory
ordered links, a checkpoint store in memory and a seeded scheduler that interleaves
deliveries, turns, time and control tuples.  :class:`ModelCluster` is what the
executor sees of the tcp coordinator: processes (a killed worker's exit code -9, a
finished one's 0 once it may exit), the control connection (acks and METRIC_RESPs),
launching, and the restart of :func:`typhoon.tcp_recovery.restart` (every worker
again in the update's final topology, in a new generation, from
``recovery_point`` of that topology).  A death after the update is recovered as
:func:`typhoon.tcp_recovery.recover` does: the dead worker again from the newest
complete checkpoint, ROLLBACK to every other.

The maxima must equal the counts (``exactly_once``: exactly; ``at_least_once``: never
short) and each key's state must be on the one worker routing sends it to.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import msgpack
import pytest
from test_guaranteed_migration import GuaranteedNet, ReplayableWords, Store, ran
from test_keyed_migration import COUNT, REFERENCE, Links, check_ownership

from typhoon.checkpoint.progress import JobProgress, holds_every_group, recovery_point
from typhoon.operators import BUILTINS
from typhoon.reconfig import Scale, plan
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.tcp_reconfig import Rescaler
from typhoon.tcp_recovery import restarted
from typhoon.wire import Control, ControlTuple

MOVES_PER_PUMP = 12


class SlowWords(ReplayableWords):
    """One word per turn: the update ends well before the job does, so a worker can be
    killed after it."""

    def next_batch(self, emit: Any, max_count: int) -> bool:
        return super().next_batch(emit, 1)


@pytest.fixture(autouse=True)
def _words():
    BUILTINS["model_words"] = SlowWords
    yield
    BUILTINS.pop("model_words", None)


class ReplyLinks(Links):
    """The model's links, also keeping METRIC_RESPs (the placement asks for key groups)."""

    def reply(self, ct: ControlTuple) -> None:
        super().reply(ct)
        body = ct.body
        if "ack" not in body["metrics"]:
            self.net.replies[self.me] = (body["request_id"], body["metrics"])


class Proc:
    """A worker process as the executor polls it."""

    def __init__(self, net: TcpNet, wid: int) -> None:
        self.net, self.wid = net, wid

    def poll(self) -> int | None:
        if self.wid in self.net.dead:
            return -9
        fw = self.net.fws.get(self.wid)
        if fw is None or self.wid in self.net.stopped:
            return 0
        return 0 if fw.done and fw.may_exit else None

    def terminate(self) -> None:  # SIGTERM: the worker stops and exits 0
        self.net.stopped.add(self.wid)


class TcpNet(GuaranteedNet):
    """The guaranteed model, with dead workers that stay dead until a recovery."""

    def __init__(self, seed: int, guarantee: str = "exactly_once") -> None:
        self.dead: set[int] = set()
        self.stopped: set[int] = set()
        self.replies: dict[int, tuple[int, dict[str, Any]]] = {}
        super().__init__(seed, guarantee)

    def start(self, phys: Any, wid: int) -> None:
        node = self.topo.nodes[phys.by_id(wid).node]
        spec = WorkerSpec(self.topo, phys, wid, batch_size=4, max_delay_ms=0.0)
        op = BUILTINS[node.operator](**node.args)
        fw = Framework(spec, op, ReplyLinks(self, wid), clock=lambda: self.now, store=self.blobs)
        fw.now = self.now
        fw.start()
        if fw.is_spout:
            fw.control(ControlTuple(Control.ACTIVATE, {}))
        self.fws[wid] = fw
        self.dead.discard(wid)
        self.stopped.discard(wid)

    def move(self) -> None:
        gone = self.dead | self.stopped
        for link in [k for k in self.links if k[1] in gone]:
            self.links[link].clear()  # what was on its way to a dead worker is lost
        self.controls = [(w, ct) for w, ct in self.controls if w not in gone]
        super().move()

    def die(self, wid: int) -> None:
        """SIGKILL: the worker and what it holds are gone; its process says -9."""
        self.settle_writes()
        self.fws.pop(wid)
        self.dead.add(wid)
        for link in [k for k in self.links if k[1] == wid]:
            self.links[link].clear()

    def recover(self, wid: int) -> int | None:
        """``tcp_recovery.recover``: ``wid`` again from the newest complete checkpoint in a
        new generation, every other running worker rolled back."""
        self.settle_writes()
        return self.kill(wid)

    def done(self) -> bool:
        running = {w for w in self.fws if w not in self.stopped}
        return all(self.fws[w].done for w in running) and not any(self.links.values())


class ModelCluster:
    """What the tcp executor needs of ``TcpCluster`` (``typhoon.tcp_reconfig.Cluster``)."""

    def __init__(self, net: TcpNet, kill_at: int | None, victim: Any) -> None:
        self.net = net
        self.procs: dict[int, Proc] = {w: Proc(net, w) for w in net.fws}
        self.acks: list[dict[str, Any]] = []
        self.seen: set[tuple[int, str, int]] = set()
        self.versions = 0
        self.pumps = 0
        self.kill_at, self.victim = kill_at, victim  # victim(cluster) -> worker id
        self.killed: int | None = None
        self.restarts: list[tuple[int | None, str]] = []
        self.progress = JobProgress()

    # the coordinator's view is the model's
    topology = property(lambda s: s.net.topo, lambda s, v: setattr(s.net, "topo", v))
    physical = property(lambda s: s.net.phys, lambda s, v: setattr(s.net, "phys", v))
    replies = property(lambda s: s.net.replies)

    def launch_workers(self, worker_ids: list[int]) -> None:
        for wid in worker_ids:
            self.net.start(self.physical, wid)
            self.procs[wid] = Proc(self.net, wid)

    def await_workers(self, worker_ids: list[int]) -> None:
        """Hellos and peers: the model's links need no addresses."""

    def connected(self, worker_id: int) -> bool:
        return self.procs[worker_id].poll() is None

    def send(self, worker_id: int, ct: ControlTuple) -> None:
        self.net.controls.append((worker_id, ct))

    def next_version(self) -> int:
        self.versions += 1
        return self.versions

    def hosts(self) -> list[str]:
        return ["h1"]

    def pump(self, timeout: float) -> None:
        self.pumps += 1
        if self.killed is None and self.pumps == self.kill_at:
            self.killed = self.victim(self)
            self.net.die(self.killed)
        for _ in range(MOVES_PER_PUMP):
            self.net.move()
        for a in sorted(self.net.acks - self.seen):
            self.seen.add(a)
            self.acks.append({"worker": a[0], "ack": a[1], "version": a[2]})
        # TcpCluster._progress: COMPLETE once every worker finished (they exit then)
        for wid, fw in list(self.net.fws.items()):
            if wid in self.net.stopped:
                continue
            metrics = {"done": fw.done, "generation": fw.gen}
            self.progress.heard(wid, metrics)
            for to in self.progress.to_complete(wid, metrics, self.physical):
                if to in self.net.fws:
                    self.send(to, ControlTuple(Control.COMPLETE, {}))

    def restart(self, topology: Any, physical: Any, reason: str) -> None:
        """``tcp_recovery.restart`` on the model: every worker stopped, the final
        topology's started again from ``recovery_point`` of it in a new generation."""
        net = self.net
        net.settle_writes()
        net.generation = max(net.generation, net.phys.generation, physical.generation) + 1
        epoch = recovery_point(physical, net.store)
        net.fws.clear()
        net.links.clear()
        net.controls.clear()
        net.dead.clear()
        net.stopped.clear()
        net.topo = topology
        net.phys = restarted(physical, net.generation, epoch)
        net.restored.append(epoch)
        for w in net.phys.workers:
            net.start(net.phys, w.worker_id)
        self.procs = {w.worker_id: Proc(net, w.worker_id) for w in net.phys.workers}
        self.restarts.append((epoch, reason))


def newest_count(c: ModelCluster) -> int:
    """The newest count worker running: on a scale-up one the groups move to, on a
    scale-down one that is drained."""
    return max(w for w, fw in c.net.fws.items() if fw.node.name == "count")


def staying_count(c: ModelCluster) -> int:
    return min(w for w, fw in c.net.fws.items() if fw.node.name == "count")


def a_source(c: ModelCluster) -> int:
    return min(w for w, fw in c.net.fws.items() if fw.node.name == "source")


VICTIMS = {"newest": newest_count, "staying": staying_count, "source": a_source}


def rescale(net: TcpNet, to: int, kill_at: int | None, victim: Any) -> tuple[Any, ModelCluster]:
    c = ModelCluster(net, kill_at, victim)
    r = Rescaler(c, [(0.0, Scale("count", to))])
    assert r.turn(0.0), r.failed()
    (rec,) = r.records
    return rec, c


def finish(net: TcpNet, c: ModelCluster, rec: Any) -> None:
    """After the update: a worker dead since is recovered (the run loop's ``recover``),
    then the job runs to its end."""
    for wid in sorted(net.dead):
        net.recover(wid)
    net.run(net.done)


def counts_of(net: TcpNet) -> list[int]:
    return [w.worker_id for w in net.phys.active_of_node("count")]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("to", [5, 2])
def test_a_kill_during_a_tcp_rescale_under_exactly_once_keeps_every_running_count_exact(seed, to):
    """Killed at a random point of the update: every worker restarts in the final
    topology from the newest checkpoint complete under it, and the counts are exact.  A
    kill that lands after the last step (while the placement is asked) is the run
    loop's single recovery instead."""
    net = TcpNet(seed)
    net.run(lambda: ran(net, net.rng.randrange(COUNT // 8, COUNT // 3)))
    victim = ["newest", "staying", "source"][seed % 3]
    rec, c = rescale(net, to, 1 + net.rng.randrange(8), VICTIMS[victim])
    assert c.killed is not None
    if rec.state == "restarted":
        assert f"workers [{c.killed}] died" in rec.error
        ((epoch, reason),) = c.restarts
        assert reason.startswith(f"during rescale 1 (scale count to {to}), at step ")
        assert net.phys.generation == 1
    else:
        assert rec.state == "done" and not c.restarts and c.killed in net.dead, rec.error
    assert len(counts_of(net)) == to
    assert sorted(rec.placement["count"]) == sorted(set(counts_of(net)) - net.dead)
    finish(net, c, rec)
    assert net.maxima() == REFERENCE, net.restored
    check_ownership(net)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("to", [5, 2])
def test_a_kill_right_after_a_tcp_rescale_under_exactly_once_keeps_every_running_count_exact(
    seed, to
):
    """The update done through the tcp executor, then a worker the groups moved to (or a
    source) killed at once or a little later: the tcp recovery's single relaunch and
    ROLLBACK, and the counts are exact."""
    net = TcpNet(seed)
    net.run(lambda: ran(net, net.rng.randrange(COUNT // 8, COUNT // 3)))
    rec, c = rescale(net, to, None, None)
    assert rec.state == "done", rec.error
    assert not c.restarts and sorted(rec.placement["count"]) == counts_of(net)
    if to < 3:  # the drained workers were stopped once they acked DRAIN
        assert net.stopped == set(rec.removed) and all(c.procs[w].poll() == 0 for w in rec.removed)
    for _ in range(net.rng.randrange(0, 200)):
        net.move()
    victim = counts_of(net)[-1] if seed % 3 else a_source(c)
    if net.fws[victim].done:
        pytest.skip("the run ended before the kill")  # pragma: no cover - seeds chosen
    net.die(victim)
    finish(net, c, rec)
    assert net.maxima() == REFERENCE, net.restored
    check_ownership(net)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("to", "when"), [(5, "during"), (2, "during"), (5, "after")])
def test_at_least_once_across_a_tcp_rescale_and_a_kill_never_undercounts(seed, to, when):
    net = TcpNet(seed, "at_least_once")
    net.run(lambda: ran(net, COUNT // 4))
    rec, c = rescale(net, to, 2 if when == "during" else None, VICTIMS["staying"])
    assert rec.state == ("restarted" if when == "during" else "done"), rec.error
    if when == "after":
        net.die(counts_of(net)[seed % to])
    finish(net, c, rec)
    maxima = net.maxima()
    short = {k: (maxima.get(k), n) for k, n in REFERENCE.items() if maxima.get(k, 0) < n}
    assert not short, short
    check_ownership(net)


def test_a_late_kill_during_the_update_restores_a_checkpoint_of_the_old_table_or_none():
    """The restart's epoch is complete under the final table: the store's parts of it
    hold each key group once (``keyed_cut``), whatever the kill interrupted."""
    epochs = []
    for seed in range(6):
        net = TcpNet(seed)
        net.run(lambda n=net: ran(n, COUNT // 3) and n.store.latest_complete(_parts(n)))
        rec, c = rescale(net, 2, 3, VICTIMS["staying"])
        assert rec.state == "restarted", rec.error
        ((epoch, _),) = c.restarts
        epochs.append(epoch)
        finish(net, c, rec)
        assert net.maxima() == REFERENCE
    # a scale-down's final parts are all in epochs from before it: a checkpoint was taken
    assert all(e is not None for e in epochs), epochs


def _parts(net: TcpNet) -> set[str]:
    return {f"{w.node}-{w.index}" for w in net.phys.workers if w.active}


def test_the_restart_topology_is_one_generation_for_all():
    net = TcpNet(0)
    phys = dataclasses.replace(net.phys, worker_generations={1: (3, 2)})
    again = restarted(phys, 4, 7)
    assert (again.generation, again.restore_epoch, again.worker_generations) == (4, 7, {})
    assert again.generation_of(1) == (4, 7) and again.workers == phys.workers
    assert restarted(phys, 4, None).generation_of(2) == (4, None)


def test_the_model_kills_at_a_random_point_of_the_update():
    """The kill lands inside the update for every pump it is set at (the checks above
    would otherwise test the after case twice)."""
    rng = random.Random(1)
    for kill_at in (1, 2, 3):
        net = TcpNet(rng.randrange(100))
        net.run(lambda n=net: ran(n, COUNT // 4))
        rec, c = rescale(net, 5, kill_at, VICTIMS["newest"])
        assert rec.state == "restarted" and c.pumps > kill_at


def test_a_recovery_point_holds_every_key_group_of_each_keyed_node():
    """After a scale-down 3 -> 2 the final workers' parts of an epoch may be there while
    the drained worker's part of it is not (skipped while groups moved): that epoch
    lacks the drained worker's groups, and the recovery takes the one before."""
    net = TcpNet(0)
    final = plan(Scale("count", 2), net.topo, net.phys, ["h1"], 10).final
    store = Store()
    old = {"count-0": range(0, 6), "count-1": range(6, 11), "count-2": range(11, 16)}
    for epoch, parts in ((1, old), (2, {k: v for k, v in old.items() if k != "count-2"})):
        for name, groups in parts.items():
            store.write(epoch, name, msgpack.packb({"groups": list(groups), "plan": 1}))
        for name in ("source-0", "source-1", "max-0", "max-1"):
            store.write(epoch, name, msgpack.packb({"plan": 1}))
    assert store.latest_complete({f"count-{i}" for i in (0, 1)}) == 2
    assert not holds_every_group(store, 2, {"count": 16})
    assert holds_every_group(store, 1, {"count": 16})
    assert recovery_point(final, store) == 1
    assert recovery_point(net.phys, store) == 1  # the old table needs count-2's part anyway


# ----- a locality move (a direct-table reroute with key moves) on tcp --------------------------


def locality_move(net: TcpNet, kill_at: int | None, victim: Any) -> tuple[Any, ModelCluster]:
    """Every key held so far pinned to the next count worker (all of them move), run by
    the tcp executor: the locality router's update, ``Reroute(..., "direct", ...)``."""
    from typhoon.reconfig import Reroute

    ids = counts_of(net)
    table = {k: (ids.index(ws[0]) + 1) % len(ids) for k, ws in net.holders().items()}
    c = ModelCluster(net, kill_at, victim)
    r = Rescaler(c)
    rec = r.request(Reroute(1, "direct", ("word",), tuple(sorted(table.items()))))
    assert r.turn(0.0), r.failed()
    return rec, c


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kill", ["none", "during", "after"])
def test_a_tcp_locality_move_under_exactly_once_moves_each_pinned_keys_state(seed, kill):
    net = TcpNet(seed)
    net.run(lambda: ran(net, net.rng.randrange(COUNT // 6, COUNT // 3)))
    during = 1 + net.rng.randrange(3) if kill == "during" else None
    rec, c = locality_move(net, during, VICTIMS[["newest", "staying"][seed % 2]])
    if kill == "during":
        assert rec.state == "restarted" and c.killed is not None, (rec.state, rec.error)
        # the workers started again follow the table (the update's final topology)
        assert any(s.grouping.type == "direct" for s in net.topo.streams)
    else:
        assert rec.state == "done", rec.error
        prepare = [s for s in rec.steps if s["what"].startswith("KEYGROUPS")]
        assert [s["state"] for s in prepare] == ["done", "done"]
        check_ownership(net)  # the pinned keys' state is where the table sends them
    if kill == "after":
        net.die(counts_of(net)[seed % 3])
    finish(net, c, rec)
    assert net.maxima() == REFERENCE, net.restored
    check_ownership(net)


class LocalityCluster(ModelCluster):
    """The model cluster with what the locality job reads (``typhoon_cli/tcp_locality``)."""

    def __init__(self, net: TcpNet) -> None:
        super().__init__(net, None, None)
        self.rescaler = Rescaler(self)

    @property
    def metrics(self) -> dict[int, dict[str, Any]]:
        return {w: m for w, (_, m) in self.net.replies.items() if w in self.net.fws}

    @property
    def conns(self) -> dict[int, None]:
        return {w: None for w in self.net.fws if w not in self.net.stopped}


@pytest.mark.parametrize("seed", range(4))
def test_the_locality_router_on_a_tcp_run_moves_keys_exactly_under_exactly_once(seed):
    """``--locality``: the real pair counters of the count workers, the sdn locality job
    (plan and two direct reroutes), the tcp executor, a kill right after the move."""
    from controller.locality.job import RouterSettings
    from typhoon_cli.tcp_locality import TcpLocality

    net = TcpNet(seed)
    net.topo.config["locality"] = {"pairs": 500, "sample": 1}
    for w in list(net.fws):  # the workers start again with the counting config
        net.start(net.phys, w)
    c = LocalityCluster(net)
    driver = TcpLocality(0.0, RouterSettings(min_pairs=50))
    net.run(lambda: ran(net, COUNT // 4))
    for turn in range(2000):
        driver(c, float(turn))
        assert c.rescaler.turn(float(turn)), c.rescaler.failed()
        c.pump(0.0)
        if not driver.job.running:
            break
    report = driver.report()
    assert report["phase"] == "done", report
    assert [r.state for r in c.rescaler.records] == ["done", "done"]
    assert [s.grouping.type for s in net.topo.streams] == ["direct", "direct"]
    check_ownership(net)
    if not all(fw.done for fw in net.fws.values()):
        net.die(counts_of(net)[seed % 3])
    finish(net, c, None)
    assert net.maxima() == REFERENCE, net.restored
    check_ownership(net)
