"""Keyed state (typhoon.runtime.keyed_state) and key groups (typhoon.topology.keygroups).

The mapping's semantics, ownership errors naming the operator and the key,
routing and ownership computed by one hash so they always agree, checkpoints
and rollback of keyed state through the real framework layer, and state that
msgpack cannot carry failing with the operator, key and type named.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from typhoon.operators import BUILTINS, Bolt, resolve_operator
from typhoon.runtime.framework import Framework
from typhoon.runtime.keyed_state import KeyedStateError, KeyedStates, KeyNotOwned, keyed_states
from typhoon.runtime.policies import Router
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound, Transport
from typhoon.topology import load_topology_text, schedule
from typhoon.topology.keygroups import (
    default_table,
    key_group,
    max_parallelism,
    moves,
    owners,
    rebalance,
    table_of,
)
from typhoon.topology.routing import routes_for
from typhoon.topology.schema import TopologyError
from typhoon.wire import encode_rows

RUNNING = """
name: running
config: {{guarantee: {guarantee}, checkpoint_interval_ms: 1000}}
spouts:
  - id: source
    operator: sentence_source
    args: {{count: 50, seed: 3, words: 4, vocabulary: 40}}
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: count
    operator: running_count
    parallelism: 3
    config: {{max_parallelism: 16}}
  - id: max
    operator: max_by_key
    parallelism: 2
streams:
  - {{from: source, to: split, grouping: shuffle}}
  - {{from: split, to: count, grouping: {{type: fields, fields: [word]}}}}
  - {{from: count, to: max, grouping: {{type: fields, fields: [key]}}}}
"""


def states(groups: int = 8, owned: set[int] | None = None, width: int = 1) -> KeyedStates:
    return KeyedStates(
        "running_count",
        "count",
        7,
        list(range(width)),
        groups,
        set(range(groups)) if owned is None else owned,
    )


# ----- the mapping ------------------------------------------------------------------------


def test_missing_keys_read_as_the_default_and_a_callable_default_is_stored():
    ks = states()
    counts = ks.state("counts", default=0)
    assert counts["a"] == 0 and "a" not in counts
    counts["a"] += 1
    counts["a"] += 1
    assert dict(counts) == {"a": 2} and len(counts) == 1
    lists = ks.state("seen", default=list)
    lists["a"].append(1)
    assert lists["a"] == [1]
    assert ks.state("counts") is counts  # one mapping per name
    del counts["a"]
    assert counts.get("a") is None


def test_a_key_of_another_workers_group_raises_naming_operator_and_key():
    key = "word"
    g = key_group([key], 8)
    ks = states(owned=set(range(8)) - {g})
    counts = ks.state("counts", default=0)
    for touch in (lambda: counts[key], lambda: counts.__setitem__(key, 1), lambda: key in counts):
        with pytest.raises(KeyNotOwned) as e:
            touch()
        msg = str(e.value)
        assert "running_count" in msg and "'count'" in msg and "'word'" in msg
        assert f"key group {g}" in msg


def test_keys_of_several_fields_are_tuples():
    ks = states(width=2)
    counts = ks.state("c", default=0)
    assert ks.key(["x", 3, "ignored"]) == ("x", 3)
    counts[("x", 3)] += 1
    with pytest.raises(KeyNotOwned, match="tuple of 2 values"):
        counts["x"] = 1
    ks2 = states(width=2)
    ks2.state("c", default=0)
    ks2.load(ks.pack())  # msgpack turns the tuple into a list: loaded back as a tuple
    assert dict(ks2.stores["c"]) == {("x", 3): 1}


def test_pack_names_the_operator_key_and_type_msgpack_cannot_carry():
    ks = states()
    ks.state("windows", default=0)["k1"] = {"fine": [1, 2]}
    ks.stores["windows"]["k2"] = {"bad": {1, 2}}
    with pytest.raises(KeyedStateError) as e:
        ks.pack()
    msg = str(e.value)
    assert "running_count" in msg and "'windows'" in msg and "'k2'" in msg and "set" in msg


def test_extract_moves_exactly_the_keys_of_the_groups_asked_for():
    ks = states(groups=16)
    counts = ks.state("counts", default=0)
    for i in range(200):
        counts[f"k{i}"] = i
    moving = {1, 5, 9}
    data = ks.pack(moving, remove=True)
    moved = msgpack.unpackb(data, raw=False)["counts"]
    assert {k for k, _ in moved} == {
        f"k{i}" for i in range(200) if key_group([f"k{i}"], 16) in moving
    }
    assert all(key_group([k], 16) not in moving for k in counts)
    assert len(moved) + len(counts) == 200


# ----- key groups --------------------------------------------------------------------------


@given(st.integers(1, 300), st.integers(1, 40), st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_rebalance_is_balanced_and_moves_only_what_it_must(groups, before, after):
    old = default_table(groups, before)
    new = rebalance(old, after)
    per = collections.Counter(new)
    assert set(new) <= set(range(after))
    assert max(per.values()) - min(per.get(i, 0) for i in range(min(after, groups))) <= 1
    moved = moves(old, new)
    if after == before:
        assert not moved  # a balanced table stays as it is
    elif after > before:
        assert all(b >= before for _, b in moved.values())  # groups go only to newcomers
    else:
        assert all(a >= after for a, _ in moved.values())  # only leavers' groups move


def test_max_parallelism_per_node_then_topology_then_128():
    topo = load_topology_text(RUNNING.format(guarantee="none"))
    assert max_parallelism(topo, "count") == 16
    assert max_parallelism(topo, "max") == 128
    topo.config["max_parallelism"] = 32
    assert max_parallelism(topo, "max") == 32


@given(st.lists(st.text(max_size=6), min_size=1, max_size=60))
@settings(max_examples=50, deadline=None)
def test_routing_and_ownership_agree_for_every_key(words):
    """Every sender routes a key to the one worker whose keyed state accepts it."""
    topo = load_topology_text(RUNNING.format(guarantee="none"))
    phys = schedule(topo, ["h1", "h2"], 3)
    # a table a rescale wrote (not the default), to check the physical table is used
    table = rebalance(default_table(16, 3), 3)[::-1]
    phys.key_groups["count"] = table
    counts = {w.worker_id: keyed_states(topo, phys, w.worker_id) for w in phys.of_node("count")}
    for sender in phys.of_node("split"):
        (route,) = routes_for(topo, phys, sender.worker_id)
        router = Router(route)
        for word in words:
            dst = router.select([word])
            for wid, ks in counts.items():
                c = ks.state("counts", default=0)
                if wid == dst:
                    c[word] += 1
                else:
                    with pytest.raises(KeyNotOwned):
                        c[word] += 1
    assert owners(topo, phys, "count") == [
        phys.active_of_node("count")[i].worker_id for i in table_of(topo, phys, "count")
    ]


def test_a_direct_tables_keys_are_owned_where_the_table_sends_them():
    text = RUNNING.format(guarantee="none").replace(
        "{type: fields, fields: [word]}", '{type: direct, fields: [word], table: {"w1": 2}}'
    )
    topo = load_topology_text(text)
    phys = schedule(topo, ["h1"], 3)
    ws = phys.of_node("count")
    third = keyed_states(topo, phys, ws[2].worker_id)
    third.state("c", default=0)["w1"] += 1  # pinned here whatever its group
    first = keyed_states(topo, phys, ws[0].worker_id)
    with pytest.raises(KeyNotOwned, match="direct grouping"):
        first.state("c", default=0)["w1"] += 1
    (route,) = routes_for(topo, phys, phys.of_node("split")[0].worker_id)
    assert Router(route).select(["w1"]) == ws[2].worker_id


def test_keyed_state_behind_a_shuffle_is_refused_at_load_time():
    text = RUNNING.format(guarantee="none").replace("{type: fields, fields: [key]}", "shuffle")
    with pytest.raises(TopologyError) as e:
        load_topology_text(text, "r.yaml")
    assert str(e.value).startswith("r.yaml:22: stream 'count' -> 'max' uses shuffle grouping")
    assert "max_by_key" in str(e.value)


def test_an_undeclared_operator_calling_keyed_state_fails_with_its_name():
    class Sneaky(Bolt):
        def open(self, context):
            super().open(context)
            context.keyed_state("x")

    topo = load_topology_text(RUNNING.format(guarantee="none"))
    phys = schedule(topo, ["h1"], 3)
    wid = phys.of_node("count")[0].worker_id
    with pytest.raises(TypeError, match="does not declare keyed = True"):
        Framework(WorkerSpec(topo, phys, wid), Sneaky(), Rec())


# ----- through the framework layer ---------------------------------------------------------


class Rec(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list = []

    def poll(self, timeout):
        return []

    def send(self, dst, stream, payloads):
        self.sent.append((dst, stream, list(payloads)))

    def reply(self, ct):
        pass


class Store:
    def __init__(self) -> None:
        self.parts: dict[int, dict[str, bytes]] = {}

    def write(self, epoch, part, data):
        self.parts.setdefault(epoch, {})[part] = data

    def read(self, epoch, part):
        return self.parts[epoch][part]


def count_worker(guarantee: str, store: Any = None, phys: Any = None) -> tuple[Framework, Any]:
    topo = load_topology_text(RUNNING.format(guarantee=guarantee))
    phys = phys or schedule(topo, ["h1"], 3)
    wid = phys.of_node("count")[0].worker_id
    node = topo.nodes["count"]
    fw = Framework(
        WorkerSpec(topo, phys, wid), resolve_operator(node.operator)(), Rec(), store=store
    )
    return fw, phys


def own_words(fw: Framework, n: int) -> list[str]:
    return [w for w in (f"w{i}" for i in range(400)) if fw.keyed.group_of(w) in fw.keyed.owned][:n]


def test_a_checkpoint_carries_keyed_state_and_a_rollback_restores_it():
    store = Store()
    fw, phys = count_worker("exactly_once", store)
    words = own_words(fw, 3)
    split = phys.of_node("split")[0].worker_id
    fw.deliver(Inbound(split, 2, [encode_rows([[w] for w in words + words[:1]])]))
    assert fw.op.counts[words[0]] == 2
    fw._checkpoint(5)
    fw.ckpt.flush()
    fw.deliver(Inbound(split, 2, [encode_rows([[words[0]]] * 5)]))
    assert fw.op.counts[words[0]] == 7
    fw.rollback(1, 5)
    assert dict(fw.op.counts) == {words[0]: 2, words[1]: 1, words[2]: 1}
    # a replacement started from that epoch has the same keyed state
    again, _ = count_worker(
        "exactly_once", store, dataclasses.replace(phys, generation=1, restore_epoch=5)
    )
    assert dict(again.op.counts) == dict(fw.op.counts)


def test_state_msgpack_cannot_carry_fails_the_checkpoint_naming_operator_key_and_type():
    fw, phys = count_worker("exactly_once", Store())
    (word,) = own_words(fw, 1)
    fw.op.counts[word] = object()  # what a buggy operator could store
    with pytest.raises(KeyedStateError) as e:
        fw._checkpoint(1)
    assert "running_count" in str(e.value) and repr(word) in str(e.value)
    assert "object" in str(e.value)


def test_a_tuple_routed_to_the_wrong_worker_fails_loudly():
    fw, phys = count_worker("none")
    other = next(f"w{i}" for i in range(400) if fw.keyed.group_of(f"w{i}") not in fw.keyed.owned)
    split = phys.of_node("split")[0].worker_id
    with pytest.raises(KeyNotOwned, match=repr(other)):
        fw.deliver(Inbound(split, 2, [encode_rows([[other]])]))


def test_count_by_key_reports_ownership_and_each_key_once():
    results = [
        {"counts": {"a": 2}, "keys": 1, "key_groups": 64},
        {"counts": {"b": 1, "c": 4}, "keys": 2, "key_groups": 64},
    ]
    merged = BUILTINS["count_by_key"].merge_results(results)
    assert merged["counts"] == {"a": 2, "b": 1, "c": 4}
    assert merged["ownership"] == [{"keys": 1, "key_groups": 64}, {"keys": 2, "key_groups": 64}]
    assert merged["keys_on_several_workers"] == 0
    results[1]["counts"]["a"] = 1
    assert BUILTINS["count_by_key"].merge_results(results)["keys_on_several_workers"] == 1


def test_routing_around_a_dead_worker_moves_no_other_group():
    """The fault detector routes around a dead worker before its replacement runs: its
    groups go nowhere (unrouted; a guarantee replays them), every other group stays."""
    from dataclasses import replace

    topo = load_topology_text(RUNNING.format(guarantee="none"))
    phys = schedule(topo, ["h1", "h2"], 3)
    dead = phys.of_node("count")[0]
    alive = replace(phys, workers=[w for w in phys.workers if w != dead])
    before, after = owners(topo, phys, "count"), owners(topo, alive, "count")
    assert [a for a, b in zip(before, after, strict=True) if a != b] == [dead.worker_id] * (
        before.count(dead.worker_id)
    )
    assert set(after) == {-1} | {w.worker_id for w in phys.of_node("count")[1:]}
    (route,) = routes_for(topo, alive, phys.of_node("split")[0].worker_id)
    router = Router(route)
    lost = [w for w in (f"w{i}" for i in range(300)) if router.select([w]) < 0]
    assert lost and all(before[key_group([w], 16)] == dead.worker_id for w in lost)
