"""The fields router's key cache and the reused Packer of ``stable_hash`` change no result."""

from __future__ import annotations

import zlib
from unittest import mock

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from test_framework import Recorder

from typhoon.operators import resolve_operator
from typhoon.runtime import policies
from typhoon.runtime.framework import Framework
from typhoon.runtime.policies import Router
from typhoon.runtime.spec import WorkerSpec
from typhoon.topology import load_topology_text, schedule
from typhoon.topology.keygroups import stable_hash
from typhoon.topology.routing import Route
from typhoon.wire import Control, ControlTuple

KEYS = st.one_of(
    st.text(max_size=12),
    st.integers(-(2**63), 2**64 - 1),
    st.binary(max_size=8),
    st.booleans(),
    st.floats(allow_nan=False),
    st.none(),
    st.sampled_from(["a", 1, True, 1.0, b"a", 0, False, 0.0, ""]),  # equal in Python
)


def packb_hash(key: list) -> int:
    """``stable_hash`` as it was defined: crc32 of a fresh ``packb``."""
    return zlib.crc32(msgpack.packb(key, use_bin_type=True))


def uncached(groups: list[int], key: list) -> int:
    return groups[packb_hash(key) % len(groups)]


def test_stable_hash_values_are_pinned():
    # values of the original packb definition: state ownership and the controller use them
    assert stable_hash(["word"]) == 15398686
    assert stable_hash(["word", 7]) == 2273425191
    assert stable_hash(("word", 7)) == 2273425191
    assert stable_hash([b"x", 1.5, None, True]) == 2352342960
    assert stable_hash([]) == stable_hash(()) == packb_hash([])


@given(st.lists(st.one_of(KEYS, st.lists(KEYS, max_size=3)), max_size=4))
def test_stable_hash_equals_crc32_of_packb(key):
    assert stable_hash(key) == packb_hash(key)
    assert stable_hash(tuple(key)) == packb_hash(key)


def test_stable_hash_after_a_failed_pack():
    """A key msgpack refuses leaves no bytes behind in the reused Packer."""
    for bad in ([object()], [2**70]):
        try:
            stable_hash(bad)
        except (TypeError, OverflowError):
            pass
        else:
            raise AssertionError(f"{bad!r} packed")
        assert stable_hash(["word"]) == packb_hash(["word"])


@settings(max_examples=200)
@given(
    st.lists(KEYS, min_size=1, max_size=60),
    st.lists(st.integers(1, 9), min_size=1, max_size=16),
    st.integers(1, 8),
)
def test_cached_receiver_equals_the_uncached_one(keys, groups, bound):
    """Every key, seen once or many times, goes where the uncached hash sends it, also
    when the cache fills and starts over (a small bound forces that)."""
    r = Router(
        Route(stream=1, policy="fields", next_hops=sorted(set(groups)), fields=[1], groups=groups)
    )
    with mock.patch.object(policies, "KEY_CACHE", bound):
        for _ in range(2):
            for k in keys:
                assert r.select(["x", k]) == uncached(groups, [k])
                assert len(r.cache) <= bound


def test_keys_equal_in_python_but_packed_differently_keep_their_own_receiver():
    groups = list(range(1, 129))
    r = Router(Route(stream=1, policy="fields", next_hops=groups, fields=[0], groups=groups))
    keys = [1, True, 1.0, 0, False, 0.0, "1", b"1"]
    for k in keys + keys[::-1]:
        assert r.select([k]) == uncached(groups, [k]), k
    assert len({uncached(groups, [k]) for k in keys}) > 2  # the keys do route apart


@given(st.lists(st.tuples(KEYS, KEYS), min_size=1, max_size=20))
def test_several_key_fields_hash_as_the_list_of_them(keys):
    groups = [5, 6, 7, 8]
    r = Router(Route(stream=1, policy="fields", next_hops=groups, fields=[2, 0], groups=groups))
    for a, b in keys:
        assert r.select([a, "pad", b]) == uncached(groups, [b, a])


def test_fields_without_fields_sends_everything_to_one_receiver():
    groups = [5, 6, 7]
    r = Router(Route(stream=1, policy="fields", next_hops=groups, fields=[], groups=groups))
    assert {r.select([w]) for w in "abcdef"} == {uncached(groups, [])}


TOPOLOGY = """
name: cache
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: count
    operator: running_count
    parallelism: 3
    config: {max_parallelism: 8}
streams:
  - from: source
    to: count
    grouping: {type: fields, fields: [seq]}
"""


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 2), min_size=8, max_size=8), st.lists(st.integers(0, 50), max_size=30)
)
def test_a_new_table_by_routing_control_replaces_the_cached_receivers(table, keys):
    """A rescale or the locality router installs a new group table with a ROUTING
    control tuple: keys routed (and cached) before go to their new owners after."""
    topo = load_topology_text(TOPOLOGY, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    src = phys.of_node("source")[0].worker_id
    workers = [w.worker_id for w in phys.of_node("count")]
    fw = Framework(
        WorkerSpec(topo, phys, src, batch_size=10),
        resolve_operator("sequence_source")(),
        Recorder(),
    )
    stream = next(iter(fw.routers))
    old = fw.routers[stream]
    for k in keys:
        assert old.select([k] * 4) == uncached(old.groups, [k])
    route = Route(
        stream=stream,
        policy="fields",
        next_hops=workers,
        fields=list(old.route.fields),
        version=old.route.version + 1,
        groups=[workers[i] for i in table],
    )
    fw.control(ControlTuple(Control.ROUTING, route.to_body()))
    new = fw.routers[stream]
    assert new.groups == route.groups
    for k in keys:
        assert new.select([k] * 4) == uncached(route.groups, [k])
