"""Locality-aware routing, pure parts: SpaceSaving against exact counts, and the METIS
partition of the key-pair graph against hashing (seed paper 003)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from typhoon.locality.partition import Slot, plan_locality
from typhoon.locality.spacesaving import SpaceSaving
from typhoon.runtime.policies import stable_hash


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=400), st.integers(1, 12))
def test_spacesaving_bounds_hold_against_exact_counts(stream, capacity):
    ss = SpaceSaving(capacity)
    ss.offer_all(stream)
    exact = Counter(stream)
    assert ss.total == len(stream) and len(ss.counts) <= capacity
    for item, count, error in ss.top():
        assert count - error <= exact[item] <= count  # the true count is in the bounds
    # every item more frequent than total / capacity is kept
    for item, n in exact.items():
        if n > len(stream) / capacity:
            assert item in ss.counts
    for _item, low in ss.guaranteed():
        dropped = [n for i, n in exact.items() if i not in ss.counts]
        assert all(low >= n for n in dropped)


def test_spacesaving_rejects_bad_input_and_clears():
    with pytest.raises(ValueError, match="capacity"):
        SpaceSaving(0)
    ss = SpaceSaving(2)
    with pytest.raises(ValueError, match="positive"):
        ss.offer("x", 0)
    ss.offer_all(["a", "a", "b", "c"])
    ss.clear()
    assert ss.total == 0 and ss.top() == []


def correlated_pairs(n_pairs: int, locality: float, keys: int, groups: int, seed: int = 7):
    """The paper's synthetic workload: with probability ``locality`` the second key is
    the first key's partner (same group), otherwise any key."""
    rng = random.Random(seed)
    pairs: Counter = Counter()
    for _ in range(n_pairs):
        a = rng.randrange(keys)
        b = a if rng.random() < locality else rng.randrange(keys)
        pairs[(f"tag{a}", f"loc{b % groups}")] += 1
    return pairs


def three_hosts():
    a = [Slot(1, "h1"), Slot(2, "h2"), Slot(3, "h3")]
    b = [Slot(4, "h1"), Slot(5, "h2"), Slot(6, "h3")]
    return a, b


@pytest.mark.parametrize("locality", [0.5, 0.8, 0.95])
def test_partition_keeps_correlated_keys_on_one_host_and_balanced(locality):
    a, b = three_hosts()
    pairs = correlated_pairs(20_000, locality, keys=60, groups=60)
    hashed_a = {k: a[stable_hash([k]) % 3].worker for k, _ in pairs}
    hashed_b = {k: b[stable_hash([k]) % 3].worker for _, k in pairs}
    plan = plan_locality(pairs, a, b, hashed_a, hashed_b, imbalance=1.05)
    assert plan.hash_local_fraction < 0.5  # hashing: about one in three hosts
    # most of the correlated weight lands on one host, far above hashing
    assert plan.local_fraction >= locality * 0.9, plan.local_fraction
    assert plan.local_fraction > plan.hash_local_fraction + 0.2
    assert plan.imbalance(plan.load_a) <= 1.15 and plan.imbalance(plan.load_b) <= 1.15
    assert set(plan.table_a.values()) == {1, 2, 3} and set(plan.table_b.values()) == {4, 5, 6}
    assert set(plan.table_a) == {k for k, _ in pairs} and set(plan.table_b) == {k for _, k in pairs}


def test_one_host_or_hosts_without_workers_of_a_node():
    pairs = {("x", "p"): 5, ("y", "q"): 3}
    plan = plan_locality(pairs, [Slot(1, "h1"), Slot(2, "h1")], [Slot(3, "h1")])
    assert plan.local_fraction == 1.0 and set(plan.table_b.values()) == {3}
    # h2 has only B workers: A keys placed there go to an A worker elsewhere
    plan = plan_locality(pairs, [Slot(1, "h1")], [Slot(3, "h1"), Slot(4, "h2")])
    assert set(plan.table_a.values()) == {1}
    with pytest.raises(ValueError, match="imbalance"):
        plan_locality(pairs, [Slot(1, "h1")], [Slot(3, "h1")], imbalance=0.9)
    with pytest.raises(ValueError, match="worker"):
        plan_locality(pairs, [], [Slot(3, "h1")])
