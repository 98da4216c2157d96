"""Key-pair statistics in the framework layer (opt-in) and the two-key workload."""

from __future__ import annotations

from collections import Counter

import pytest
from test_framework import Recorder

from typhoon.locality.settings import LocalitySettings
from typhoon.operators import resolve_operator
from typhoon.operators.base import Context
from typhoon.operators.pairs import PairSource, expected_counts, pair_tuple, partner
from typhoon.runtime.framework import Framework
from typhoon.runtime.pairs import PairStats
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound
from typhoon.topology import TopologyError, load_topology_text, schedule
from typhoon.topology.pair_keys import PairKeys, pair_keys
from typhoon.wire import Control, ControlTuple, encode_control, encode_rows


def chain(config: str = "{locality: {pairs: 64, sample: 3, top: 5}}", count: int = 300) -> str:
    return f"""
name: pairs
config: {config}
spouts:
  - id: source
    operator: pair_source
    args: {{count: {count}, keys_a: 20, keys_b: 20, locality: 0.8}}
bolts:
  - id: a
    operator: count_forward
    args: {{key: a}}
    parallelism: 2
    stateful: true
  - id: b
    operator: count_by_key
    args: {{key: b}}
    parallelism: 2
    stateful: true
streams:
  - {{from: source, to: a, grouping: {{type: fields, fields: [a]}}}}
  - {{from: a, to: b, grouping: {{type: fields, fields: [b]}}}}
"""


def framework(text: str, node: str) -> tuple[Framework, Recorder]:
    topo = load_topology_text(text, "t.yaml")
    phys = schedule(topo, ["h1", "h2"], 7)
    spec = WorkerSpec(topo, phys, phys.of_node(node)[0].worker_id, batch_size=8)
    n = topo.nodes[node]
    io = Recorder()
    return Framework(spec, resolve_operator(n.operator)(**n.args), io), io


def rows(n: int, start: int = 0) -> list[list]:
    return [pair_tuple(1, s, 20, 20, 0.8, "") for s in range(start, start + n)]


def test_pair_keys_only_between_two_keyed_streams():
    topo = load_topology_text(chain(), "t.yaml")
    assert pair_keys(topo, "a") == PairKeys((0,), "default", (1,))
    assert pair_keys(topo, "b") is None  # no keyed output
    assert pair_keys(topo, "source") is None  # no input


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{locality: {pairs: 0}}", "'config.locality.pairs' of the topology must be at least 1"),
        ("{locality: {sample: x}}", "'config.locality.sample' of the topology must be an integer"),
        ("{locality: {pair: 10}}", "unknown config key 'locality.pair'; did you mean 'locality.pa"),
        ("{locality: 5}", "'config.locality' of the topology must be a mapping"),
    ],
)
def test_bad_locality_config(config, message):
    with pytest.raises(TopologyError) as e:
        load_topology_text(chain(config), "t")
    assert message in str(e.value)


def test_locality_config_needs_a_node_between_keyed_streams():
    text = chain().replace("type: fields, fields: [b]", "type: shuffle")
    with pytest.raises(TopologyError) as e:
        load_topology_text(text, "t")
    assert "no node has a key-routed input (fields or direct) and a key-routed output" in str(
        e.value
    )


def test_sampler_counts_every_nth_row_and_keeps_order_and_output():
    stats = PairStats(LocalitySettings(pairs=1000, sample=4, top=1000), PairKeys((0,), "x", (1,)))
    seen: list[list] = []
    out: list[tuple[list, str]] = []

    def process(values, emit):
        seen.append(values)
        emit(values, "x")
        emit(["other", values[0]], "y")  # another stream: not a pair

    def emit(values, stream="default"):
        out.append((values, stream))

    data = rows(10) + rows(7, 10) + rows(3, 17)
    for chunk in (data[:10], data[10:17], data[17:]):
        stats.run(chunk, process, None, emit)
    assert seen == data  # every row, in order, once
    assert [v for v, s in out if s == "x"] == data
    sampled = data[3::4]  # rows 3, 7, 11, 15, 19 across the three calls
    assert stats.sampled == len(sampled)
    want = Counter((r[0], r[1]) for r in sampled)
    got = {(a, b): c for a, bs in stats.metrics({})["pairs"].items() for b, c in bs.items()}
    assert got == dict(want)


def test_sampler_splits_batches_around_sampled_rows():
    stats = PairStats(LocalitySettings(pairs=1000, sample=5, top=10), PairKeys((0,), "x", (1,)))
    calls: list[int] = []

    def batch(rs, emit):
        calls.append(len(rs))
        for r in rs:
            emit(r, "x")

    stats.run(rows(12), lambda v, e: pytest.fail("process_batch is preferred"), batch, lambda *a: 0)
    assert calls == [4, 1, 4, 1, 2]  # rows 4 and 9 alone
    assert stats.sampled == 2


def test_framework_reports_top_pairs_and_links_in_metrics():
    fw, io = framework(chain(), "a")
    data = rows(300)
    fw.deliver(Inbound(1, 1, [encode_rows(data[:150]), encode_rows(data[150:])]))
    fw.flush(force=True)
    fw.control(ControlTuple(Control.METRIC_REQ, {"request_id": 4}))
    m = io.replies[-1].body["metrics"]
    assert m["pairs_sampled"] == 100 and m["pairs_sample"] == 3
    sampled = Counter((r[0], r[1]) for r in data[2::3])
    top = [(a, b, c) for a, bs in m["pairs"].items() for b, c in bs.items()]
    assert len(top) == 5
    assert sorted(c for _, _, c in top) == sorted(sampled.values())[-5:]
    assert all(sampled[(a, b)] == c for a, b, c in top)
    encode_control(io.replies[-1])  # what the worker sends passes the wire's checks
    assert sum(m["sent_to"].values()) == 300  # count_forward passes every tuple on
    assert all(k.endswith(":2") for k in m["sent_to"])


def test_framework_without_locality_config_counts_nothing():
    fw, io = framework(chain("{}"), "a")
    assert fw.pairs is None
    fw.deliver(Inbound(1, 1, [encode_rows(rows(30))]))
    fw.control(ControlTuple(Control.METRIC_REQ, {"request_id": 4}))
    assert "pairs" not in io.replies[-1].body["metrics"]


def test_pair_source_correlation_offset_and_expected_counts():
    src = PairSource(count=2000, keys_a=50, keys_b=40, locality=0.8, seed=3)
    src.open(Context("t", "source", 1, 0, 1, [], list(PairSource.fields)))
    got: list[list] = []
    src.next_batch(lambda v, s="default": got.append(v), 1000)
    assert src.offset() == {"emitted": 1000}
    src.seek({"emitted": 500})
    again: list[list] = []
    src.next_batch(lambda v, s="default": again.append(v), 10)
    assert again == got[500:510]
    correlated = sum(b == f"b{partner(int(a[1:]), 3, 40)}" for a, b, _, _ in got)
    assert 0.78 < correlated / len(got) < 0.86  # 80% plus the uniform picks that hit it
    ca, cb = expected_counts(1000, 1, 50, 40, 0.8, 3)
    assert ca == Counter(r[0] for r in got) and cb == Counter(r[1] for r in got)
