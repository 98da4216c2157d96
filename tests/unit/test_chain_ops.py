"""Route and insert on a chained edge: the plan unchains the edge live first and keeps its
processes whole (``typhoon.reconfig.chains``); pure planning, the rules, the tcp refusal,
and the executor running and undoing it."""

from __future__ import annotations

import pytest
from test_chaining import topo

from controller.rules.flows import compile_rules
from typhoon.reconfig import Insert, ReconfigError, Reroute, Scale, plan
from typhoon.reconfig.chains import chained_edge
from typhoon.reconfig.requests import Chain, Unchain
from typhoon.topology import schedule
from typhoon.topology.chaining import by_call, chain_groups, inner_edges, plan_chains
from typhoon.topology.model import PhysicalTopology

HOSTS = ["h1", "h2"]


def chained():
    """source -> split -> upper forward: instance 0 (1, 3, 5) is one process on h1,
    instance 1 spans h1 and h2 (2, 4 on h1, 6 on h2) and runs as three."""
    t = topo()
    phys = schedule(t, HOSTS, 5, 100)
    assert chain_groups(t, phys) == {1: [1, 3, 5]}
    assert [w.host for w in phys.workers[:6]] == ["h1"] * 5 + ["h2"]
    return t, phys


def actions(p) -> list[str]:
    return [s.action for s in p.steps]


PRELUDE = ["keep_rules", "write", "wait_rules", "control", "keep_rules"]


def test_a_route_on_a_chained_edge_unchains_it_first_and_keeps_the_processes():
    t, phys = chained()
    p = plan(Reroute("split->upper", "shuffle"), t, phys, HOSTS, 100)
    assert actions(p)[:6] == [*PRELUDE, "write"]
    assert p.old_physical is phys  # a rollback writes back what ran before
    first = p.steps[1].physical
    assert first is not None and p.steps[1].topology is None  # the topology stays
    assert first.version == phys.version + 1 and first.workers == phys.workers
    assert first.unchained == [5] and first.kept_chains == [[1, 3, 5]]
    ctl = p.steps[3]
    assert (ctl.control, ctl.bodies) == ("CHAIN", [(3, {"receiver": 5, "chained": False})])
    assert p.steps[4].physical is first and p.steps[4].topology is t  # its rules kept
    # the new topology no longer chains split -> upper, the processes stay as they ran
    assert [s.grouping.type for s in p.topology.streams][:2] == ["forward", "shuffle"]
    assert p.physical.version == first.version + 1
    for phys_after in (p.physical, p.final):
        assert chain_groups(p.topology, phys_after) == {1: [1, 3, 5]}
        assert phys_after.unchained == [5]
    # no process forms from running workers either: 2 and 4 (one host) stay apart
    assert p.final.kept_chains == [[1, 3, 5], [2], [4]]
    assert not p.added and not p.removed
    # the split workers route to both upper workers, 3 -> 5 on the network now
    routing = [b for s in p.steps if s.control == "ROUTING" for _, b in s.bodies]
    assert {tuple(b["next_hops"]) for b in routing} == {(5, 6)}
    assert 5 not in by_call(p.topology, p.final) and by_call(p.topology, p.final)[3] == 1
    assert p.final.to_dict()["kept_chains"] == p.final.kept_chains
    assert PhysicalTopology.from_dict(p.final.to_dict()).kept_chains == p.final.kept_chains


def test_the_unchained_edge_has_rules_from_the_first_write_to_the_end():
    from fakeflows import line_cluster

    t, phys = chained()
    cluster = line_cluster(2)
    p = plan(Reroute("split->upper", "shuffle"), t, phys, HOSTS, 100)

    def links(topology, physical) -> str:
        return repr(sorted(map(repr, compile_rules(topology, physical, cluster)["h1"])))

    before = links(t, phys)
    first = links(t, p.steps[1].physical)
    assert first != before  # 3 -> 5 (and its grants) got rules
    assert links(p.topology, p.final) != before


def test_an_insert_on_a_chained_edge_unchains_it_and_the_newcomers_run_alone():
    t, phys = chained()
    p = plan(Insert("mid", "identity", "split", "upper", parallelism=2), t, phys, HOSTS, 100)
    assert actions(p)[:6] == [*PRELUDE, "write"]
    assert p.steps[3].bodies == [(3, {"receiver": 5, "chained": False})]
    mids = [w.worker_id for w in p.final.of_node("mid")]
    assert p.added == mids
    # mid -> upper is forward with equal parallelism: chainable, but upper's workers are
    # running in their processes, so no newcomer joins one
    assert ["mid", "upper"] in plan_chains(p.topology)
    assert chain_groups(p.topology, p.final) == {1: [1, 3, 5]}
    # the senders release the upper workers they dropped, on the network (rules kept)
    release = [b for s in p.steps if s.control == "ROUTING" for _, b in s.bodies if "release" in b]
    assert sorted(r for b in release for r in b["release"]) == [5, 6]
    kept = [s for s in p.steps if s.action == "keep_rules"]
    assert kept[-1].physical is not None and kept[-1].physical.unchained == [5]


def test_an_edge_already_unchained_needs_no_chain_tuple_and_chaining_a_kept_pair_is_refused():
    t, phys = chained()
    off = plan(Unchain("upper"), t, phys, HOSTS, 100).physical
    p = plan(Reroute("split->upper", "shuffle"), t, off, HOSTS, 100)
    assert [s.action for s in p.steps][:4] == ["keep_rules", "write", "wait_rules", "keep_rules"]
    # after the route split -> upper is no chained edge: nothing to chain again there,
    # while source -> split (still forward, in the kept process) is one
    assert inner_edges(p.topology, p.final, "upper") == []
    with pytest.raises(ReconfigError, match="runs in no chain process") as e:
        plan(Chain("upper"), p.topology, p.final, HOSTS, 100)
    assert e.value.status == 409
    assert inner_edges(p.topology, p.final, "split") == [(1, 3)]
    # a route back to forward may chain it again later (the pair is in one process)
    back = plan(Reroute("split->upper", "forward"), p.topology, p.final, HOSTS, 100)
    assert chain_groups(back.topology, back.final) == {1: [1, 3, 5]}
    assert inner_edges(back.topology, back.final, "upper") == [(3, 5)]
    assert back.final.unchained == [5]
    again = plan(Chain("upper"), back.topology, back.final, HOSTS, 100)
    assert again.physical.unchained == []


def test_other_updates_or_a_missing_stream_plan_as_before():
    t, phys = chained()
    assert chained_edge(Reroute("upper->count", "shuffle"), t) is None
    p = plan(Scale("count", 4), t, phys, HOSTS, 100)
    assert p.steps[1].physical is None and p.final.kept_chains == []
    with pytest.raises(ReconfigError, match="no stream") as e:
        plan(Reroute("count->upper", "shuffle"), t, phys, HOSTS, 100)
    assert e.value.status == 404
    assert chained_edge(Insert("m", "identity", "source", "split"), t) == ("source", "split")


def test_tcp_runs_a_direct_route_of_a_chained_edge_too():
    """It unchains the edge first there as well (tests/unit/test_tcp_unchain.py)."""
    from typhoon.tcp_requests import tcp_refusal

    t, _ = chained()
    assert tcp_refusal(t, Reroute("split->upper", "direct")) is None
    assert tcp_refusal(t, Reroute("upper->count", "direct")) is None


# ----- through the executor -------------------------------------------------------------------


class _NoRouting:
    """Mixin: workers never acknowledge ROUTING (the update times out and is undone)."""

    def send_control(self, app, worker_ids, ct):
        if ct.type.name == "ROUTING":
            for w in worker_ids:
                self.sent.append((w, ct.type.name, ct.body))
            return len(worker_ids)
        return super().send_control(app, worker_ids, ct)


def test_the_executor_routes_a_chained_edge_after_unchaining_it(fwd):
    from test_reconfig_executor import run

    c, m, FakeCore = fwd
    core = FakeCore(c)
    core.sleep(0)
    rec = run(core, m, Reroute("source->sink", "shuffle"))
    assert rec.state == "done", rec.to_dict()
    assert [(w, k) for w, k, _ in core.sent][:1] == [(1, "CHAIN")]
    physical = c.get_physical("fwd")
    assert physical.unchained == [2] and physical.kept_chains == [[1, 2]]
    assert c.get_topology("fwd").streams[0].grouping.type == "shuffle"
    assert core.kept == {}


def test_the_executor_undoes_the_unchaining_when_the_route_fails(fwd):
    from test_reconfig_executor import run

    c, m, FakeCore = fwd
    core = type("Core", (_NoRouting, FakeCore), {})(c)
    core.sleep(0)
    rec = run(core, m, Reroute("source->sink", "shuffle"), timeout=0.2)
    d = rec.to_dict()
    assert rec.state == "rolled_back" and "did not confirm ROUTING" in d["error"], d
    assert [r["action"] for r in d["rollback"]] == [
        "undo ROUTING", "undo write", "undo kept_rules", "undo CHAIN", "undo write",
        "undo kept_rules",
    ]  # fmt: skip
    # the routes' undo is not acked either (ROUTING never is here); the rest is done
    assert all(r["state"] == "done" for r in d["rollback"][1:]), d["rollback"]
    chain_tuples = [b for _, k, b in core.sent if k == "CHAIN"]
    assert [b["chained"] for b in chain_tuples] == [False, True]  # unchained, then back
    physical = c.get_physical("fwd")
    assert physical.unchained == [] and physical.kept_chains == []
    assert c.get_topology("fwd").streams[0].grouping.type == "forward"
    assert core.kept == {}


# ----- move of a worker that shares its process ---------------------------------------------


def test_a_chained_worker_moves_out_of_its_process_with_both_edges_unchained_first():
    from typhoon.reconfig import Move

    t, phys = chained()
    p = plan(Move(3, "h2"), t, phys, HOSTS, 100)  # split 0, between source 0 and upper 0
    assert actions(p)[:6] == [*PRELUDE, "write"]
    first = p.steps[1].physical
    assert first.unchained == [3, 5] and first.kept_chains == [[1, 3, 5]]
    assert p.steps[3].bodies == [
        (1, {"receiver": 3, "chained": False}),
        (3, {"receiver": 5, "chained": False}),
    ]
    (new,) = p.added
    assert p.removed == [3] and p.final.by_id(new).host == "h2"
    # the process goes on with its other two workers; the newcomer runs alone
    assert chain_groups(p.topology, p.final) == {1: [1, 5]}
    assert new not in {w for ws in chain_groups(p.topology, p.final).values() for w in ws}
    assert [s.action for s in p.steps][-5:] == [
        "drain", "write_final", "wait_stopped", "drop_rules", "wait_rules"
    ]  # fmt: skip
    # the head here is a spout, which does not move at run time (check_move)
    with pytest.raises(ReconfigError, match="spout"):
        plan(Move(1, "h2"), t, phys, HOSTS, 100)


def test_the_tail_of_a_process_moves_and_a_lone_worker_moves_as_before():
    from typhoon.reconfig import Move

    t, phys = chained()
    p = plan(Move(5, "h2"), t, phys, HOSTS, 100)  # upper 0, the tail of (1, 3, 5)
    assert p.steps[3].bodies == [(3, {"receiver": 5, "chained": False})]
    assert chain_groups(p.topology, p.final) == {1: [1, 3]}
    lone = plan(Move(6, "h1"), t, phys, HOSTS, 100)  # upper 1 runs alone (its instance spans)
    assert lone.steps[1].physical is None  # nothing to unchain
    # 2 and 4 run apart on h1: the newcomer on h1 completes no instance with them
    assert lone.final.kept_chains == [[2], [4]]
    assert chain_groups(lone.topology, lone.final) == {1: [1, 3, 5]}


def test_check_groups_refuses_a_worker_leaving_by_call_or_a_newcomer_joining():
    from typhoon.reconfig.chains import check_groups

    t, phys = chained()
    staying = PhysicalTopology(
        phys.name, phys.app_id, [w for w in phys.workers if w.worker_id != 5]
    )
    with pytest.raises(ReconfigError, match="split or form") as e:
        check_groups((t, phys), (t, staying))  # 3 -> 5 is a function call still
    assert e.value.status == 409
    staying.unchained, staying.kept_chains = [5], [[1, 3, 5]]
    check_groups((t, phys), (t, staying))  # on the network: 5 may leave
    joined = PhysicalTopology(phys.name, phys.app_id, list(staying.workers))
    joined.kept_chains = [[1, 3, 99]]
    joined.workers.append(type(phys.workers[0])(99, "upper", 0, "h1", 150))
    with pytest.raises(ReconfigError, match="split or form"):
        check_groups((t, phys), (t, joined))


# ----- swap and remove of a chained node ------------------------------------------------------

THREE = """
name: three
config: {placement: spread}
spouts:
  - {id: source, operator: sentence_source, args: {count: 50, seed: 3}, parallelism: 2}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: upper, operator: identity, parallelism: 2}
  - {id: lower, operator: identity, parallelism: 2}
  - {id: count, operator: count_by_key, args: {key: word}, parallelism: 2}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: upper, grouping: forward}
  - {from: upper, to: lower, grouping: forward}
  - {from: lower, to: count, grouping: {type: fields, fields: [word]}}
"""


def three():
    from typhoon.topology import load_topology_text

    t = load_topology_text(THREE, "three.yaml")
    phys = schedule(t, HOSTS, 5, 100)
    assert chain_groups(t, phys) == {3: [3, 5, 7], 4: [4, 6, 8]}
    return t, phys


def test_a_swap_under_a_guarantee_unchains_its_edges_and_its_new_workers_run_alone():
    """A swap that cannot run in place (here: checkpoints; test_swap_in_place.py has the
    swap in place) unchains the node's edges first and starts new workers."""
    from typhoon.reconfig import Swap

    t, phys = three()
    t.config["guarantee"] = "at_least_once"
    p = plan(Swap("upper", "busy", {"cost_us": 1}), t, phys, HOSTS, 100)
    assert actions(p)[:6] == [*PRELUDE, "write"]
    assert p.steps[1].physical.unchained == [5, 6, 7, 8]
    assert sorted(p.steps[3].bodies) == [
        (3, {"receiver": 5, "chained": False}), (4, {"receiver": 6, "chained": False}),
        (5, {"receiver": 7, "chained": False}), (6, {"receiver": 8, "chained": False}),
    ]  # fmt: skip
    assert p.removed == [5, 6] and len(p.added) == 2
    # split and lower go on in their processes; the new upper workers run alone
    assert chain_groups(p.topology, p.final) == {3: [3, 7], 4: [4, 8]}
    assert p.physical.unchained == [5, 6, 7, 8]  # the leavers' too while they drain
    assert p.final.unchained == [7, 8]


def test_a_remove_of_a_chained_node_splices_its_neighbours_in_their_process():
    from typhoon.reconfig import Remove

    t, phys = three()
    p = plan(Remove("upper"), t, phys, HOSTS, 100)
    assert actions(p)[:6] == [*PRELUDE, "write"]
    assert [(s.src, s.dst, s.grouping.type) for s in p.topology.streams][1] == (
        "split", "lower", "forward"
    )  # fmt: skip
    # split -> lower is chainable, in one process, but on the network (lower unchained)
    assert chain_groups(p.topology, p.final) == {3: [3, 7], 4: [4, 8]}
    assert inner_edges(p.topology, p.final, "lower") == [(3, 7), (4, 8)]
    assert 7 not in by_call(p.topology, p.final)
    routing = [b for s in p.steps if s.control == "ROUTING" for w, b in s.bodies if w in (3, 4)]
    assert {tuple(b["next_hops"]) for b in routing} == {(7,), (8,)}
    # and `typhoon chain` makes it a function call again
    again = plan(Chain("lower"), p.topology, p.final, HOSTS, 100)
    assert [b for _, b in again.steps[3].bodies] == [
        {"receiver": 7, "chained": True}, {"receiver": 8, "chained": True}
    ]  # fmt: skip
