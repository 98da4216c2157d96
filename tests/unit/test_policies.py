"""Routing policies: which worker each tuple goes to."""

import subprocess
import sys
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from typhoon.runtime.policies import LB_SLOTS, Router, stable_hash
from typhoon.topology.routing import Route


def router(policy: str, hops=(11, 12, 13), **kw) -> Router:
    return Router(Route(stream=1, policy=policy, next_hops=list(hops), **kw))


def test_shuffle_is_round_robin():
    r = router("shuffle")
    got = Counter(r.select(["x"]) for _ in range(300))
    assert got == {11: 100, 12: 100, 13: 100}


def test_fields_sends_a_key_to_one_worker():
    r = router("fields", fields=[0])
    for word in ("a", "b", "hello", 42):
        assert len({r.select([word, i]) for i in range(20)}) == 1


@given(
    st.lists(
        st.one_of(st.text(), st.integers(-(2**63), 2**64 - 1), st.binary()), min_size=1, max_size=4
    )
)
def test_stable_hash_is_deterministic(key):
    assert stable_hash(key) == stable_hash(list(key))


def test_stable_hash_equal_across_processes():
    code = "from typhoon.runtime.policies import stable_hash; print(stable_hash(['word', 7]))"
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
        for _ in range(2)
    }
    assert outs == {f"{stable_hash(['word', 7])}\n"}


def test_global_always_first():
    r = router("global")
    assert {r.select([i]) for i in range(10)} == {11}


def test_local_or_shuffle_prefers_local():
    r = router("local_or_shuffle", local=[13])
    assert {r.select([i]) for i in range(10)} == {13}
    r = router("local_or_shuffle", local=[])
    assert {r.select([i]) for i in range(10)} == {11, 12, 13}


def test_direct_uses_table_then_hash():
    r = router("direct", fields=[0], table={"a": 12, "b": 13})
    assert r.select(["a"]) == 12
    assert r.select(["b"]) == 13
    assert r.select(["zzz"]) in (11, 12, 13)


def test_no_next_hops():
    assert router("shuffle", hops=()).select(["x"]) == -1


def test_all_is_broadcast():
    assert router("all").broadcast
    assert not router("shuffle").broadcast


def test_lb_slot_range():
    r = router("sdn")
    slots = {r.lb_slot() for _ in range(5000)}
    assert slots <= set(range(LB_SLOTS))
    assert len(slots) > 200
