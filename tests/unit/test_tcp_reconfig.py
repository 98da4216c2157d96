"""The pure parts of rescaling a tcp job (typhoon/tcp_reconfig.py): what tcp refuses, the
``--scale`` option, and the executor driving the real plan against a fake tcp cluster
whose workers ack each control tuple (the real processes: tests/runtime)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from typhoon.reconfig import Reroute, Scale, plan
from typhoon.runtime.keyed_state import KeyedStates
from typhoon.tcp_reconfig import Record, Rescaler, keyed_nodes
from typhoon.tcp_recovery import IncidentWatch
from typhoon.tcp_requests import parse_scale_option, tcp_refusal
from typhoon.topology import load_topology_text, schedule
from typhoon.topology.scheduler import app_id_for
from typhoon.wire import Control, ControlTuple, decode_control, encode_control
from typhoon_cli import UsageError, tcp_scales

RUNNING = """
name: rm
spouts:
  - {id: source, operator: sentence_source, args: {count: 100}}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: count, operator: running_count, parallelism: 4, config: {max_parallelism: 64}}
  - {id: max, operator: max_by_key, parallelism: 2}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: count, grouping: {type: fields, fields: [word]}}
  - {from: count, to: max, grouping: {type: fields, fields: [key]}}
"""

WORDCOUNT = """
name: wc
spouts:
  - {id: source, operator: sentence_source, args: {count: 100}}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: count, operator: count_by_key, args: {key: word}, parallelism: 2, stateful: true}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: count, grouping: shuffle}
"""


def topo(text: str = RUNNING, **config: Any):
    t = load_topology_text(text, "t.yaml")
    t.config.update(config)
    return t


# ----- what tcp refuses ----------------------------------------------------------------------


def test_a_keyed_node_may_be_rescaled_on_tcp():
    assert tcp_refusal(topo(), Scale("count", 6)) is None
    assert tcp_refusal(topo(), Scale("split", 3)) is None  # stateless: nothing to move


def test_a_direct_reroute_is_a_locality_move_tcp_runs():
    table = (("a", 0), ("b", 3))
    assert tcp_refusal(topo(), Reroute("split->count", "direct", ("word",), table)) is None
    sentence = tcp_refusal(topo(), Reroute("split->count", "fields", ("word",)))
    assert sentence is not None and "a 'direct' reroute (a locality move)" in sentence


def test_the_executor_runs_a_direct_reroute_with_its_key_moves():
    c = FakeCluster(topo(guarantee="exactly_once"))
    r = Rescaler(c)
    rec = r.request(Reroute("split->count", "direct", ("word",), (("a", 0), ("b", 3))))
    assert r.turn(0.0) and rec.state == "done", rec.error
    kinds = [k for k, _ in c.log if k != "METRIC_REQ"]
    order = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    assert order == ["launch", "KEYGROUPS", "ROUTING", "KEYGROUPS"]
    assert c.log[0] == ("launch", []) and rec.added == []  # the same workers
    prepare = next(ct for _, ct in c.inbox_log if ct.type == Control.KEYGROUPS)
    assert prepare.body["phase"] == "prepare"
    assert rec.to_dict()["request"] == "route stream split->count by direct on word"
    assert sorted(rec.placement["count"]) == [4, 5, 6, 7]
    assert c.topology.streams[1].grouping.type == "direct"


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_a_guaranteed_job_may_be_rescaled_on_tcp(guarantee):
    assert tcp_refusal(topo(guarantee=guarantee), Scale("count", 6)) is None
    assert tcp_refusal(topo(guarantee=guarantee), Scale("count", 2)) is None


@pytest.mark.parametrize(
    ("t", "request_", "words"),
    [
        (topo(), Reroute("split->count", "shuffle"), "only 'scale'"),
        (topo(), Scale("nope", 2), "no node named 'nope'"),
        (topo(WORDCOUNT), Scale("count", 3), "not keyed (stateful: true"),
    ],
    ids=["reroute", "unknown", "flush"],
)
def test_what_tcp_cannot_rescale_is_refused_with_one_sentence(t, request_, words):
    sentence = tcp_refusal(t, request_)
    assert sentence is not None and words in sentence
    assert sentence.count(". ") == 0 and "\n" not in sentence


def test_a_spark_node_is_refused():
    t = topo()
    t.nodes["count"] = dataclasses.replace(t.nodes["count"], engine="spark")
    assert "spark node 'count' cannot be rescaled on tcp" in tcp_refusal(t, Scale("count", 6))


@pytest.mark.parametrize(
    ("text", "want"),
    [("5:count=6", (5.0, Scale("count", 6))), ("0.5:split=1", (0.5, Scale("split", 1)))],
)
def test_scale_option(text, want):
    assert parse_scale_option(text) == want


@pytest.mark.parametrize("text", ["count=6", "5:count", "x:count=6", "-1:count=2", "5:count=0"])
def test_a_malformed_scale_option_says_its_form(text):
    with pytest.raises(ValueError, match="AT:NODE=N"):
        parse_scale_option(text)


def test_the_cli_checks_every_scale_before_the_run():
    t = topo()
    assert tcp_scales(t, ["9:count=3", "2:count=6"]) == [
        (2.0, Scale("count", 6)),
        (9.0, Scale("count", 3)),
    ]
    with pytest.raises(UsageError, match="'source' is a spout"):
        tcp_scales(t, ["2:source=2"])
    with pytest.raises(UsageError, match="already has parallelism 6"):
        tcp_scales(t, ["2:count=6", "3:count=6"])
    with pytest.raises(UsageError, match="not keyed"):
        tcp_scales(topo(WORDCOUNT), ["2:count=3"])
    with pytest.raises(UsageError, match="AT:NODE=N"):
        tcp_scales(t, ["count=3"])


# ----- the worker's side: where its keyed state is ---------------------------------------------


def test_held_groups_counts_the_keys_of_each_group():
    ks = KeyedStates("op", "count", 5, [0], 64, set(range(64)))
    counts = ks.state("counts", 0)
    for k in ("a", "b", "c", "d", "e"):
        counts[k] = 1
    want: dict[int, int] = {}
    for k in ("a", "b", "c", "d", "e"):
        want[ks.group_of(k)] = want.get(ks.group_of(k), 0) + 1
    assert ks.held_groups() == want and list(want) != [] and sorted(want) == list(ks.held_groups())


def test_metric_req_may_ask_for_keys_and_nothing_else():
    ct = ControlTuple(Control.METRIC_REQ, {"request_id": 3, "keys": True})
    assert decode_control(encode_control(ct)).body == {"request_id": 3, "keys": True}
    with pytest.raises(ValueError, match="keys"):
        encode_control(ControlTuple(Control.METRIC_REQ, {"request_id": 3, "keys": "yes"}))


# ----- the executor against a fake cluster -----------------------------------------------------


class Proc:
    def __init__(self) -> None:
        self.code: int | None = None
        self.terminated = False

    def poll(self) -> int | None:
        return self.code

    def terminate(self) -> None:
        self.terminated = True
        self.code = 0


class FakeCluster:
    """Workers that ack every control tuple on the next pump, and report key groups."""

    def __init__(
        self,
        t,
        drain_code: int = 0,
        silent: set[int] = frozenset(),
        die: tuple[str, int] | None = None,
        restart_fails: bool = False,
        closed: dict[int, int | None] | None = None,
    ) -> None:
        self.topology = t
        self.physical = schedule(t, ["h1"], app_id_for(t.name), first_port=0)
        self.procs: dict[int, Any] = {w.worker_id: Proc() for w in self.physical.workers}
        self.acks: list[dict[str, Any]] = []
        self.replies: dict[int, tuple[int, dict[str, Any]]] = {}
        self.log: list[tuple[str, Any]] = []
        self.inbox: list[tuple[int, ControlTuple]] = []
        self.inbox_log: list[tuple[int, ControlTuple]] = []
        self.version = 0
        self.drain_code = drain_code
        self.silent = set(silent)
        self.die = die  # (control type, worker): it dies instead of acking that control
        self.restart_fails = restart_fails
        self.restarts: list[tuple[Any, Any, str]] = []
        # worker -> exit code it ends with after closing its control connection (None: never)
        self.closed = dict(closed or {})

    def connected(self, w: int) -> bool:
        return w not in self.closed

    def launch_workers(self, ids: list[int]) -> None:
        self.log.append(("launch", ids))
        for w in ids:
            self.procs[w] = Proc()

    def await_workers(self, ids: list[int]) -> None:
        self.log.append(("peers", ids))

    def send(self, w: int, ct: ControlTuple) -> None:
        encode_control(ct)  # every body is valid on the wire
        self.log.append((ct.type.name, w))
        self.inbox.append((w, ct))
        self.inbox_log.append((w, ct))

    def next_version(self) -> int:
        self.version += 1
        return self.version

    def hosts(self) -> list[str]:
        return ["h1"]

    def restart(self, t, physical, reason: str) -> None:
        self.log.append(("restart", sorted(w.worker_id for w in physical.workers)))
        if self.restart_fails:
            raise RuntimeError("workers [4] did not say hello in time")
        self.restarts.append((t, physical, reason))
        self.topology, self.physical = t, physical
        self.procs = {w.worker_id: Proc() for w in physical.workers}
        self.die = None

    def pump(self, timeout: float) -> None:
        for w, code in self.closed.items():
            self.procs[w].code = code
        for w, ct in self.inbox:
            assert w not in self.closed, f"sent {ct.type.name} to {w} after it closed"
            if w in self.silent:
                continue
            if self.die == (ct.type.name, w):
                self.procs[w].code = -9
                continue
            if ct.type == Control.METRIC_REQ:
                index = self.physical.by_id(w).index
                mine = [g for g, o in enumerate(self.physical.key_groups["count"]) if o == index]
                keyed = {"owned": {str(g): 1 for g in mine}, "held_groups": {str(mine[0]): 2}}
                self.replies[w] = (ct.body["request_id"], {"keyed": keyed})
            elif ct.type == Control.DRAIN:
                self.procs[w].code = self.drain_code
            else:
                self.acks.append({"worker": w, "ack": ct.type.name, "version": ct.body["version"]})
        self.inbox = []


def test_the_executor_runs_the_sdn_plan_in_order_and_reports_the_placement():
    c = FakeCluster(topo())
    r = Rescaler(c, [(1.0, Scale("count", 6))])
    assert r.turn(0.5) and not r.records  # not due yet
    assert r.turn(1.0)
    (rec,) = r.records
    assert rec.state == "done", rec.error
    kinds = [k for k, _ in c.log if k != "METRIC_REQ"]
    # launched, then everyone learns the newcomers' addresses, then the sdn protocol
    assert kinds[:2] == ["launch", "peers"] and c.log[0][1] == rec.added == [10, 11]
    order = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    # the groups move in rounds (typhoon.reconfig.steps): prepare, ROUTING, finish each
    rounds = order[3:].count("ROUTING")
    assert rounds > 1 and order == ["launch", "peers", "UPSTREAM"] + ["KEYGROUPS", "ROUTING"] * (
        rounds
    ) + ["KEYGROUPS"]
    assert c.physical.version == rec.physical.version and len(c.physical.of_node("count")) == 6
    where = rec.placement["count"]
    assert sorted(where) == [4, 5, 6, 7, 10, 11]
    assert sorted(g for p in where.values() for g in p["owned"]) == list(range(64))
    p = plan(Scale("count", 6), topo(), schedule(topo(), ["h1"], app_id_for("rm"), 0), ["h1"], 0)
    assert keyed_nodes(p) == ["count"]


def test_a_scale_down_drains_and_waits_for_the_workers_to_exit():
    c = FakeCluster(topo())
    r = Rescaler(c)
    rec = r.request(Scale("count", 2))
    assert r.turn(0.0) and rec.state == "done", rec.error
    assert rec.removed == [6, 7] and all(c.procs[w].code == 0 for w in rec.removed)
    assert [w.worker_id for w in c.physical.workers if w.node == "count"] == [4, 5]


def test_a_drained_worker_that_fails_fails_the_update():
    c = FakeCluster(topo(), drain_code=3)
    r = Rescaler(c, [(0.0, Scale("count", 2))])
    assert not r.turn(0.0)
    (rec,) = r.records
    assert rec.state == "failed" and "exited (code 3)" in rec.error
    assert r.failed() == [f"rescale 1 (scale count to 2): {rec.error}"]


def test_a_worker_whose_stream_ended_during_a_scale_down_is_left_out_not_sent_to():
    """CI run of e162d0a: the source finished while 6 -> 3 ran; count worker 11 had closed
    its control connection and was exiting when DRAIN was due (KeyError, a crashed run)."""
    c = FakeCluster(topo(), closed={7: 0})
    r = Rescaler(c)
    rec = r.request(Scale("count", 2))
    assert r.turn(0.0) and rec.state == "done", rec.error
    assert ("DRAIN", 7) not in c.log and ("DRAIN", 6) in c.log
    assert 7 not in rec.placement["count"]


@pytest.mark.parametrize("code", [3, None])
def test_a_closed_worker_that_fails_or_hangs_fails_the_update_in_one_sentence(monkeypatch, code):
    monkeypatch.setattr("typhoon.tcp_reconfig.STEP_TIMEOUT_S", 0.05)
    c = FakeCluster(topo(), closed={7: code})
    r = Rescaler(c, [(0.0, Scale("count", 2))])
    assert not r.turn(0.0)
    (rec,) = r.records
    if code is None:
        assert "[7] closed their control connection but did not exit" in rec.error
    else:
        assert "worker 7 exited (code 3)" in rec.error


def test_an_unconfirmed_step_fails_after_its_timeout(monkeypatch):
    monkeypatch.setattr("typhoon.tcp_reconfig.STEP_TIMEOUT_S", 0.05)
    c = FakeCluster(topo(), silent={4})
    r = Rescaler(c, [(0.0, Scale("count", 6))])
    assert not r.turn(0.0)
    assert "workers [4] did not confirm KEYGROUPS within 0.05 s" in r.records[0].error


def test_a_refused_rescale_changes_nothing_and_the_run_goes_on():
    c = FakeCluster(topo(WORDCOUNT, guarantee="at_least_once"))
    before = c.physical
    r = Rescaler(c, [(0.0, Scale("count", 3))])
    assert r.turn(0.0)
    assert r.records[0].state == "refused" and "not keyed" in r.records[0].error
    assert c.physical is before and not c.log
    assert r.report()[0]["state"] == "refused"


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_a_guaranteed_rescale_runs_the_same_plan(guarantee):
    c = FakeCluster(topo(guarantee=guarantee))
    r = Rescaler(c, [(0.0, Scale("count", 6))])
    assert r.turn(0.0)
    (rec,) = r.records
    assert rec.state == "done", rec.error
    kinds = [k for k, _ in c.log if k != "METRIC_REQ"]
    order = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    # under a guarantee the groups move in one round (typhoon.reconfig.steps)
    assert order == ["launch", "peers", "UPSTREAM", "KEYGROUPS", "ROUTING", "KEYGROUPS"]
    assert not c.restarts


def test_a_guaranteed_scale_down_stops_the_drained_workers():
    """Under a guarantee a drained worker would wait for COMPLETE (to roll back): the
    coordinator stops it once it acked DRAIN, as sdn's agents do."""
    c = FakeCluster(topo(guarantee="exactly_once"))

    def pump(timeout: float, pump=c.pump) -> None:  # a drained worker stays, as under a
        for w, ct in c.inbox:  # guarantee: it acks DRAIN and waits
            if ct.type == Control.DRAIN:
                c.acks.append({"worker": w, "ack": "DRAIN", "version": ct.body["version"]})
        c.inbox = [(w, ct) for w, ct in c.inbox if ct.type != Control.DRAIN]
        pump(timeout)

    c.pump = pump
    r = Rescaler(c)
    rec = r.request(Scale("count", 2))
    assert r.turn(0.0) and rec.state == "done", rec.error
    assert [w for w in (4, 5, 6, 7) if c.procs[w].terminated] == [6, 7]


@pytest.mark.parametrize(
    ("ctype", "victim"),
    [("UPSTREAM", 8), ("KEYGROUPS", 4), ("ROUTING", 2), ("KEYGROUPS", 11)],
    ids=["upstream-receiver", "keygroups-old-owner", "routing-sender", "keygroups-added"],
)
def test_a_death_during_a_guaranteed_rescale_restarts_every_worker_in_the_final_topology(
    ctype, victim
):
    c = FakeCluster(topo(guarantee="exactly_once"), die=(ctype, victim))
    r = Rescaler(c, [(0.0, Scale("count", 6))])
    assert r.turn(0.0)  # the run goes on
    (rec,) = r.records
    assert rec.state == "restarted", rec.error
    assert rec.error.startswith(f"workers [{victim}] died (step ")
    assert f"worker {victim} exited (code -9) before it confirmed {ctype}" in rec.error
    ((t, physical, reason),) = c.restarts
    assert physical.version == rec.physical.version and len(physical.of_node("count")) == 6
    assert all(w.active for w in physical.workers)
    assert t.nodes["count"].parallelism == 6 and c.topology is t
    assert reason.startswith("during rescale 1 (scale count to 6), at step ")
    assert [s["state"] for s in rec.steps][-1] == "failed"
    where = rec.placement["count"]  # asked again after the restart
    assert sorted(where) == [4, 5, 6, 7, 10, 11]


def test_a_death_during_a_guaranteed_scale_down_restarts_without_the_drained_workers():
    c = FakeCluster(topo(guarantee="at_least_once"), die=("KEYGROUPS", 6))
    r = Rescaler(c, [(0.0, Scale("count", 2))])
    assert r.turn(0.0)
    (rec,) = r.records
    assert rec.state == "restarted", rec.error
    ((_, physical, _),) = c.restarts
    assert [w.worker_id for w in physical.of_node("count")] == [4, 5]


def test_without_a_guarantee_a_death_during_a_rescale_fails_it():
    c = FakeCluster(topo(), die=("KEYGROUPS", 4))
    r = Rescaler(c, [(0.0, Scale("count", 6))])
    assert not r.turn(0.0)
    assert r.records[0].state == "failed" and "worker 4 exited (code -9)" in r.records[0].error
    assert not c.restarts


def test_a_restart_that_fails_fails_the_update():
    c = FakeCluster(topo(guarantee="exactly_once"), die=("KEYGROUPS", 4), restart_fails=True)
    r = Rescaler(c, [(0.0, Scale("count", 6))])
    assert not r.turn(0.0)
    (rec,) = r.records
    assert rec.state == "failed" and "the restart after it failed: workers [4]" in rec.error
    assert r.failed() == [f"rescale 1 (scale count to 6): {rec.error}"]


def test_a_worker_that_dies_after_the_steps_is_left_out_of_the_placement():
    """The update is done: the run loop's recovery takes the dead worker (tcp_recovery)."""
    c = FakeCluster(topo(guarantee="exactly_once"), die=("METRIC_REQ", 10))
    r = Rescaler(c, [(0.0, Scale("count", 6))])
    assert r.turn(0.0)
    (rec,) = r.records
    assert rec.state == "done" and not c.restarts
    assert sorted(rec.placement["count"]) == [4, 5, 6, 7, 11]


def test_records_are_json_ready():
    rec = Record(1, Scale("count", 6))
    assert rec.to_dict()["request"] == "scale count to 6"


# ----- the restart after a death during a guaranteed rescale (typhoon/tcp_recovery.py) -------


class RestartProc:
    def __init__(self, code: int | None = None) -> None:
        self.code, self.killed, self.closed = code, False, False

    def poll(self) -> int | None:
        return self.code

    def kill(self) -> None:
        self.killed, self.code = True, -9

    def wait(self, timeout: float | None = None) -> int | None:
        return self.code

    def close_log(self) -> None:
        self.closed = True


class Sock:
    closed = False

    def close(self) -> None:
        self.closed = True


class Sel:
    def __init__(self) -> None:
        self.unregistered: list[Any] = []

    def unregister(self, sock: Any) -> None:
        self.unregistered.append(sock)


class Conn:
    def __init__(self) -> None:
        self.sock = Sock()


class Coordinator:
    """What ``tcp_recovery.restart`` uses of ``TcpCluster``, recording what it does."""

    def __init__(self, t, physical, dead: dict[int, int]) -> None:
        self.topology, self.physical, self.generation = t, physical, physical.generation
        self.launched = {w.worker_id: w for w in physical.workers}
        self.procs = {w: RestartProc(dead.get(w)) for w in self.launched}
        self.conns = {w: Conn() for w in self.launched if w not in dead}
        self.sel = Sel()
        self.peers: dict[int, tuple[str, int]] = {}
        self.recovered: list[int] = []
        self.incidents: list[dict[str, Any]] = []
        self.sent: list[tuple[int, str]] = []
        self.specs: list[tuple[int, int, int | None]] = []
        self.broadcasts = 0
        self.watch = IncidentWatch()

    def _launch_worker(self, w) -> None:
        self.specs.append((w.worker_id, self.physical.generation, self.physical.restore_epoch))
        self.procs[w.worker_id] = RestartProc()

    def _accept_hellos(self, expected: set[int]) -> dict[int, tuple[str, int]]:
        self.conns = {w: Conn() for w in expected}
        return {w: ("127.0.0.1", 9000 + w) for w in expected}

    def _broadcast_peers(self) -> None:
        self.broadcasts += 1

    def send(self, w: int, ct: ControlTuple) -> None:
        self.sent.append((w, ct.type.name))


def written(tmp_path, t, physical, epochs: dict[int, dict[str, list[int] | None]]) -> None:
    import msgpack

    from typhoon.checkpoint import open_store

    store = open_store(t.config["checkpoint_store"], t.name)
    for epoch, parts in epochs.items():
        for w in physical.workers:
            name = f"{w.node}-{w.index}"
            if name in parts:
                body = {"plan": 1} if parts[name] is None else {"plan": 1, "groups": parts[name]}
                store.write(epoch, name, msgpack.packb(body))


@pytest.mark.parametrize("to", [6, 2])
def test_restart_stops_every_worker_and_starts_the_final_ones_from_a_checkpoint(tmp_path, to):
    from typhoon.tcp_recovery import restart

    t = topo(guarantee="exactly_once", checkpoint_store=f"file://{tmp_path}")
    before = schedule(t, ["h1"], app_id_for(t.name), first_port=0)
    p = plan(Scale("count", to), t, before, ["h1"], 0, min_id=10)
    # the transition topology is what the coordinator had when the worker died
    c = Coordinator(t, p.physical, dead={5: -9})
    old = {w.worker_id: w for w in p.physical.workers}
    procs, conns = dict(c.procs), dict(c.conns)
    every = {f"{w.node}-{w.index}": None for w in p.physical.workers if w.node != "count"}
    counts = {f"count-{i}": list(range(16 * i, 16 * i + 16)) for i in range(4)}
    written(tmp_path, t, p.physical, {3: {**every, **counts}})
    restart(c, p.topology, p.final, "during rescale 1 (scale count to 6), at step 'x'")
    final = {w.worker_id for w in p.final.workers}
    # every old process was killed (the dead one was not) and its log closed
    assert all(pr.killed == (w != 5) and pr.closed for w, pr in procs.items())
    assert all(conn.sock.closed for conn in conns.values())
    assert sorted(c.procs) == sorted(final)  # the drained ones are gone for good
    # each final worker started again in one new generation, from the complete epoch:
    # after a scale-up only a start over has the added workers' parts
    epoch = 3 if to < 4 else None
    assert sorted(c.specs) == sorted((w, 1, epoch) for w in final)
    assert (c.physical.generation, c.physical.restore_epoch, c.generation) == (1, epoch, 1)
    assert c.topology is p.topology and c.broadcasts == 1 and sorted(c.peers) == sorted(final)
    assert c.sent == [(1, "ACTIVATE")]
    assert c.recovered == [5]
    (incident,) = c.incidents
    assert incident["state"] == "rejoined" and incident["rollback"] == "restart"
    assert incident["worker"] == 5 and incident["node"] == old[5].node
    assert incident["replacement"] == 5 and incident["restore_epoch"] == epoch
    assert incident["rolled_back"] == sorted(final - {5})
    assert "exited with -9 during rescale 1" in incident["reason"]


def test_restart_after_a_scale_down_skips_an_epoch_without_the_drained_groups(tmp_path):
    """Epoch 4 has the two staying count workers' parts, but not the drained ones' (they
    were skipped while the groups moved): its groups 32-63 are in no part, so the
    restart takes epoch 3."""
    from typhoon.tcp_recovery import restart

    t = topo(guarantee="at_least_once", checkpoint_store=f"file://{tmp_path}")
    before = schedule(t, ["h1"], app_id_for(t.name), first_port=0)
    p = plan(Scale("count", 2), t, before, ["h1"], 0, min_id=10)
    every = {f"{w.node}-{w.index}": None for w in p.physical.workers if w.node != "count"}
    counts = {f"count-{i}": list(range(16 * i, 16 * i + 16)) for i in range(4)}
    staying = {k: v for k, v in counts.items() if k in ("count-0", "count-1")}
    written(tmp_path, t, p.physical, {3: {**every, **counts}, 4: {**every, **staying}})
    c = Coordinator(t, p.physical, dead={6: -9})
    restart(c, p.topology, p.final, "during rescale 1 (scale count to 2), at step 'x'")
    assert c.physical.restore_epoch == 3
    assert c.incidents[0]["replacement"] is None  # the dead worker was a drained one


def test_the_links_of_a_drained_worker_are_left_out_once_its_receivers_rolled_back():
    from typhoon.report import link_problems
    from typhoon.tcp_recovery import drop_left_links

    def report(w: int, gen: int, out: dict, into: dict) -> dict[str, Any]:
        return {
            "worker": w,
            "node": "count" if w < 8 else "max",
            "index": w,
            "metrics": {"generation": gen},
            "links": {"out": out, "in": into},
        }

    # worker 6 (drained, generation 0) sent 40 to max 8; max 8 rolled back to generation 1
    # and counts only what came since (10 from worker 4)
    reports = [
        report(6, 0, {"8:2": 40}, {}),
        report(4, 1, {"8:2": 10}, {}),
        report(8, 1, {}, {"6:2": 0, "4:2": 10}),
    ]
    assert link_problems(reports)  # compared as they are: 40 sent, 0 received
    drop_left_links(reports, left={6}, generation=1)
    assert reports[0]["links"] is None and reports[1]["links"] is not None
    assert link_problems(reports) == []
    # the same generation: still compared (a drained worker's last tuples must arrive)
    same = [report(6, 1, {"8:2": 40}, {}), report(8, 1, {}, {"6:2": 39})]
    drop_left_links(same, left={6}, generation=1)
    (problem,) = link_problems(same)
    assert "stream 2: 40 tuples sent, 39 received (1 missing)" in problem
