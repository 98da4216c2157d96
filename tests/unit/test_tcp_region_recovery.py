"""Region failover on tcp (typhoon/tcp_recovery.py): the run coordinator's ``recover``
rolls back only the dead worker's failover region, from that region's newest
checkpoint, and its incident records what the failure cost the sinks
(``IncidentWatch``, the rule of typhoon/sink_rates.py) and what the sources replayed.

The coordinator here is a recording stand-in for ``TcpCluster`` (what ``recover``
uses of it); the checkpoint store is a real one in a temp directory."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgpack
import pytest

from typhoon.checkpoint import open_store
from typhoon.checkpoint.regions import replayed_since
from typhoon.tcp_recovery import IncidentWatch, recover
from typhoon.topology import load_topology, schedule
from typhoon.topology.scheduler import app_id_for
from typhoon.wire import ControlTuple

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    def __init__(self, code: int | None = None) -> None:
        self.returncode = code

    def poll(self) -> int | None:
        return self.returncode


class Sock:
    closed = False

    def close(self) -> None:
        self.closed = True


class Conn:
    def __init__(self) -> None:
        self.sock = Sock()


class Sel:
    def unregister(self, sock: Any) -> None:
        pass


class Coordinator:
    """What ``tcp_recovery.recover`` uses of ``TcpCluster``, recording what it does."""

    def __init__(self, topology: Any) -> None:
        self.topology = topology
        self.physical = schedule(topology, ["h1", "h2"], app_id_for(topology.name), first_port=0)
        self.generation = 0
        self.procs = {w.worker_id: Proc() for w in self.physical.workers}
        self.conns = {w: Conn() for w in self.procs}
        self.sel = Sel()
        self.peers: dict[int, tuple[str, int]] = {}
        self.recovered: list[int] = []
        self.incidents: list[dict[str, Any]] = []
        self.sent: list[tuple[int, ControlTuple]] = []
        self.launched: list[tuple[int, tuple[int, int | None]]] = []  # wid, its generation
        self.broadcasts = 0
        self.watch = IncidentWatch()

    def die(self, wid: int) -> None:
        self.procs[wid] = Proc(-9)

    def _launch_worker(self, w: Any) -> None:  # the spec carries physical: its generation
        self.launched.append((w.worker_id, self.physical.generation_of(w.worker_id)))
        self.procs[w.worker_id] = Proc()

    def _accept_hellos(self, expected: set[int]) -> dict[int, tuple[str, int]]:
        self.conns.update({w: Conn() for w in expected})
        return {w: ("127.0.0.1", 9000 + w) for w in expected}

    def _broadcast_peers(self) -> None:
        self.broadcasts += 1

    def send(self, wid: int, ct: ControlTuple) -> None:
        self.sent.append((wid, ct))

    def ids(self, *nodes: str) -> set[int]:
        return {w.worker_id for w in self.physical.workers if w.node in nodes}


def pipelines(tmp_path: Path, **config: Any) -> Any:
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "pipelines.yaml"))
    t.config.update(checkpoint_store=str(tmp_path / "ck"), **config)
    return t


def wordcount(tmp_path: Path) -> Any:
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.config.update(guarantee="exactly_once", checkpoint_store=str(tmp_path / "ck"))
    return t


def write_parts(c: Coordinator, epochs: dict[int, set[str]]) -> None:
    """Epoch -> the nodes whose workers wrote their part of it."""
    store = open_store(c.topology.config["checkpoint_store"], c.topology.name)
    for epoch, nodes in epochs.items():
        for w in c.physical.workers:
            if w.node in nodes:
                store.write(epoch, f"{w.node}-{w.index}", msgpack.packb({"state": {}}))


def chain(i: int) -> tuple[str, str, str]:
    return (f"source_{i}", f"split_{i}", f"count_{i}")


def rollbacks(c: Coordinator) -> dict[int, dict[str, Any]]:
    return {w: ct.body for w, ct in c.sent if ct.type.name == "ROLLBACK"}


def test_a_death_rolls_back_only_its_pipeline_from_that_pipelines_newest_checkpoint(tmp_path):
    """Pipeline 1 has written epoch 2 everywhere, pipeline 2 only epoch 1: the global
    checkpoint is 1, but pipeline 1's region goes back to 2, alone."""
    c = Coordinator(pipelines(tmp_path))
    write_parts(c, {1: {*chain(1), *chain(2), *chain(3)}, 2: {*chain(1), *chain(3)}})
    one, others = c.ids(*chain(1)), c.ids(*chain(2), *chain(3))
    victim = c.physical.of_node("count_1")[0].worker_id
    c.die(victim)
    recover(c, victim)
    assert rollbacks(c) == {w: {"generation": 1, "epoch": 2} for w in one - {victim}}
    assert all(w in one for w, _ in c.sent)  # nothing at all to the other pipelines
    assert c.launched == [(victim, (1, 2))]  # the replacement starts restored, in its region
    assert {c.physical.generation_of(w) for w in others} == {(0, None)}
    assert {c.physical.generation_of(w) for w in one} == {(1, 2)}
    (i,) = c.incidents
    assert (i["rollback"], i["region"], i["rolled_back"]) == (
        "region",
        sorted(one),
        sorted(one - {victim}),
    )
    assert (i["generation"], i["restore_epoch"], i["replacement"]) == (1, 2, victim)
    assert i["sinks"] == ["count_1"] and i["back_at_80_ms"] is None
    assert c.recovered == [victim] and c.broadcasts == 1
    # rolled back once every worker told confirmed that generation's ROLLBACK
    watch, late = IncidentWatch(), max(one - {victim})
    for w in sorted(one - {victim, late}):
        watch.acked(c.incidents, w, {"ack": "ROLLBACK", "version": 1}, i["detected"] + 0.2)
        watch.acked(c.incidents, late, {"ack": "ROUTING", "version": 1}, i["detected"] + 0.3)
    assert i["rolled_back_ms"] is None
    watch.acked(c.incidents, late, {"ack": "ROLLBACK", "version": 1}, i["detected"] + 0.4)
    assert i["rolled_back_ms"] == pytest.approx(400.0)


def test_a_later_death_in_another_pipeline_takes_a_generation_of_its_own(tmp_path):
    c = Coordinator(pipelines(tmp_path))
    write_parts(c, {1: {*chain(1), *chain(2), *chain(3)}})
    first = c.physical.of_node("count_1")[0].worker_id
    c.die(first)
    recover(c, first)
    write_parts(c, {2: set(chain(2))})  # pipeline 2 went on checkpointing meanwhile
    c.sent.clear()
    second = c.physical.of_node("split_2")[0].worker_id
    c.die(second)
    recover(c, second)
    two = c.ids(*chain(2))
    assert rollbacks(c) == {w: {"generation": 2, "epoch": 2} for w in two - {second}}
    assert {c.physical.generation_of(w) for w in c.ids(*chain(1))} == {(1, 1)}
    assert {c.physical.generation_of(w) for w in two} == {(2, 2)}
    assert {c.physical.generation_of(w) for w in c.ids(*chain(3))} == {(0, None)}
    assert [i["generation"] for i in c.incidents] == [1, 2]
    assert c.incidents[1]["region"] == sorted(two)


def test_a_region_peer_that_died_too_gets_no_rollback_it_is_recovered_on_its_own(tmp_path):
    c = Coordinator(pipelines(tmp_path))
    write_parts(c, {1: {*chain(1), *chain(2), *chain(3)}})
    count, split = (c.physical.of_node(n)[0].worker_id for n in ("count_1", "split_1"))
    c.die(count)
    c.die(split)
    recover(c, count)
    assert split not in rollbacks(c) and split not in c.incidents[0]["rolled_back"]
    recover(c, split)  # the run loop's next one: the count's replacement rolls back again
    assert rollbacks(c)[count] == {"generation": 2, "epoch": 1}


@pytest.mark.parametrize("job", ["wordcount", "failover_global"])
def test_one_region_or_failover_global_rolls_every_worker_back(tmp_path, job):
    t = wordcount(tmp_path) if job == "wordcount" else pipelines(tmp_path, failover="global")
    c = Coordinator(t)
    write_parts(c, {1: {n for n in t.nodes}})
    victim = c.physical.workers[-1].worker_id
    c.die(victim)
    recover(c, victim)
    everyone = {w.worker_id for w in c.physical.workers}
    assert rollbacks(c) == {w: {"generation": 1, "epoch": 1} for w in everyone - {victim}}
    (i,) = c.incidents
    assert i["rollback"] == "global" and i["region"] == sorted(everyone)
    assert c.physical.worker_generations == {}  # every worker in generation 1, as before
    assert (c.physical.generation, c.physical.restore_epoch) == (1, 1)


def test_no_store_rolls_the_region_back_to_the_start(tmp_path):
    t = pipelines(tmp_path)
    t.config["checkpoint_store"] = "/proc/nope"
    c = Coordinator(t)
    victim = c.physical.of_node("count_3")[0].worker_id
    c.die(victim)
    recover(c, victim)
    sent = rollbacks(c)
    assert sent and all(body == {"generation": 1, "epoch": -1} for body in sent.values())
    assert c.incidents[0]["restore_epoch"] is None


# ----- what the failure cost the sinks, and the replays ---------------------------------------


@pytest.mark.parametrize("relaunched", [True, False])
def test_the_incident_gets_its_sinks_rate_and_back_at_80_from_their_replies(tmp_path, relaunched):
    """count_1's two workers reply once a second at 500 words/s each.  Worker ``a`` dies
    at 10 s; a new process under its ID replies from 11 s, counting from 0 and taking in
    1,200 words/s from 12 s on.  As on sdn, where a replacement has an ID of its own,
    the new process counts from its first reply (``SinkWatch.relaunched``); counted in
    the dead one's log it would count only past the dead one's 5,000.  The sinks of
    the other pipelines never count toward the incident."""
    c = Coordinator(pipelines(tmp_path))
    a, b = (w.worker_id for w in c.physical.of_node("count_1"))
    other = c.physical.of_node("count_2")[0].worker_id
    watch = IncidentWatch()
    incident = {"app": c.topology.name, "worker": a, "detected": 10.0, "generation": 1}
    incident.update(rolled_back=[b], replayed={}, sinks=["count_1"], back_at_80_ms=None)
    incident.update(sink_rate_before=None, sink_rate_lowest=None)
    incidents = [incident]

    def reply(wid: int, at: float, n: int) -> None:
        watch.heard(c.topology, c.physical, incidents, wid, {"in": {"0": 3, "1": n}}, at)

    for t in range(11):  # 0..10 s: 1,000 words/s between them
        reply(a, float(t), 500 * t)
        reply(b, float(t), 500 * t)
        reply(other, float(t), 7 * t)  # another pipeline's sink: not this incident's
    if relaunched:
        watch.sinks.relaunched(c.topology.name, a)  # what recover() does
    for t in range(11, 18):
        reply(a, float(t), 1200 * max(0, t - 12))
        reply(b, float(t), 500 * t)
    assert incident["sink_rate_before"] == 1000.0
    assert incident["sink_rate_lowest"] == 500.0  # b alone, right after the detection
    if relaunched:
        # the window [lo, lo + 1) from 11 s on does 500 + 1,200 (lo - 11) words/s: the
        # first at >= 800/s (80%) starts at 11.3 s (windows slide by 0.1 s)
        assert incident["back_at_80_ms"] == 1300.0
        assert len(watch.sinks.logs[c.topology.name]) == 4  # a's old log stays, silent
    else:
        # a counts only past 5,000, from 16 s on (1,000 of its 1,200 words to 17 s)
        assert incident["back_at_80_ms"] == 5300.0


def test_a_rolled_back_source_says_what_it_replayed(tmp_path):
    c = Coordinator(pipelines(tmp_path))
    src = c.physical.of_node("source_1")[0].worker_id
    incidents = [{"generation": 2, "rolled_back": [src], "replayed": {}, "sinks": ["count_1"]}]
    sinks = IncidentWatch()
    sinks.heard(c.topology, c.physical, incidents, src, {"replayed": {"1": 9, "3": 40}}, 1.0)
    assert incidents[0]["replayed"] == {src: 40}  # generation 2 was covered by 3's rollback
    sinks.heard(c.topology, c.physical, incidents, src, {"replayed": {"2": 12, "3": 40}}, 2.0)
    assert incidents[0]["replayed"] == {src: 12}


def test_replayed_since_reads_only_wellformed_counts():
    assert replayed_since({"1": 5, "2": 7}, 2) == 7
    assert replayed_since({"1": 5, "4": 7}, 2) == 7
    assert replayed_since({"1": 5}, 2) is None
    assert replayed_since({"x": 5, "3": "many", "3.5": 1}, 1) is None
    assert replayed_since([1, 2], 1) is None
