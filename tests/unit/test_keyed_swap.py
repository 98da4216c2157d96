"""Swap in place of a node with keyed state: the shape rules (pure), the plan (in place
whether chained or not, a refusal when the state cannot go over, the fallbacks), the
tcp runner, and real framework layers on an in-memory network swapping a running max
mid-run with the state kept (every row exact against the source's generator)."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import pytest
from model_net import SeededNet
from running_max_check import check_swapped_running_max, swap_job
from test_chain_ops import HOSTS, three

from typhoon.operators import BUILTINS
from typhoon.operators.keyed import keyed_tuple
from typhoon.operators.running import MaxAndPrev, RunningCount, RunningMax
from typhoon.operators.sinks import CountByKey
from typhoon.operators.swap_rules import carry_refusal, keyed_carry
from typhoon.reconfig import ReconfigError, Swap, plan
from typhoon.reconfig.swap_in_place import plan_swap_in_place
from typhoon.topology import load_topology_text
from typhoon.topology.scheduler import schedule
from typhoon.wire import Control, ControlTuple


class PairMax(RunningMax):
    """Keeps ``max`` as ``[max, seen]`` pairs, and migrates a plain maximum to one."""

    @classmethod
    def state_shape(cls, args: dict[str, Any]) -> dict[str, str]:
        return {"max": "[max, seen]"}

    @classmethod
    def migrate_keyed(cls, args: dict[str, Any], name: str, tag: str) -> Any:
        if (name, tag) == ("max", "largest value"):
            return lambda v: [v, 0]
        return None

    def open(self, context: Any) -> None:
        super().open(context)
        self.maxima = context.keyed_state("max", default=None)

    def process(self, values: list, emit: Any) -> None:
        k, v = self.key_of(values), values[self.index]
        pair = self.maxima.get(k) or [v, 0]
        pair = [max(pair[0], v), pair[1] + 1]
        self.maxima[k] = pair
        emit([*values, pair[0], pair[1]])


class Undeclared(RunningCount):
    keyed_shape: ClassVar[dict[str, str] | None] = None


def carry(a: tuple, b: tuple):
    return keyed_carry(a, b)


# ----- the shape rules (pure) ---------------------------------------------------------------


def test_same_shape_is_kept_and_a_new_mapping_starts_empty():
    c = carry(("running_max", RunningMax, {}), ("running_max", RunningMax, {"count": True}))
    assert c is not None and c.kept == ["max"] and c.added == ["count"] and not c.migrated
    assert carry_refusal(c, "running_max", "running_max") is None
    same = carry(("count_by_key", CountByKey, {}), ("count_by_key", CountByKey, {"key": "w"}))
    assert same.kept == ["counts", "flushed"] and not same.added and not same.dropped


def test_a_mapping_dropped_or_misread_is_refused_in_one_sentence():
    back = carry(("running_max", RunningMax, {"count": True}), ("running_max", RunningMax, {}))
    assert back.dropped == ["count"] and back.refusal is None
    why = carry_refusal(back, "running_max", "running_max")
    assert why == (
        "operator 'running_max' does not keep keyed state ['count'] that 'running_max' "
        "keeps, so the swap would drop it"
    )
    to_counts = carry(("count_by_key", CountByKey, {}), ("running_count", RunningCount, {}))
    assert "['flushed']" in carry_refusal(to_counts, "count_by_key", "running_count")
    # the same name in another form, and no migration declared
    other = carry(("pair_max", PairMax, {}), ("running_max", RunningMax, {}))
    assert other.refusal == (
        "operator 'running_max' keeps keyed state 'max' as 'largest value' where 'pair_max' "
        "kept it as '[max, seen]', and declares no migration from it (migrate_keyed)"
    )


def test_a_declared_migration_rewrites_the_values_and_an_undeclared_shape_says_nothing():
    c = carry(("running_max", RunningMax, {}), ("pair_max", PairMax, {}))
    assert c.refusal is None and sorted(c.migrated) == ["max"] and c.kept == []
    assert c.migrated["max"](7) == [7, 0]
    assert carry(("running_count", RunningCount, {}), ("undeclared", Undeclared, {})) is None


# ----- the plan -----------------------------------------------------------------------------


def test_a_keyed_node_running_alone_swaps_in_place_with_its_workers():
    t, phys = three()  # count (count_by_key by word, key-routed) runs alone
    swap = Swap("count", "count_by_key", {})
    p = plan(swap, t, phys, HOSTS, 100)
    assert [s.action for s in p.steps] == ["write", "wait_rules", "control", "commit"]
    step = p.steps[2]
    ids = [w.worker_id for w in phys.of_node("count")]
    assert step.control == "SWAP" and step.workers == ids and "keyed state" in step.what
    assert not p.added and not p.removed and p.final.workers == phys.workers
    assert plan_swap_in_place(swap, t, phys) is not None


def test_a_keyed_swap_that_would_drop_state_is_refused_and_the_rest_falls_back():
    t, phys = three()
    with pytest.raises(ReconfigError) as e:
        plan(Swap("count", "running_count", {}), t, phys, HOSTS, 100)
    assert e.value.status == 409 and "drop" in e.value.message and "'count'" in e.value.message
    # an operator without keyed state: new workers, the old ones drain with theirs (before)
    p = plan(Swap("count", "collect", {}), t, phys, HOSTS, 100)
    assert len(p.added) == 2 and len(p.removed) == 2
    # an undeclared shape: the same
    BUILTINS["undeclared_count"] = Undeclared
    try:
        p = plan(Swap("count", "undeclared_count", {}), t, phys, HOSTS, 100)
        assert len(p.added) == 2 and len(p.removed) == 2
    finally:
        BUILTINS.pop("undeclared_count")
    # under a guarantee: keyed state that goes over swaps in place (a recovery carries a
    # checkpoint of before the swap to the new operator); the rest as before
    g = copy.deepcopy(t)
    g.config["guarantee"] = "exactly_once"
    p = plan(Swap("count", "count_by_key", {}), g, phys, HOSTS, 100)
    assert not p.added and [s.action for s in p.steps][2] == "control"
    p = plan(Swap("count", "collect", {}), g, phys, HOSTS, 100)
    assert len(p.added) == 2 and len(p.removed) == 2


def test_a_checkpoint_of_before_a_swap_is_restored_into_the_new_operator():
    import msgpack

    from typhoon.runtime.keyed_state import KeyedStateError
    from typhoon.runtime.operator_swap import carried_keyed, part_carry

    t = load_topology_text(JOB, "kswap.yaml")
    node = copy.deepcopy(t.nodes["rmax"])
    keyed = msgpack.packb({"max": [["k1", 5], ["k2", 9]]}, use_bin_type=True)
    part = {"operator": ["running_max", {}], "keyed": keyed}
    assert part_carry(node, part) is None and carried_keyed(node, part) is keyed  # today's
    node.args = {"count": True}  # swapped since: max kept, count starts empty
    assert part_carry(node, part).added == ["count"] and carried_keyed(node, part) is keyed
    BUILTINS["pair_max"] = PairMax
    try:
        node.operator, node.args = "pair_max", {}  # swapped to a migrating operator
        assert carried_keyed(node, part) == {"max": [["k1", [5, 0]], ["k2", [9, 0]]]}
        back = {"operator": ["pair_max", {}], "keyed": keyed}
        node.operator = "running_max"
        with pytest.raises(KeyedStateError, match="taken under operator 'pair_max'"):
            carried_keyed(node, back)
    finally:
        BUILTINS.pop("pair_max")


def test_the_tcp_runner_swaps_a_keyed_node_in_place_and_refuses_a_drop():
    from test_chain_ops import THREE
    from test_tcp_reconfig import FakeCluster

    from typhoon.tcp_reconfig import Rescaler
    from typhoon.tcp_requests import tcp_refusal

    t = load_topology_text(THREE, "three.yaml")
    assert tcp_refusal(t, Swap("count", "count_by_key", {})) is None
    c = FakeCluster(t)
    r = Rescaler(c)
    rec = r.request(Swap("count", "count_by_key", {}))
    assert r.turn(0.0) and rec.state == "done", rec.error
    assert [k for k, _ in c.log[1:]] == ["SWAP", "SWAP"] and not rec.added
    assert c.topology.nodes["count"].args == {}
    rec = r.request(Swap("count", "running_count", {}))
    assert r.turn(0.0) and rec.state == "refused" and "would drop it" in rec.error
    assert c.topology.nodes["count"].operator == "count_by_key"


# ----- real framework layers, in memory -----------------------------------------------------

SEED, KEYS, COUNT, SIZE = 5, 12, 900, 4
JOB = swap_job("kswap", SEED, KEYS, COUNT, SIZE)


def swap_midrun(seed: int, *bodies: dict, at: int = COUNT // 3, job: str = JOB) -> SeededNet:
    """``job`` on a seeded in-memory network; SWAP each of ``bodies`` to every ``rmax``
    worker once they took ``at`` tuples between them, then to the end."""
    net = SeededNet(job, seed)
    ws = [net.fws[w.worker_id] for w in net.phys.of_node("rmax")]
    net.run(until=lambda: sum(sum(fw.tuples_in.values()) for fw in ws) >= at)
    for i, body in enumerate(bodies):
        for fw in ws:
            fw.control(ControlTuple(Control.SWAP, {"version": 3 + i, **body}))
    net.run()
    return net


@pytest.mark.parametrize("seed", range(6))
def test_a_running_max_swapped_mid_run_goes_on_from_its_keyed_state(seed):
    net = swap_midrun(seed, {"operator": "running_max", "args": {"count": True}})
    got = check_swapped_running_max(net.results("sink"), SEED, KEYS, COUNT, SIZE)
    assert got.old_rows and got.new_rows and got.keys_cut and got.carried, got
    for w in net.phys.of_node("rmax"):
        fw = net.fws[w.worker_id]
        (old,) = fw.swapped
        assert "result" not in old  # its state is the new instance's: not counted twice
        assert old["keyed"]["kept"] == ["max"] and old["keyed"]["added"] == ["count"]
        assert fw.node.args == {"count": True} and fw.keyed.operator == "running_max"


MAX_AND_PREV = JOB.replace("operator: running_max", "operator: max_and_prev")
assert MAX_AND_PREV != JOB


def test_max_and_prev_swaps_in_place_and_only_to_an_operator_that_keeps_its_peaks():
    t = load_topology_text(MAX_AND_PREV, "kswap.yaml")
    phys = schedule(t, HOSTS, 3)
    same = {"value": "value"}  # the default, spelt out: the same logic, a swap nonetheless
    p = plan(Swap("rmax", "max_and_prev", same), t, phys, HOSTS, 100)
    assert not p.added and not p.removed and p.steps[2].control == "SWAP"
    to = carry(("max_and_prev", MaxAndPrev, {}), ("running_max", RunningMax, {}))
    assert to.dropped == ["peaks"] and "['peaks']" in carry_refusal(to, "a", "b")
    back = carry(("running_max", RunningMax, {}), ("max_and_prev", MaxAndPrev, {}))
    assert back.added == ["peaks"] and "['max']" in carry_refusal(back, "a", "b")


@pytest.mark.parametrize("seed", range(3))
def test_a_max_and_prev_swapped_mid_run_goes_on_from_each_keys_max_and_last(seed):
    body = {"operator": "max_and_prev", "args": {"value": "value"}}  # the default spelt out
    net = swap_midrun(seed, body, job=MAX_AND_PREV)
    rows = net.results("sink")
    assert sorted(r[1] for r in rows) == list(range(COUNT))
    peaks: dict[str, list[int]] = {}
    for key, seq, value, pad, mx, prev in sorted(rows, key=lambda r: r[1]):
        assert [key, seq, value, pad] == keyed_tuple(SEED, seq, KEYS, "p" * SIZE)
        was = peaks.get(key)  # the max so far and the last value, across the cut
        assert [mx, prev] == ([value, -1] if was is None else [max(was[0], value), was[1]])
        peaks[key] = [mx, value]
    swapped = [net.fws[w.worker_id].swapped for w in net.phys.of_node("rmax")]
    assert all(len(s) == 1 and "result" not in s[0] for s in swapped), swapped
    assert all(s[0]["keyed"]["kept"] == ["peaks"] for s in swapped), swapped
    assert sum(s[0]["keyed"]["keys"] for s in swapped) > 0, swapped  # keys at the cut


def test_a_declared_migration_runs_at_the_cut():
    BUILTINS["pair_max"] = PairMax
    try:
        net = swap_midrun(1, {"operator": "pair_max", "args": {}})
    finally:
        BUILTINS.pop("pair_max")
    rows = net.results("sink")
    assert len(rows) == COUNT and len({r[1] for r in rows}) == COUNT
    best: dict[str, int] = {}
    new = 0
    for key, _, value, _, mx, n in rows:  # the max goes on through the migrated pairs
        best[key] = max(best.get(key, value), value)
        assert mx == best[key], (key, mx, best[key])
        new += n is not None
    assert 0 < new < COUNT
    for w in net.phys.of_node("rmax"):
        fw = net.fws[w.worker_id]
        assert fw.swapped[0]["keyed"]["migrated"] == ["max"]
        assert all(type(v) is list for v in fw.keyed.stores["max"].data.values())


def test_a_worker_refuses_a_swap_that_would_misread_its_state():
    BUILTINS["pair_max"] = PairMax
    try:  # the second SWAP (forced: the plan refuses it) has no migration back
        net = swap_midrun(2, {"operator": "pair_max", "args": {}},
                          {"operator": "running_max", "args": {}})  # fmt: skip
    finally:
        BUILTINS.pop("pair_max")
    for w in net.phys.of_node("rmax"):
        fw = net.fws[w.worker_id]
        assert fw.node.operator == "pair_max" and fw.io.stats.drops.get("swap_refused") == 1
    assert len({r[1] for r in net.results("sink")}) == COUNT


class SnapMax(RunningMax):
    """A running max with state of its own besides its keyed state."""

    def snapshot(self) -> Any:
        return {"seen": 1}


def test_under_a_guarantee_a_worker_swaps_keyed_state_only():
    from types import SimpleNamespace

    from typhoon.runtime.keyed_state import KeyedStates
    from typhoon.runtime.operator_swap import swap_operator

    t = load_topology_text(JOB, "kswap.yaml")
    keyed = KeyedStates("running_max", "rmax", 2, [0], 128, set(range(128)))

    def host(op: Any) -> Any:
        return SimpleNamespace(
            node=t.nodes["rmax"], done=False, op=op, is_spout=False, moved_to=None,
            migration=None, keyed=keyed, ckpt=object(),
        )  # fmt: skip

    why = swap_operator(host(SnapMax()), "running_max", {"count": True})
    assert why == "its operator keeps state that is not keyed, under a guarantee"
    why = swap_operator(host(RunningMax()), "collect", {})
    assert why == "keyed state would be dropped or started empty (only one operator keeps it)"
    lone = host(RunningMax())
    lone.keyed = None  # no keyed state here: the swap would hand over the snapshot
    assert "under a guarantee" in swap_operator(lone, "running_max", {"count": True})
