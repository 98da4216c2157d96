"""Swap in place of a chained node: the plan (pure: which swaps, which steps, which
refusals fall back to unchaining first), the executor running and undoing it, and a
chain's process in memory cutting a worker's input over from the old operator instance
to the new one with nothing lost, nothing counted twice and its edges still calls."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
from test_chain_ops import HOSTS, three
from test_keyed_swap import Undeclared
from test_unchain import Clock, Loop, Net, paced, turns

from controller.rules.flows import compile_rules
from typhoon.operators import BUILTINS
from typhoon.operators.sources import generate_sentences
from typhoon.operators.swap_rules import in_place_blockers
from typhoon.reconfig import Swap, plan
from typhoon.reconfig.swap_in_place import in_place_refusal, plan_swap_in_place
from typhoon.report import build_report
from typhoon.runtime.chain import ChainWorker
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.worker import Worker
from typhoon.topology import load_topology_text, schedule
from typhoon.topology.chaining import chain_groups
from typhoon.wire import Control, ControlTuple

BUSY = Swap("upper", "busy", {"cost_us": 1})


def actions(p) -> list[str]:
    return [s.action for s in p.steps]


# ----- the plan -----------------------------------------------------------------------------


def test_a_swap_of_a_chained_node_runs_in_place_with_the_same_workers_and_rules():
    from fakeflows import line_cluster

    t, phys = three()  # split -> upper -> lower: processes [3, 5, 7] and [4, 6, 8]
    p = plan(BUSY, t, phys, HOSTS, 100)
    assert actions(p) == ["write", "wait_rules", "control", "commit"]
    swap = p.steps[2]
    assert swap.control == "SWAP" and swap.workers == [5, 6]
    assert swap.bodies == [(w, {"operator": "busy", "args": {"cost_us": 1}}) for w in (5, 6)]
    assert not p.added and not p.removed
    assert p.topology.nodes["upper"].operator == "busy"
    assert t.nodes["upper"].operator == "identity"  # the running topology is not edited
    assert p.physical is p.final and p.final.version == phys.version + 1
    assert p.final.workers == phys.workers and p.final.unchained == phys.unchained == []
    assert chain_groups(p.topology, p.final) == chain_groups(t, phys)
    cluster = line_cluster(2)
    assert repr(compile_rules(p.topology, p.final, cluster)) == repr(
        compile_rules(t, phys, cluster)
    )  # no link, no rule changes: the chain's edges stay function calls


def test_a_worker_that_exited_gets_no_swap_and_a_lone_node_swaps_as_before():
    t, phys = three()
    p = plan(BUSY, t, phys, HOSTS, 100, exited={5})
    assert p.steps[2].bodies == [(6, {"operator": "busy", "args": {"cost_us": 1}})]
    # count runs alone: to an operator without keyed state, new workers, the old ones
    # drain (a keyed swap runs in place: tests/unit/test_keyed_swap.py)
    p = plan(Swap("count", "collect", {}), t, phys, HOSTS, 100)
    assert plan_swap_in_place(Swap("count", "collect", {}), t, phys) is None
    assert len(p.added) == 2 and len(p.removed) == 2


KEYED_HEAD = """
name: keyedhead
spouts:
  - {id: source, operator: sentence_source, args: {count: 10}, parallelism: 2}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: tally, operator: count_by_key, args: {key: word}, parallelism: 2}
  - {id: out, operator: identity, parallelism: 2}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: tally, grouping: {type: fields, fields: [word]}}
  - {from: tally, to: out, grouping: forward}
"""


def _changed(t, node: str, **fields):
    new = copy.deepcopy(t)
    for k, v in fields.items():
        setattr(new.nodes[node], k, v)
    return new


def test_what_cannot_run_in_place_says_why_and_plans_as_before():
    t, phys = three()
    assert in_place_refusal(t, _changed(t, "upper", operator="busy"), phys, "upper") is None
    guaranteed = copy.deepcopy(t)
    guaranteed.config["guarantee"] = "exactly_once"
    assert "guarantee" in in_place_refusal(guaranteed, guaranteed, phys, "upper")
    windowed = _changed(t, "upper", operator="window_aggregate")
    assert "on_watermark" in in_place_refusal(t, windowed, phys, "upper")
    fields = _changed(t, "upper", output_fields=("x",))
    assert "other fields" in in_place_refusal(t, fields, phys, "upper")
    # a chained node with keyed state (the head of its process: its input is key-routed)
    k = load_topology_text(KEYED_HEAD, "k.yaml")
    kp = schedule(k, HOSTS, 5, 100)
    assert any(len(ws) == 2 for ws in chain_groups(k, kp).values())
    assert in_place_refusal(k, k, kp, "tally") is None  # its keyed state is kept
    assert "only one of" in in_place_refusal(k, _changed(k, "tally", keyed=False), kp, "tally")
    BUILTINS["undeclared_count"] = Undeclared
    try:  # a keyed operator that does not declare its keyed_shape
        p = plan(Swap("tally", "undeclared_count", {}), k, kp, HOSTS, 100)
    finally:
        BUILTINS.pop("undeclared_count")
    assert actions(p)[:5] == ["keep_rules", "write", "wait_rules", "control", "keep_rules"]
    assert len(p.added) == 2  # unchained first, new workers alone
    assert in_place_blockers(type("Op", (), {"pump": lambda self: None})) == ["pump"]


# ----- the executor -------------------------------------------------------------------------


def test_the_executor_swaps_in_place_and_undoes_a_swap_that_never_confirms(fwd):
    from test_reconfig_executor import run

    c, m, FakeCore = fwd  # source -> sink forward, one process
    core = FakeCore(c)
    core.sleep(0)
    before = c.get_physical("fwd")
    rec = run(core, m, Swap("sink", "collect", {}))
    assert rec.state == "done", rec.to_dict()
    assert core.sent == [(2, "SWAP", {"operator": "collect", "args": {}, "version": 1000})]
    after = c.get_physical("fwd")
    assert after.workers == before.workers and after.version > before.version
    assert c.get_topology("fwd").nodes["sink"].operator == "collect"
    core.silent = {2}  # the worker never confirms the swap back
    rec = run(core, m, Swap("sink", "sequence_check", {}), timeout=0.2)
    d = rec.to_dict()
    assert rec.state == "rolled_back" and "did not confirm SWAP" in d["error"], d
    assert [r["action"] for r in d["rollback"]] == ["undo SWAP", "undo write"]
    # the undo tells it to go on with what ran before
    assert core.sent[-1][1:] == ("SWAP", {"operator": "collect", "args": {},
                                          "version": core.sent[-1][2]["version"]})  # fmt: skip
    assert c.get_topology("fwd").nodes["sink"].operator == "collect"


# ----- a chain's process in memory ----------------------------------------------------------

TALLY = """
name: tally
spouts:
  - {id: source, operator: sentence_source, args: {count: 300, seed: 3, words: 6,
     vocabulary: 40}, parallelism: 1}
bolts:
  - {id: split, operator: split_words, parallelism: 1}
  - {id: tally, operator: count_by_key, parallelism: 1, stateful: true}
streams:
  - {from: source, to: split, grouping: forward}
  - {from: split, to: tally, grouping: forward}
"""


def run_chain(swaps: dict[int, ControlTuple]):
    """The one process of TALLY (source, split, tally by call) run to its end; at turn
    ``n`` the tally worker gets ``swaps[n]``.  Returns the chain, transports, topology."""
    t = load_topology_text(TALLY, "tally.yaml")
    phys = schedule(t, ["h1"], 5, 100)
    (ws,) = chain_groups(t, phys).values()
    net = Net()
    ios: dict[int, Loop] = {}
    specs = [WorkerSpec(t, phys, w, batch_size=4) for w in ws]
    cw = ChainWorker(specs, Worker, lambda s: ios.setdefault(s.worker_id, Loop(net, s.worker_id)))
    clock = Clock()
    paced(cw)
    for n in range(2000):
        if n in swaps:
            ios[ws[2]].inbox.append(swaps[n])
        turns(cw, 1, clock)
        if all(m.fw.done for m in cw.members):
            return cw, ios, t
    raise AssertionError("the chain did not finish")


def reference(t) -> dict[str, int]:
    a = t.nodes["source"].args
    want: Counter[str] = Counter()
    for s in generate_sentences(a["count"], a["seed"], a["words"], a["vocabulary"]):
        want.update(s.split())
    return dict(want)


def acked(io, what: str) -> list[int]:
    return [ct.body["request_id"] for ct in io.replies if ct.body["metrics"].get("ack") == what]


def test_a_chained_tally_swapped_in_place_counts_every_word_once_across_the_cut():
    swap = ControlTuple(Control.SWAP, {"version": 9, "operator": "count_by_key",
                                       "args": {"key": "word"}})  # fmt: skip
    cw, ios, t = run_chain({20: swap})
    source, split, tally = cw.members
    assert acked(ios[tally.fw.worker_id], "SWAP") == [9]
    # the worker stayed: same framework, same links, its edges still function calls
    assert all(io.sent_n == {} for io in ios.values()), {w: io.sent_n for w, io in ios.items()}
    assert split.fw.chained == {tally.fw.worker_id: tally.fw}
    assert tally.fw.node.operator == "count_by_key" and tally.fw.node.args == {"key": "word"}
    assert tally.fw.op.key == "word"
    assert t.nodes["tally"].args == {}  # the worker's own copy of its spec changed
    report = tally.report()
    (old,) = report["swapped"]
    assert old["operator"] == "count_by_key" and old["args"] == {}
    total = sum(tally.fw.tuples_in.values())
    assert 0 < old["tuples_in"] < total  # each instance counted some of the words
    counted = sum(old["result"]["counts"].values())
    assert (
        counted == old["tuples_in"] and sum(report["result"]["counts"].values()) == total - counted
    )
    # the run report merges the old instance's result like a drained worker's: exact
    reports = [m.report() for m in cw.members]
    merged = build_report(t, reports)
    assert merged["ok"], merged["problems"]
    assert {k: int(v) for k, v in merged["results"]["tally"]["counts"].items()} == reference(t)
    assert merged["workers"][2]["swapped"][0]["tuples_in"] == old["tuples_in"]


@pytest.mark.parametrize(
    "body,why",
    [
        ({"operator": "no_such_operator"}, "unknown"),
        ({"operator": "window_aggregate"}, "hooks"),
        ({"operator": "busy", "args": {"cost_us": -5}}, "args"),
        ({"operator": "count_by_key", "args": {"key": "nope"}}, "nope"),  # its open() fails
    ],
)
def test_a_swap_the_worker_cannot_do_is_counted_and_never_acked(body, why, caplog):
    cw, ios, t = run_chain({20: ControlTuple(Control.SWAP, {"version": 9, "args": {}, **body})})
    tally = cw.members[2]
    io = ios[tally.fw.worker_id]
    assert acked(io, "SWAP") == [] and io.stats.drops.get("swap_refused") == 1
    assert why in caplog.text
    assert tally.fw.node.operator == "count_by_key" and tally.report()["swapped"] == []
    merged = build_report(t, [m.report() for m in cw.members])
    assert {k: int(v) for k, v in merged["results"]["tally"]["counts"].items()} == reference(t)


def test_the_same_operator_again_is_acked_without_a_cut():
    same = ControlTuple(Control.SWAP, {"version": 4, "operator": "count_by_key", "args": {}})
    cw, ios, _ = run_chain({5: same})
    tally = cw.members[2]
    assert acked(ios[tally.fw.worker_id], "SWAP") == [4] and tally.fw.swapped == []


# ----- the tcp runner -----------------------------------------------------------------------


def test_the_tcp_runner_swaps_a_chained_node_in_place_and_refuses_other_swaps():
    from test_chain_ops import THREE
    from test_tcp_reconfig import FakeCluster

    from typhoon.tcp_reconfig import Rescaler
    from typhoon.tcp_requests import tcp_refusal

    t = load_topology_text(THREE, "three.yaml")
    c = FakeCluster(t)
    before = c.physical
    assert len(chain_groups(t, before)) == 2
    r = Rescaler(c)
    rec = r.request(BUSY)
    assert r.turn(0.0) and rec.state == "done", rec.error
    assert c.log[0] == ("launch", [])  # no worker is launched
    assert [k for k, _ in c.log[1:]] == ["SWAP", "SWAP"] and not rec.added and not rec.removed
    assert c.topology.nodes["upper"].operator == "busy"
    assert c.physical.workers == before.workers and c.physical.version == before.version + 1
    # a lone node without keyed state: a swap on the network needs the sdn controller
    lone = load_topology_text(
        "name: lone\nspouts: [{id: source, operator: sequence_source}]\n"
        "bolts: [{id: sink, operator: sequence_check}]\n"
        "streams: [{from: source, to: sink, grouping: shuffle}]\n"
    )
    assert "sdn controller" in tcp_refusal(lone, Swap("sink", "collect", {}))
    guaranteed = copy.deepcopy(t)
    guaranteed.config["guarantee"] = "at_least_once"
    c = FakeCluster(guaranteed)
    r = Rescaler(c)
    rec = r.request(BUSY)
    assert r.turn(0.0) and rec.state == "refused" and "cannot run in place" in rec.error
    assert c.log == [] and c.topology.nodes["upper"].operator == "identity"
