"""Moving a running worker to another host with its state (``typhoon move``, paper §8).

The planner's part without a switch (``typhoon.reconfig.move`` and ``plan``):
where the new worker goes, what state moves, which steps and control bodies
the stable update sends, and every refusal.  Then the model of
``test_keyed_migration`` (the real framework layers of every worker, in-memory
links that keep each link's order, the real plan run step by step, a seeded
scheduler interleaving deliveries, turns, time and control tuples) runs the
move mid-stream: of a keyed ``running_count`` worker (the sink's maxima are the
counts only if every running count went on where it was) and of a
``count_by_key`` behind a shuffle, whose counts are the operator's own
``snapshot()`` state.
"""

from __future__ import annotations

import collections
from typing import Any, ClassVar

import pytest
from test_keyed_migration import COUNT, JOB, REFERENCE, Blobs, Net, Words

from typhoon.operators import BUILTINS, Bolt
from typhoon.reconfig import Move, ReconfigError, Scale, parse_request, plan
from typhoon.runtime import migration
from typhoon.runtime.framework import Framework
from typhoon.topology import load_topology_text, schedule
from typhoon.topology.keygroups import owned_groups
from typhoon.topology.scheduler import reschedule

HOSTS = ["h1", "h2", "h3"]


@pytest.fixture(autouse=True)
def _operators():
    BUILTINS["model_words"] = Words
    BUILTINS["model_totals"] = Totals
    BUILTINS["model_tally"] = Tally
    yield
    for name in ("model_words", "model_totals", "model_tally"):
        BUILTINS.pop(name, None)


class Totals(Bolt):
    """Sink: adds up the ``[key, delta]`` tuples ``count_by_key`` flushes."""

    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        super().__init__()
        self.totals: collections.Counter = collections.Counter()

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        return []

    def process(self, values: list, emit: Any) -> None:
        self.totals[values[0]] += values[1]


class Tally(Bolt):
    """Sink: words per word length, a dict with int keys (snapshot() state, not keyed)."""

    fields: ClassVar[tuple[str, ...]] = ()
    as_set = False  # a test makes its snapshot unpackable

    def __init__(self) -> None:
        super().__init__()
        self.by_len: collections.Counter = collections.Counter()

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        return []

    def process(self, values: list, emit: Any) -> None:
        self.by_len[len(values[0])] += 1

    def snapshot(self) -> Any:
        return set(self.by_len) if self.as_set else dict(self.by_len)

    def restore(self, state: Any) -> None:
        self.by_len = collections.Counter(state or {})


TALLY = """
name: mig
spouts:
  - {id: source, operator: model_words, parallelism: 2}
bolts:
  - {id: tally, operator: model_tally, parallelism: 2}
streams:
  - {from: source, to: tally, grouping: shuffle}
"""

# count_by_key behind a shuffle keeps plain per-worker counts: its snapshot() is the state
SHUFFLED = """
name: mig
spouts:
  - {id: source, operator: model_words, parallelism: 2}
bolts:
  - {id: count, operator: count_by_key, args: {key: word}, parallelism: 3}
  - {id: totals, operator: model_totals, parallelism: 1}
streams:
  - {from: source, to: count, grouping: shuffle}
  - {from: count, to: totals, grouping: global}
"""


class MoveNet(Net):
    """The migration model on three hosts (a move needs another host to go to)."""

    def __init__(self, seed: int, job: str = JOB) -> None:
        import random

        self.rng = random.Random(seed)
        self.topo = load_topology_text(job)
        self.phys = schedule(self.topo, HOSTS, 3, first_port=10)
        self.blobs = Blobs()
        self.now = 0.0
        self.links = collections.defaultdict(collections.deque)
        self.fws: dict[int, Framework] = {}
        self.controls = []
        self.acks = set()
        self.version = 0
        for w in self.phys.workers:
            self.start(self.phys, w.worker_id)

    def reconfigure(self, request: Any) -> Any:
        p = plan(request, self.topo, self.phys, HOSTS, 10)
        for step in p.steps:
            if step.action == "write":
                self.topo = p.topology
                for wid in p.added:
                    self.start(p.physical, wid)
            elif step.action == "control":
                self.control_step(step.control, step.bodies)
            elif step.action == "drain":
                self.control_step("DRAIN", [(w, {}) for w in step.workers])
            elif step.action == "wait_stopped":
                self.run(lambda: all(self.fws[w].done for w in p.removed))
        self.phys = p.final
        return p

    def tuples_into(self, node: str) -> int:
        return sum(sum(fw.tuples_in.values()) for fw in self.fws.values() if fw.node.name == node)


def other_host(phys: Any, worker: int) -> str:
    here = phys.by_id(worker).host
    return next(h for h in HOSTS if h != here)


# ----- the request and the plan -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"host": "h2"}, "'worker' is missing"),
        ({"worker": "7", "host": "h2"}, "'worker' must be a worker ID"),
        ({"worker": True, "host": "h2"}, "'worker' must be a worker ID"),
        ({"worker": 0, "host": "h2"}, "'worker' must be a worker ID (1 or more), not 0"),
        ({"worker": 7}, "'host' is missing"),
        ({"worker": 7, "host": ""}, "'host' must be a host name"),
        ({"worker": 7, "host": "h2", "node": "x"}, "unknown field(s) node for 'move'"),
    ],
)
def test_a_bad_move_request_is_refused_with_a_sentence(body, words):
    with pytest.raises(ReconfigError) as e:
        parse_request("move", body)
    assert e.value.status == 400 and words in e.value.message, e.value.message


def test_the_scheduler_places_the_moved_workers_index_on_the_host_asked_for():
    topo = load_topology_text(JOB)
    phys = schedule(topo, HOSTS, 3, first_port=10)
    w = phys.active_of_node("count")[1]
    to = other_host(phys, w.worker_id)
    new = reschedule(topo, phys, HOSTS, 10, move={w.worker_id: to})
    (after,) = [x for x in new.workers if x.node == "count" and x.index == 1]
    assert after.host == to and after.worker_id > max(x.worker_id for x in phys.workers)
    assert after.port not in {x.port for x in phys.workers if x.host == to}
    # every other worker stays where it is, with its ID and port
    assert {x for x in new.workers if x is not after} == {
        x for x in phys.workers if x.worker_id != w.worker_id
    }


def test_a_move_plan_moves_every_group_and_the_operator_state_through_the_stable_update():
    topo = load_topology_text(JOB)
    phys = schedule(topo, HOSTS, 3, first_port=10)
    w = phys.active_of_node("count")[1]
    to = other_host(phys, w.worker_id)
    p = plan(parse_request("move", {"worker": w.worker_id, "host": to}), topo, phys, HOSTS, 10)
    (new,) = p.added
    assert p.removed == [w.worker_id]
    moved = p.final.by_id(new)
    assert (moved.node, moved.index, moved.host) == ("count", 1, to)
    assert p.topology.nodes == topo.nodes and p.physical.by_id(w.worker_id).state == "draining"
    assert p.final.key_groups.get("count", []) == p.physical.key_groups.get("count", [])
    kinds = [(s.action, s.control) for s in p.steps]
    assert kinds == [
        ("keep_rules", ""),
        ("write", ""),
        ("wait_attached", ""),
        ("wait_rules", ""),
        ("control", "UPSTREAM"),  # the max workers learn their new sender
        ("control", "KEYGROUPS"),
        ("control", "ROUTING"),
        ("control", "KEYGROUPS"),
        ("commit", ""),
        ("control", "ROUTING"),  # release: end of stream to the old worker
        ("drain", ""),
        ("write_final", ""),
        ("wait_stopped", ""),
        ("drop_rules", ""),
        ("wait_rules", ""),
    ]
    prepare = dict(p.steps[5].bodies)
    # the node's other workers only learn the (unchanged) pins: nothing of theirs moves
    for other in set(prepare) - {w.worker_id, new}:
        body = prepare[other]
        assert (body["out"], body["in"], body["keys_out"], body["keys_in"]) == ({}, {}, {}, {})
        assert "operator_out" not in body and "operator_in" not in body
    groups = {str(g) for g in owned_groups(topo, phys, "count", w.worker_id)}
    assert prepare[w.worker_id]["out"] == dict.fromkeys(groups, new)
    assert prepare[new]["in"] == dict.fromkeys(groups, w.worker_id)
    assert prepare[w.worker_id]["operator_out"] == new
    assert prepare[new]["operator_in"] == w.worker_id
    sources = {x.worker_id for x in phys.of_node("source")}
    assert {s for s, _ in prepare[w.worker_id]["expect"]} == sources
    routing = p.steps[6].bodies
    assert {wid for wid, _ in routing} == sources
    assert all(b["handoff"] and new in b["next_hops"] for _, b in routing)
    assert all(w.worker_id not in b["next_hops"] for _, b in routing)
    release = p.steps[9].bodies
    assert all(b["release"] == [w.worker_id] for _, b in release)


def test_a_shuffled_stateful_worker_moves_its_operator_state_without_key_groups():
    topo = load_topology_text(SHUFFLED)
    phys = schedule(topo, HOSTS, 3, first_port=10)
    w = phys.active_of_node("count")[0]
    p = plan(Move(w.worker_id, other_host(phys, w.worker_id)), topo, phys, HOSTS, 10)
    (new,) = p.added
    prepare = dict(next(s for s in p.steps if s.control == "KEYGROUPS").bodies)
    assert prepare[w.worker_id]["out"] == {} and prepare[w.worker_id]["operator_out"] == new
    assert prepare[new]["in"] == {} and prepare[new]["operator_in"] == w.worker_id


@pytest.mark.parametrize(
    ("pick", "host", "status", "words"),
    [
        (lambda p: 99, "h2", 404, "'mig' has no worker 99 (workers: 1, 2, "),
        (lambda p: p.active_of_node("count")[0].worker_id, "h9", 404, "no host named 'h9'"),
        (lambda p: p.active_of_node("count")[0].worker_id, None, 400, "already runs on"),
        (lambda p: p.of_node("source")[0].worker_id, "other", 400, "belongs to the spout"),
    ],
)
def test_moves_that_cannot_be_done_are_refused_with_a_sentence(pick, host, status, words):
    topo = load_topology_text(JOB)
    phys = schedule(topo, HOSTS, 3, first_port=10)
    worker = pick(phys)
    if host is None:
        host = phys.by_id(worker).host
    elif host == "other":
        host = other_host(phys, worker)
    with pytest.raises(ReconfigError) as e:
        plan(Move(worker, host), topo, phys, HOSTS, 10)
    assert e.value.status == status and words in e.value.message, e.value.message


def test_a_finished_worker_and_a_guaranteed_job_are_refused():
    topo = load_topology_text(JOB)
    phys = schedule(topo, HOSTS, 3, first_port=10)
    w = phys.active_of_node("count")[0]
    to = other_host(phys, w.worker_id)
    with pytest.raises(ReconfigError) as e:
        plan(Move(w.worker_id, to), topo, phys, HOSTS, 10, exited={w.worker_id})
    assert e.value.status == 409 and "has finished: nothing to move" in e.value.message
    guaranteed = load_topology_text(
        "name: eo\nconfig: {guarantee: at_least_once}\nspouts:\n"
        "  - {id: source, operator: sequence_source}\nbolts:\n"
        "  - {id: sink, operator: sequence_check}\nstreams:\n"
        "  - {from: source, to: sink, grouping: shuffle}\n"
    )
    phys = schedule(guaranteed, HOSTS, 3, first_port=10)
    w = phys.active_of_node("sink")[0]
    to = other_host(phys, w.worker_id)
    with pytest.raises(ReconfigError) as e:
        plan(Move(w.worker_id, to), guaranteed, phys, HOSTS, 10)
    assert e.value.status == 409 and "runs under guarantee 'at_least_once'" in e.value.message


def test_a_rescale_still_moves_only_the_groups_whose_index_changes():
    """Comparing owners by worker ID (what a move needs) gives a rescale the same moves."""
    topo = load_topology_text(JOB)
    phys = schedule(topo, HOSTS, 3, first_port=10)
    p = plan(Scale("count", 4), topo, phys, HOSTS, 10)
    prepare = dict(next(s for s in p.steps if s.control == "KEYGROUPS").bodies)
    (new,) = [w for w in p.added if p.final.by_id(w).node == "count"]
    old, table = phys.active_of_node("count"), p.final.key_groups["count"]
    for w in old:
        out = prepare.get(w.worker_id, {}).get("out", {})
        assert set(out.values()) <= {new} and "operator_out" not in prepare.get(w.worker_id, {})
        assert {int(g) for g in out} == {
            g for g in owned_groups(topo, phys, "count", w.worker_id) if table[g] == 3
        }


# ----- the model: the move mid-stream ------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_a_keyed_worker_moved_mid_run_keeps_every_running_count_exact(seed):
    net = MoveNet(seed)
    cut = net.rng.randrange(COUNT // 6, COUNT // 2)
    net.run(lambda: net.tuples_into("count") >= cut)
    w = net.phys.active_of_node("count")[seed % 3]
    held = set(net.fws[w.worker_id].keyed.stores["counts"].data)
    groups = set(net.fws[w.worker_id].keyed.owned)
    p = net.reconfigure(Move(w.worker_id, other_host(net.phys, w.worker_id)))
    (new,) = p.added
    old_fw, new_fw = net.fws[w.worker_id], net.fws[new]
    # the old worker holds nothing any more; the new one holds all it had, and its groups
    assert old_fw.done and old_fw.moved_to == new
    assert not old_fw.keyed.stores["counts"].data and not old_fw.keyed.owned
    assert held <= set(new_fw.keyed.stores["counts"].data) and new_fw.keyed.owned == groups
    assert new_fw.hold_from is None and not new_fw.held_rows
    net.run(net.done)
    assert net.maxima() == REFERENCE
    holders = net.holders()
    assert all(len(ws) == 1 for ws in holders.values()), holders
    assert set(holders) == set(REFERENCE)
    assert {k for k, ws in holders.items() if ws == [new]} >= held
    assert old_fw.io.stats.drops.get("moved_away", 0) == 0
    m = new_fw.last_migration
    assert m["in"] == len(groups) and m["keys"] >= len(held)
    # every moved group waited from the first tuple held to the state's arrival
    assert set(m["group_pause_ms"]) == {str(g) for g in groups}
    assert all(p >= 0 for p in m["group_pause_ms"].values())


@pytest.mark.parametrize("seed", range(10))
def test_a_worker_with_operator_state_moved_mid_run_keeps_every_count(seed):
    """count_by_key behind a shuffle: its counts are snapshot() state, which only the
    move's blob carries.  The totals its flushes add up to are the counts exactly: the
    old worker's counts went on at the new one, and neither flushed them twice."""
    net = MoveNet(seed, SHUFFLED)
    cut = net.rng.randrange(COUNT // 6, COUNT // 2)
    net.run(lambda: net.tuples_into("count") >= cut)
    w = net.phys.active_of_node("count")[seed % 3]
    before = dict(net.fws[w.worker_id].op.counts)
    assert sum(before.values()) > 0 or seed % 3 != 0  # the cut is past the first tuples
    p = net.reconfigure(Move(w.worker_id, other_host(net.phys, w.worker_id)))
    (new,) = p.added
    new_fw = net.fws[new]
    assert net.fws[w.worker_id].moved_to == new
    assert all(new_fw.op.counts.get(k, 0) >= n for k, n in before.items())
    net.run(net.done)
    (totals,) = [fw.op for fw in net.fws.values() if fw.node.name == "totals"]
    assert dict(totals.totals) == REFERENCE
    # the run report leaves the moved worker's result out (Worker.report: moved_to)
    results = [
        fw.op.result() for wid, fw in net.fws.items() if fw.node.name == "count" and not fw.moved_to
    ]
    assert BUILTINS["count_by_key"].merge_results(results)["counts"] == REFERENCE
    assert len(results) == 3


def test_without_the_retirement_the_old_worker_flushes_its_moved_counts_twice(monkeypatch):
    """The same move with the old worker flushing at its end as any other: the totals
    count its keys twice (the model tells a retired worker from one that is not)."""
    from typhoon.runtime.framework import Framework as F

    finish = F.finish

    def flushing(self):
        if self.moved_to is not None:
            self.op.on_signal(self.emit)
        finish(self)

    monkeypatch.setattr(F, "finish", flushing)
    net = MoveNet(1, SHUFFLED)
    net.run(lambda: net.tuples_into("count") >= COUNT // 3)
    w = net.phys.active_of_node("count")[1]
    net.reconfigure(Move(w.worker_id, other_host(net.phys, w.worker_id)))
    net.run(net.done)
    (totals,) = [fw.op for fw in net.fws.values() if fw.node.name == "totals"]
    assert sum(totals.totals.values()) > sum(REFERENCE.values())


def test_without_the_operator_state_the_new_worker_starts_from_zero(monkeypatch):
    """The move with the operator's snapshot left out of the blob: the new worker's
    counts start over, and the totals miss what the old worker had counted."""
    real = migration.KeyedMigration._maybe_ship

    def no_operator(self):
        m = self.migration
        if m is not None and m.operator_to is not None and not m.shipped and not m.expect:
            snapshot = self.op.snapshot
            self.op.snapshot = lambda: None
            try:
                real(self)
            finally:
                self.op.snapshot = snapshot
            return
        real(self)

    monkeypatch.setattr(migration.KeyedMigration, "_maybe_ship", no_operator)
    net = MoveNet(2, SHUFFLED)
    net.run(lambda: net.tuples_into("count") >= COUNT // 3)
    w = net.phys.active_of_node("count")[1]
    assert sum(net.fws[w.worker_id].op.counts.values()) > 0
    net.reconfigure(Move(w.worker_id, other_host(net.phys, w.worker_id)))
    net.run(net.done)
    (totals,) = [fw.op for fw in net.fws.values() if fw.node.name == "totals"]
    assert sum(totals.totals.values()) < sum(REFERENCE.values())


def test_data_reaching_a_moved_worker_is_counted_not_processed():
    net = MoveNet(4)
    net.run(lambda: net.tuples_into("count") >= COUNT // 3)
    w = net.phys.active_of_node("count")[0]
    net.reconfigure(Move(w.worker_id, other_host(net.phys, w.worker_id)))
    old = net.fws[w.worker_id]
    source = net.phys.of_node("source")[0].worker_id
    old.upstream.add(source)  # as if a sender had not heard of the move
    old.finished_upstream.discard(source)
    from typhoon.runtime.transport import Inbound
    from typhoon.wire import encode_rows

    before = dict(old.keyed.stores["counts"].data)
    old.deliver(Inbound(source, 1, [encode_rows([["k1"], ["k2"]])]))
    assert old.io.stats.drops["moved_away"] == 2
    assert dict(old.keyed.stores["counts"].data) == before == {}


def test_an_operator_snapshot_with_int_keys_moves_as_it_is():
    net = MoveNet(5, TALLY)
    net.run(lambda: net.tuples_into("tally") >= COUNT // 3)
    w = net.phys.active_of_node("tally")[0]
    before = dict(net.fws[w.worker_id].op.by_len)
    assert before
    p = net.reconfigure(Move(w.worker_id, other_host(net.phys, w.worker_id)))
    assert all(net.fws[p.added[0]].op.by_len[n] >= c for n, c in before.items())
    net.run(net.done)
    live = [fw.op.by_len for fw in net.fws.values() if fw.node.name == "tally" and not fw.moved_to]
    want = collections.Counter(len(k) for k, n in REFERENCE.items() for _ in range(n))
    assert sum(live, collections.Counter()) == want


def test_a_snapshot_that_cannot_travel_fails_the_old_worker_with_a_sentence():
    net = MoveNet(6, TALLY)
    net.run(lambda: net.tuples_into("tally") >= COUNT // 3)
    w = net.phys.active_of_node("tally")[1]
    net.fws[w.worker_id].op.as_set = True
    with pytest.raises(TypeError) as e:
        net.reconfigure(Move(w.worker_id, other_host(net.phys, w.worker_id)))
    assert str(e.value).startswith(
        f"operator 'model_tally' of 'tally' (worker {w.worker_id}) cannot move to worker "
    ) and "snapshot() is not msgpack-able plain data" in str(e.value)


@pytest.mark.parametrize("seed", range(4))
def test_a_worker_holding_keys_a_direct_table_pins_moves_them_all(seed):
    """After a locality-style reroute (a direct table names keys), the moved worker's
    named keys go with it: the new worker is where the table sends them now."""
    from test_keyed_migration import check_ownership

    from typhoon.reconfig import Reroute

    net = MoveNet(seed)
    net.run(lambda: net.tuples_into("count") >= COUNT // 4)
    ids = [w.worker_id for w in net.phys.active_of_node("count")]
    holders = net.holders()
    table = {k: (ids.index(ws[0]) + 1) % len(ids) for k, ws in holders.items()}
    net.reconfigure(Reroute(1, "direct", ("word",), tuple(sorted(table.items()))))
    net.run(lambda: net.tuples_into("count") >= COUNT // 2)
    w = net.phys.active_of_node("count")[1]
    pinned = {k for k, i in table.items() if i == 1}
    assert pinned
    p = net.reconfigure(Move(w.worker_id, other_host(net.phys, w.worker_id)))
    (new,) = p.added
    prepare = dict(next(s for s in p.steps if s.control == "KEYGROUPS").bodies)
    assert set(prepare[w.worker_id]["keys_out"]) == pinned
    assert set(prepare[new]["keys_in"]) == pinned
    assert pinned <= set(net.fws[new].keyed.stores["counts"].data)
    check_ownership(net)
    net.run(net.done)
    assert net.maxima() == REFERENCE
    check_ownership(net)
