"""The topology generator, its exact-result oracle and the keyed operators, without a switch."""

from __future__ import annotations

import collections

import pytest

from mininet_env.differential import CI_SEEDS, cluster_key, compare
from typhoon.operators.base import Context
from typhoon.operators.keyed import Digest, KeyedSource, SplitStreams, tuple_digest
from typhoon.topology import load_topology_text
from typhoon.topology.generate import MAX_WORKERS, SHAPES, expected_results, generate
from typhoon.topology.model import GROUPINGS

SEEDS = range(60)


@pytest.fixture(scope="module")
def cases():
    return [generate(s, budget=5_000) for s in SEEDS]


def test_every_generated_topology_is_valid_and_within_bounds(cases) -> None:
    for case in cases:
        topo = case.topology()  # loads through the same loader as `typhoon run`
        assert 2 <= len(topo.nodes) <= 7, case.describe()
        assert all(1 <= n.parallelism <= 6 for n in topo.nodes.values())
        assert sum(n.parallelism for n in topo.nodes.values()) <= MAX_WORKERS
        assert 1 <= case.hosts <= 4 and case.fabric in SHAPES
        sinks = [n for n in topo.nodes if not topo.outputs_of(n)]
        assert sinks and set(case.expected) == set(sinks)
        for name, node in topo.nodes.items():
            if node.kind == "spout":
                assert topo.outputs_of(name), f"seed {case.seed}: source {name} feeds nothing"
            else:
                assert topo.inputs_of(name)


def test_the_seeds_cover_every_grouping_fan_in_fan_out_and_named_streams(cases) -> None:
    seen: set[str] = set()
    fan_in = fan_out = named = 0
    for case in cases:
        topo = case.topology()
        seen |= case.groupings
        fan_in += any(len(topo.inputs_of(n)) > 1 for n in topo.nodes)
        fan_out += any(len(topo.outputs_of(n)) > 1 for n in topo.nodes)
        named += any(
            len({s.name for s in topo.outputs_of(n)}) > 1
            for n, node in topo.nodes.items()
            if node.kind == "spout"
        )
    assert seen == set(GROUPINGS)
    assert fan_in and fan_out and named


def test_generation_is_a_function_of_the_seed() -> None:
    a, b = generate(11, budget=2_000), generate(11, budget=2_000)
    assert (a.text, a.expected, a.hosts, a.fabric) == (b.text, b.expected, b.hosts, b.fabric)
    assert generate(12, budget=2_000).text != a.text


def test_ci_seeds_cover_every_fabric_host_count_and_grouping() -> None:
    cases = [generate(s, budget=1_000) for s in CI_SEEDS]
    assert len(cases) >= 12
    assert {c.hosts for c in cases} == {1, 2, 3, 4}
    assert {c.fabric for c in cases if c.hosts >= 3} == set(SHAPES)
    assert set().union(*(c.groupings for c in cases)) == set(GROUPINGS)
    assert len({cluster_key(c) for c in cases}) <= 7  # cluster starts cost CI time


TOPO = """
name: oracle
spouts:
  - {{id: src, operator: keyed_source, parallelism: 2,
      args: {{count: 3, keys: 4, seed: 5, size: 2, streams: [a, b]}}}}
bolts:
  - {{id: split, operator: split_streams, parallelism: 2, args: {{salt: 7, drop: {drop}}}}}
  - {{id: pass, operator: identity}}
  - {{id: sink, operator: digest, parallelism: 3}}
  - {{id: count, operator: count_by_key, args: {{key: key}}}}
streams:
  - {{from: src, to: split, stream: a, grouping: shuffle}}
  - {{from: src, to: pass, stream: b, grouping: {{type: fields, fields: [key]}}}}
  - {{from: split, to: sink, grouping: all}}
  - {{from: pass, to: sink, grouping: global}}
  - {{from: pass, to: count, grouping: shuffle}}
"""


def run_in_process(drop: int) -> tuple[dict, dict]:
    """The topology above with the real operators, every worker in this process,
    tuples handed over by hand: what the sinks get if nothing is lost."""
    topo = load_topology_text(TOPO.format(drop=drop), "oracle.yaml")
    out: list[tuple[str, list]] = []  # (stream, tuple) from the sources
    for index in range(2):
        src = KeyedSource(**topo.nodes["src"].args)
        src.open(Context("oracle", "src", index, index, 2))
        while src.next_batch(lambda v, stream="default": out.append((stream, v)), 2):
            pass
    assert len(out) == 6 and {s for s, _ in out} <= {"a", "b"}
    split = SplitStreams(**topo.nodes["split"].args)
    sinks = [Digest() for _ in range(3)]
    counts: dict[str, int] = collections.Counter()
    for stream, values in out:
        if stream == "a":
            split.process(values, lambda v, stream="default": [d.process(v, None) for d in sinks])
        else:
            sinks[0].process(values, None)
            counts[values[0]] += 1
    return Digest.merge_results([d.result() for d in sinks]), {"counts": dict(counts)}


@pytest.mark.parametrize("drop", [0, 2])
def test_the_oracle_matches_the_operators_run_by_hand(drop: int) -> None:
    digest, counts = run_in_process(drop)
    want = expected_results(load_topology_text(TOPO.format(drop=drop), "oracle.yaml"))
    assert want["sink"] == digest
    assert want["count"] == counts


def test_the_digest_is_order_independent_and_sees_a_changed_tuple() -> None:
    rows = [["k1", i, i * 7, "pp"] for i in range(5)]
    a, b = Digest(), Digest()
    for r in rows:
        a.process(r, None)
    for r in reversed(rows):
        b.process(r, None)
    assert a.result() == b.result()
    c = Digest()
    for r in [*rows[:-1], ["k1", 4, 29, "pp"]]:
        c.process(r, None)
    assert c.result()["tuples"] == 5 and c.result() != a.result()
    assert tuple_digest(["k1", 1, 2, "x"]) != tuple_digest(["k1", 1, 2, "y"])


def test_keyed_operators_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="count"):
        KeyedSource(count=-1)
    with pytest.raises(ValueError, match="streams"):
        KeyedSource(streams=["a", "a"])
    with pytest.raises(ValueError, match="streams"):
        SplitStreams(streams=[])
    with pytest.raises(ValueError, match="drop"):
        SplitStreams(drop=-2)


def test_compare_names_missing_extra_and_wrong_tuples() -> None:
    want = {"tuples": 10, "sum": 5, "xor": 3}
    assert compare("sdn", "x", dict(want), want) == []
    assert "2 missing" in compare("sdn", "x", {**want, "tuples": 8}, want)[0]
    assert "1 extra" in compare("tcp", "x", {**want, "tuples": 11}, want)[0]
    assert "checksum" in compare("sdn", "x", {**want, "sum": 6}, want)[0]
    assert "no result" in compare("sdn", "x", None, want)[0]
    counts = {"counts": {"k1": 3, "k2": 1}}
    assert compare("sdn", "c", {"counts": {"k1": 3, "k2": 1}}, counts) == []
    (line,) = compare("sdn", "c", {"counts": {"k1": 2, "k2": 2, "k3": 1}}, counts)
    assert "3 key(s): 1 missing, 2 extra" in line
