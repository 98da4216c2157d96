"""Model check of the checkpoint and rollback protocol (typhoon.runtime.checkpoints).

Real framework layers of every worker of a small job (two sources, two middle
workers, two counters keyed by field), wired by in-memory links that keep each
link's order as the real transports do.  Hypothesis draws the interleaving:
which worker runs, which link delivers, how time passes, which worker is killed
(its inbound frames are lost and a replacement starts from the newest complete
global checkpoint) and when the other workers hear the ROLLBACK.  Whatever the
interleaving, the counts at the end equal the reference exactly under
``exactly_once`` and never fall short under ``at_least_once``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_net import Links

from controller.recovery.fault_detector import failover, senders_to
from typhoon.checkpoint.progress import recovery_point
from typhoon.checkpoint.regions import roll_back
from typhoon.operators import BUILTINS, Bolt, Spout
from typhoon.report import restored_epochs
from typhoon.runtime import checkpoints as ck
from typhoon.runtime.framework import Framework
from typhoon.runtime.guarantee import MAX_EARLY_MARKS
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound
from typhoon.topology import load_topology_text, schedule
from typhoon.topology.routing import routes_for
from typhoon.wire import Control, ControlTuple, decode_control, encode_control

COUNT = 120
KEYS = 5


class Numbers(Spout):
    """Emits n for n in index, index + parallelism, ... < count; replayable."""

    fields: ClassVar[tuple[str, ...]] = ("n",)
    seeks: ClassVar[list[tuple[int, int]]] = []  # (index, offset) of every seek; Net resets it

    def __init__(self, count: int = COUNT) -> None:
        super().__init__(count=count)
        self.count, self.next = count, 0

    def open(self, context: Any) -> None:
        super().open(context)
        self.next, self.step = context.index, context.parallelism
        self.index = context.index

    def next_batch(self, emit: Any, max_count: int) -> bool:
        for _ in range(min(max_count, 3)):
            if self.next >= self.count:
                return False
            emit([self.next])
            self.next += self.step
        return self.next < self.count

    def offset(self) -> Any:
        return self.next

    def seek(self, offset: Any) -> None:
        Numbers.seeks.append((self.index, offset))
        self.next = offset


class Keyed(Bolt):
    fields: ClassVar[tuple[str, ...]] = ("key", "n")

    def process(self, values: list, emit: Any) -> None:
        emit([values[0] % KEYS, values[0]])


class Lagged(Keyed):
    """Keyed, with its output coming later from an outside engine (as a spark node's does):
    ``pump`` emits at most two queued tuples a turn.  It keeps no state of its own, so
    only holding each anchor until what came before it was emitted keeps it exact."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: collections.deque = collections.deque()
        self.emitted = self.at_snapshot = 0
        self.marks: dict[int, int] = {}

    def process(self, values: list, emit: Any) -> None:
        self.queue.append([values[0] % KEYS, values[0]])

    def pump(self, emit: Any, input_done: bool) -> bool:
        for _ in range(min(2, len(self.queue))):
            emit(self.queue.popleft())
            self.emitted += 1
        return bool(self.queue)

    def snapshot(self) -> Any:
        self.at_snapshot = self.emitted + len(self.queue)
        return None


class Held(Lagged):
    def anchor_ready(self, epoch: int) -> bool:
        self.marks.setdefault(epoch, self.at_snapshot)
        return self.emitted >= self.marks[epoch]


class Tally(Bolt):
    fields: ClassVar[tuple[str, ...]] = ("key", "count")

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[int, int] = {}

    def process(self, values: list, emit: Any) -> None:
        self.counts[values[0]] = self.counts.get(values[0], 0) + 1

    def snapshot(self) -> Any:
        return dict(self.counts)

    def restore(self, state: Any) -> None:
        self.counts = dict(state or {})


JOB = """
name: model
config: {{guarantee: {guarantee}, checkpoint_interval_ms: 5}}
spouts:
  - {{id: src, operator: model_numbers, parallelism: 2}}
bolts:
  - {{id: mid, operator: {mid}, parallelism: 2}}
  - {{id: count, operator: model_tally, parallelism: 2}}
streams:
  - {{from: src, to: mid, grouping: shuffle}}
  - {{from: mid, to: count, grouping: {{type: fields, fields: [key]}}}}
"""


@pytest.fixture(scope="module", autouse=True)
def model_operators():
    ops = {
        "model_numbers": Numbers,
        "model_keyed": Keyed,
        "model_tally": Tally,
        "model_lagged": Lagged,
        "model_held": Held,
    }
    BUILTINS.update(ops)
    yield
    for name in ops:
        BUILTINS.pop(name, None)


class MemoryStore:
    """The checkpoint store's interface, in memory."""

    def __init__(self) -> None:
        self.parts: dict[int, dict[str, bytes]] = {}

    def write(self, epoch: int, part: str, data: bytes) -> None:
        self.parts.setdefault(epoch, {})[part] = data

    def read(self, epoch: int, part: str) -> bytes:
        return self.parts[epoch][part]

    def latest_complete(self, expected: set[str]) -> int | None:
        done = [e for e, ps in self.parts.items() if expected <= set(ps)]
        return max(done) if done else None


class Net:
    """The model network of a job: this file's (``guarantee``, the ``mid`` operator), or
    ``job``, another topology text (the region and upstream-backup models'), with a
    ``store`` of the caller's if it needs more than ``MemoryStore``."""

    def __init__(
        self,
        guarantee: str = "exactly_once",
        mid: str = "model_keyed",
        *,
        job: str | None = None,
        store: MemoryStore | None = None,
    ) -> None:
        text = JOB.format(guarantee=guarantee, mid=mid) if job is None else job
        self.topo = load_topology_text(text)
        self.phys = schedule(self.topo, ["h1"], 3, first_port=10)
        self.store = MemoryStore() if store is None else store
        self.now = 0.0
        self.links: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque
        )
        self.fws: dict[int, Framework] = {}
        self.controls: list[tuple[int, ControlTuple]] = []
        self.generation = 0
        self.restored: list[int | None] = []  # the epoch each kill rolled back to
        Numbers.seeks = []
        for w in self.phys.workers:
            self.fws[w.worker_id] = self.start(self.phys, w.worker_id)
        self.ids = sorted(self.fws)

    def start(self, phys: Any, wid: int, activate: bool = True) -> Framework:
        node = self.topo.nodes[phys.by_id(wid).node]
        spec = WorkerSpec(self.topo, phys, wid, batch_size=4, max_delay_ms=0.0)
        op = BUILTINS[node.operator](**node.args)
        fw = Framework(spec, op, Links(self, wid), clock=lambda: self.now, store=self.store)
        fw.now = self.now
        fw.start()
        if fw.is_spout and activate:
            fw.control(ControlTuple(Control.ACTIVATE, {}))
        return fw

    def settle_writes(self) -> None:
        for fw in self.fws.values():
            if fw.ckpt is not None:
                fw.ckpt.flush()

    def step(self, wid: int) -> None:
        fw = self.fws[wid]
        fw.now = self.now
        fw.step_spout()
        fw.tick()

    def deliver(self, link: tuple[int, int]) -> None:
        stream, payloads = self.links[link].popleft()
        fw = self.fws[link[1]]
        fw.now = self.now
        fw.deliver(Inbound(link[0], stream, payloads))

    def lose_inbound(self, wid: int) -> None:
        """The worker dies: what is in flight to it is gone (the checkpoint writes the
        workers started are settled first)."""
        self.settle_writes()
        for link in [k for k in self.links if k[1] == wid]:
            self.links[link].clear()

    def check_recovery_point(self, epoch: int | None, workers: set[int] | None = None) -> None:
        """``epoch`` (what the real recoveries compute) is the newest one every part of
        ``workers`` (default: all) is in, read from the store here, not asked."""
        parts = {
            f"{w.node}-{w.index}"
            for w in self.phys.workers
            if workers is None or w.worker_id in workers
        }
        complete = [e for e, ps in self.store.parts.items() if parts <= set(ps)]
        assert epoch == (max(complete) if complete else None), (epoch, complete)

    def kill(self, wid: int) -> None:
        """The worker dies with what it holds and what is in flight to it."""
        self.lose_inbound(wid)
        self.generation += 1
        epoch = recovery_point(self.phys, self.store)  # what the real recoveries call
        self.check_recovery_point(epoch)
        self.restored.append(epoch)
        phys = dataclasses.replace(self.phys, generation=self.generation, restore_epoch=epoch)
        self.fws[wid] = self.start(phys, wid)
        body = {"generation": self.generation, "epoch": -1 if epoch is None else epoch}
        for other in self.ids:
            if other != wid:
                self.controls.append((other, ControlTuple(Control.ROLLBACK, body)))

    def control(self, i: int) -> None:
        wid, ct = self.controls.pop(i)
        self.fws[wid].now = self.now
        self.fws[wid].control(ct)

    def run_out(self, limit: int | None = None) -> None:
        for i in range(20000):
            if limit is not None and i >= limit:
                return
            if self.controls:
                self.control(0)
                continue
            busy = [k for k, q in self.links.items() if q]
            if busy:
                self.deliver(busy[0])
                continue
            if all(fw.done for fw in self.fws.values()):
                return
            self.now += 0.001
            for wid in self.ids:
                self.step(wid)
            self.settle_writes()
        raise AssertionError("the job did not finish")

    def replays(self) -> list[tuple[int, int, set[int]]]:
        """(source index, offset it was told to replay from, the offsets its checkpoints
        of the epochs the kills restored hold) of every seek; the checkpointed offsets are
        read from the store here, the replay offset is what the source was told."""
        epochs = {e for e in self.restored if e is not None}
        out = []
        for index, offset in Numbers.seeks:
            saved = {
                msgpack.unpackb(
                    self.store.read(e, f"src-{index}"), raw=False, strict_map_key=False
                )["offset"]
                for e in epochs
            }
            out.append((index, offset, saved))
        return out

    def check_replays(self) -> None:
        """Every restored epoch's replay is from that checkpoint's offset, never from a
        position the checkpoints do not hold."""
        for index, offset, saved in self.replays():
            assert offset in saved, (index, offset, saved)
        # the workers' metrics (the run report's) say which epochs they restored
        reported = {
            e for fw in self.fws.values() for e in restored_epochs(roundtrip_metrics(fw.metrics()))
        }
        assert {e for e in self.restored if e is not None} <= reported, (self.restored, reported)

    def counts(self) -> dict[int, int]:
        merged: collections.Counter = collections.Counter()
        for fw in self.fws.values():
            if isinstance(fw.op, Tally):
                merged.update(fw.op.counts)
        return dict(merged)


def roundtrip_metrics(metrics: dict) -> dict:
    """The metrics as a METRIC_RESP carries them (the wire refuses what it cannot carry)."""
    ct = ControlTuple(Control.METRIC_RESP, {"request_id": 1, "worker": 1, "metrics": metrics})
    return decode_control(encode_control(ct)).body["metrics"]


REFERENCE = dict(collections.Counter(n % KEYS for n in range(COUNT)))

actions = st.lists(
    st.tuples(st.sampled_from(["step", "deliver", "time", "kill", "control"]), st.integers(0, 99)),
    max_size=250,
)


def play(
    net: Net,
    script: list[tuple[str, int]],
    kills: int,
    kill: Callable[[int, int], None] | None = None,
) -> None:
    """Run Hypothesis' ``script`` of actions on ``net``, at most ``kills`` of them kills
    (``kill(worker, n)``, default ``net.kill(worker)``), then run the job out."""
    kill = kill or (lambda wid, n: net.kill(wid))
    for what, n in script:
        if what == "step":
            net.step(net.ids[n % len(net.ids)])
        elif what == "deliver":
            busy = [k for k, q in net.links.items() if q]
            if busy:
                net.deliver(busy[n % len(busy)])
        elif what == "time":
            net.now += (n % 10) * 0.002
        elif what == "kill" and kills > 0:
            kills -= 1
            kill(net.ids[n % len(net.ids)], n)
        elif what == "control" and net.controls:
            net.control(n % len(net.controls))
        net.settle_writes()
    net.run_out()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions, st.integers(0, 3))
def test_exactly_once_counts_whatever_the_interleaving_and_failures(script, kills):
    net = Net("exactly_once")
    play(net, script, kills)
    assert net.counts() == REFERENCE
    net.check_replays()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions, st.integers(1, 3))
def test_at_least_once_never_undercounts(script, kills):
    net = Net("at_least_once")
    play(net, script, kills)
    counts = net.counts()
    assert all(counts.get(k, 0) >= n for k, n in REFERENCE.items()), counts
    net.check_replays()


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_kills_at_every_point_of_a_run(guarantee):
    """A sweep: one run per kill point (scheduler steps into the run) and victim,
    then a second kill; exact counts (exactly once) or none missing.  Each kill's
    restored epoch is recorded: kills after the first global checkpoint must restore
    one (a rollback to the start with a full replay is exact too, so counts alone
    cannot tell), and the sources replay from their checkpointed offsets."""
    restored: list[int | None] = []
    resumed: list[tuple[int, int]] = []  # (source index, replay offset) past its start
    for point in range(0, 700, 23):
        net = Net(guarantee)
        net.run_out(limit=point)
        net.kill(net.ids[point % len(net.ids)])
        net.run_out(limit=point // 3)
        net.kill(net.ids[(point // 7) % len(net.ids)])
        net.run_out()
        counts = net.counts()
        if guarantee == "exactly_once":
            assert counts == REFERENCE, (point, counts)
        else:
            assert all(counts.get(k, 0) >= n for k, n in REFERENCE.items()), (point, counts)
        net.check_replays()
        restored += net.restored
        resumed += [(i, off) for i, off, _ in net.replays() if off > i]
    epochs = [e for e in restored if e is not None]
    assert len(epochs) > len(restored) // 2 and max(epochs) >= 1, restored
    assert resumed, "no source replayed from a checkpointed offset past its start"


def kill_sweep(guarantee: str, mid: str) -> list[int]:
    """Kill points of a sweep at which the counts came out wrong (short, at least once)."""
    wrong = []
    for point in range(0, 700, 23):
        net = Net(guarantee, mid)
        net.run_out(limit=point)
        net.kill(net.ids[point % len(net.ids)])
        net.run_out()
        counts = net.counts()
        if guarantee == "at_least_once":
            if any(counts.get(k, 0) < n for k, n in REFERENCE.items()):
                wrong.append(point)
        elif counts != REFERENCE:
            wrong.append(point)
    return wrong


def test_an_operator_holding_its_anchors_stays_exact():
    """Output that an outside engine emits later (pump) belongs before the anchor of the
    epoch its input came in: with ``anchor_ready`` every kill point gives exact counts, and
    the same operator without it loses tuples (what a spark node did before it held them)."""
    assert kill_sweep("exactly_once", "model_held") == []
    assert kill_sweep("at_least_once", "model_held") == []
    assert kill_sweep("exactly_once", "model_lagged") != []


def test_without_a_guarantee_a_kill_can_lose_tuples():
    """The reference the model is checked against is not trivially met: with
    ``none`` a worker killed mid-run takes its counts with it."""
    net = Net("none")
    for _ in range(4):  # part of the input, not all of it
        for wid in net.ids:
            net.step(wid)
        for link in [k for k, q in net.links.items() if q]:
            while net.links[link]:
                net.deliver(link)
    victim = next(w for w, fw in net.fws.items() if isinstance(fw.op, Tally) and fw.op.counts)
    lost = sum(net.fws[victim].op.counts.values())
    node = net.topo.nodes[net.phys.by_id(victim).node]
    spec = WorkerSpec(net.topo, net.phys, victim, batch_size=4, max_delay_ms=0.0)
    net.fws[victim] = Framework(spec, BUILTINS[node.operator](), Links(net, victim))
    net.run_out()
    assert sum(net.counts().values()) == COUNT - lost < COUNT


class FailingStore(MemoryStore):
    """Writes fail (a full or read-only store) after ``ok`` of them succeeded."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    def write(self, epoch: int, part: str, data: bytes) -> None:
        from typhoon.checkpoint import CheckpointError

        if self.ok <= 0:
            raise CheckpointError(f"checkpoint store /x: no space left on device ({part})")
        self.ok -= 1
        super().write(epoch, part, data)


def test_a_store_that_fails_keeps_the_previous_checkpoint_and_says_why():
    from typhoon.runtime.checkpoints import Checkpointer

    store = FailingStore(ok=1)
    ck = Checkpointer(None, "app", "count-0", store=store)
    ck.save(1, {"state": {"a": 1}})
    ck.save(2, {"state": {"a": 2}})
    ck.flush()
    m = ck.metrics()
    assert m["checkpoint_epoch"] == 1 and m["checkpoint_failed"] == 1
    assert "no space left" in m["checkpoint_error"]
    assert ck.load(1)["state"] == {"a": 1}
    assert store.latest_complete({"count-0"}) == 1
    ck.close()


def test_a_store_that_cannot_be_opened_is_reported_not_fatal(tmp_path):
    from typhoon.runtime.checkpoints import Checkpointer

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ck = Checkpointer(str(blocker / "sub"), "app", "count-0")
    ck.save(1, {"state": None})
    ck.flush()
    m = ck.metrics()
    assert m["checkpoint_epoch"] == -1 and m["checkpoint_failed"] == 1
    assert str(blocker) in m["checkpoint_error"]
    ck.close()


def test_the_controller_tells_a_worker_that_missed_a_recovery():
    from typhoon.checkpoint.progress import JobProgress

    net = Net("exactly_once")
    phys = dataclasses.replace(net.phys, generation=3, restore_epoch=2000004)
    p = JobProgress()
    wid = net.ids[0]
    assert p.behind(wid, {"generation": 3}, phys, 0.0) is None
    assert p.behind(wid, {"generation": 1}, phys, 0.0) is None  # the detector's turn first
    assert p.behind(wid, {"generation": 1}, phys, 2.5) == {"generation": 3, "epoch": 2000004}
    assert p.behind(wid, {"generation": 1}, phys, 3.0) is None  # not twice in a second
    assert p.behind(wid, {"generation": 1}, phys, 3.6) is not None
    assert p.behind(wid, {"generation": 3}, phys, 4.0) is None  # caught up
    assert p.behind(wid, {"generation": 1}, phys, 4.5) is None  # behind again: a new grace
    assert p.behind(999, {"generation": 1}, phys, 9.0) is None  # not a worker of it


def test_a_submission_starts_from_an_empty_store_and_refuses_a_bad_one(tmp_path):
    from typhoon.checkpoint import open_store
    from typhoon.manager import ManagerError, fresh_checkpoints

    topo = load_topology_text(JOB.format(guarantee="exactly_once", mid="model_keyed"))
    topo.config["checkpoint_store"] = str(tmp_path / "ckpt")
    store = open_store(str(tmp_path / "ckpt"), topo.name)
    store.write(7, "count-0", b"an earlier run")
    fresh_checkpoints(topo)
    assert store.epochs() == []
    topo.config["checkpoint_store"] = "/proc/nope"
    with pytest.raises(ManagerError, match="checkpoint store /proc/nope cannot be used"):
        fresh_checkpoints(topo)


def test_complete_goes_to_everyone_once_then_to_whoever_still_replies():
    from typhoon.checkpoint.progress import JobProgress

    net = Net("exactly_once")
    p = JobProgress()
    done = {"done": 1, "generation": 0}
    for wid in net.ids[:-1]:
        p.heard(wid, done)
        assert p.to_complete(wid, done, net.phys) == []
    last = net.ids[-1]
    p.heard(last, done)
    assert p.to_complete(last, done, net.phys) == net.ids
    assert p.to_complete(net.ids[0], done, net.phys) == [net.ids[0]]  # a lost COMPLETE
    assert p.to_complete(net.ids[0], {"done": 0}, net.phys) == []


def test_a_mark_that_comes_before_the_upstream_announcing_its_sender_still_counts():
    """The sdn three-kill test's hang (a source and the stage after it die at once, the
    stage's replacement is written first): the source's replacement starts in a newer
    generation and marks its receivers at once, while the stage's replacement, written
    before it, learns of it only from the UPSTREAM of its own rejoin.  The mark came
    first; dropped as ``not_upstream``, it left that link in no generation, so every
    tuple of the new source was discarded as older and the job never ended.  Kept until
    the UPSTREAM, it counts as if it had come after it: the counts are exact."""
    net = Net("exactly_once")
    net.run_out(limit=150)
    net.settle_writes()
    (s_old, s2), (m_old, m1) = ([w.worker_id for w in net.phys.of_node(n)] for n in ("src", "mid"))
    for dead in (s_old, m_old):
        net.lose_inbound(dead)
        del net.fws[dead]
    for link in [k for k in net.links if k[0] in (s_old, m_old)]:
        del net.links[link]  # what the dead sent and nobody read yet is lost with them
    epoch = recovery_point(net.phys, net.store)
    assert epoch is not None

    def replace(phys: Any, dead: int, gen: int, pending: set[int]) -> tuple[Any, int]:
        """The fault detector's replacement of ``dead`` as generation ``gen``, started."""
        plan = failover(net.topo, phys, dead, ["h1"], 10, min_id=max(net.fws) + 1, pending=pending)
        new = roll_back(plan.physical, [w.worker_id for w in plan.physical.workers], gen, epoch)
        net.fws[plan.replacement] = net.start(new, plan.replacement, activate=False)
        return new, plan.replacement

    def control(wid: int, ctype: Control, body: dict[str, Any]) -> None:
        net.fws[wid].control(ControlTuple(ctype, {**body, "version": 1}))

    p1, m_new = replace(net.phys, m_old, 1, set())  # the stage first: its spec names s_old
    phys, s_new = replace(p1, s_old, 2, {m_new})  # then the source, marking m_new at its start
    assert s_new not in net.fws[m_new].upstream
    while net.links[(s_new, m_new)]:
        net.deliver((s_new, m_new))  # its mark, before m_new knows it as a sender
    assert net.fws[m_new].gen == 1 and "not_upstream" not in net.fws[m_new].io.stats.drops
    # the receivers of the dead (pending replacements left out), then m_new's own rejoin
    control(m1, Control.UPSTREAM, {"add": [s_new], "remove": [s_old]})
    for count in (w.worker_id for w in phys.of_node("count")):
        control(count, Control.UPSTREAM, {"add": [m_new], "remove": [m_old]})
    senders = senders_to(net.topo, phys, "mid")
    control(m_new, Control.UPSTREAM, {"add": senders, "remove": [s_old, m_old], "reopen": False})
    assert net.fws[m_new].gen == 2 and net.fws[m_new].link_gen[s_new] == 2
    for wid in (s2, s_new, m1, m_new):
        for r in routes_for(net.topo, phys, wid):
            control(wid, Control.ROUTING, r.to_body())
    for wid in sorted(set(net.fws) - {s_new}):  # the replacement started restored
        control(wid, Control.ROLLBACK, {"generation": 2, "epoch": epoch})
    control(s_new, Control.ACTIVATE, {})
    net.phys, net.ids, net.restored = phys, sorted(net.fws), [epoch]
    net.run_out()
    assert net.counts() == REFERENCE
    assert net.fws[m_new].metrics()["early_marks"] == 1
    net.check_replays()


def test_a_mark_from_a_worker_never_announced_is_not_applied():
    """Kept is not accepted: a mark from a worker no UPSTREAM adds never rolls us back, an
    UPSTREAM that removes it forgets it, and what is not a mark is dropped and counted."""
    net = Net("exactly_once")
    mid = net.phys.of_node("mid")[0].worker_id
    fw = net.fws[mid]
    fw.deliver(Inbound(99, 0, [ck.mark_payload(5, None), ck.anchor_payload(5000001)]))
    assert fw.gen == 0 and fw.io.stats.drops == {"not_upstream": 1}
    assert fw.early_marks == {99: (5, None)}
    fw.control(ControlTuple(Control.UPSTREAM, {"add": [], "remove": [99], "version": 1}))
    fw.control(ControlTuple(Control.UPSTREAM, {"add": [99], "remove": [], "version": 2}))
    assert fw.gen == 0 and 99 not in fw.link_gen and fw.early_marks == {}
    for src in range(100, 101 + MAX_EARLY_MARKS):  # one sender more than are kept
        fw.deliver(Inbound(src, 0, [ck.mark_payload(1, None)]))
    assert len(fw.early_marks) == MAX_EARLY_MARKS and fw.io.stats.drops == {"not_upstream": 2}
