"""key_origins, the sink that checks a stateful node from downstream, and wordcount
through real framework layers: each key's ``[key, count]`` tuples that count_by_key
emits on SIGNAL come from exactly one count worker, and their sums equal counts
made here from the input sentences (not the report's merge of the workers' totals).
"""

from __future__ import annotations

from collections import Counter

import pytest

from typhoon.operators import BUILTINS, resolve_operator
from typhoon.operators.base import Context
from typhoon.operators.sources import generate_sentences
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound, Transport
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import Control, ControlTuple, encode_rows

WORDCOUNT = """
name: wc
spouts:
  - id: source
    operator: sentence_source
    args: {count: 10, seed: 3}
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: count
    operator: count_by_key
    args: {key: word}
    parallelism: 3
    stateful: true
  - id: check
    operator: key_origins
    args: {key: key, count: count}
streams:
  - from: source
    to: split
    grouping: shuffle
  - from: split
    to: count
    grouping: {type: fields, fields: [word]}
  - from: count
    to: check
    grouping: global
"""


class Net(Transport):
    """Every worker's I/O layer: what a worker sends goes into one queue for all."""

    def __init__(self, queue: list, me: int) -> None:
        super().__init__()
        self.queue, self.me = queue, me

    def poll(self, timeout: float) -> list:
        return []

    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        self.queue.append((dst, Inbound(self.me, stream, list(payloads))))

    def reply(self, ct: ControlTuple) -> None:
        pass


def test_origins_and_sums_per_key():
    sink = BUILTINS["key_origins"](key="k", count="n")
    sink.open(Context("t", "check", 9, 0, 1, input_fields=["n", "k"]))
    for sender, rows in ((4, [[2, "a"], [1, "b"]]), (5, [[3, "c"]]), (4, [[5, "a"]])):
        sink.sender = sender
        for r in rows:
            sink.process(r, lambda *a: None)
    assert sink.result() == {
        "tuples": 4,
        "keys": {
            "a": {"from": [4], "sum": 7},
            "b": {"from": [4], "sum": 1},
            "c": {"from": [5], "sum": 3},
        },
    }
    other = {"tuples": 1, "keys": {"a": {"from": [6], "sum": 1}}}
    merged = type(sink).merge_results([sink.result(), other])
    assert merged["keys"]["a"] == {"from": [4, 6], "sum": 8} and merged["tuples"] == 5


def test_a_field_that_is_not_an_input_is_refused():
    with pytest.raises(ValueError, match="count field 'x'"):
        BUILTINS["key_origins"].output_fields({"count": "x"}, ["key", "count"])


def run_wordcount(sentences: list[str]) -> tuple[dict, dict[int, dict]]:
    """Sentences into the split workers, every frame delivered, then SIGNAL to each count
    worker; (check's result, each count worker's result)."""
    topo = load_topology_text(WORDCOUNT, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    queue: list = []
    fws: dict[int, Framework] = {}
    for w in phys.workers:
        if w.node == "source":
            continue
        node = topo.nodes[w.node]
        spec = WorkerSpec(topo, phys, w.worker_id, batch_size=8)
        op = resolve_operator(node.operator)(**node.args)
        fws[w.worker_id] = Framework(spec, op, Net(queue, w.worker_id))
    source = phys.of_node("source")[0].worker_id
    split = [w.worker_id for w in phys.of_node("split")]
    for i, s in enumerate(sentences):
        fws[split[i % 2]].deliver(Inbound(source, 1, [encode_rows([[s]])]))

    def pump() -> None:
        for fw in fws.values():
            fw.flush(force=True)
        while queue:
            dst, item = queue.pop(0)
            fws[dst].deliver(item)
            for fw in fws.values():
                fw.flush(force=True)

    pump()
    counts = {w.worker_id: fws[w.worker_id] for w in phys.of_node("count")}
    for fw in counts.values():
        fw.control(ControlTuple(Control.SIGNAL, {"version": 1}))
    pump()
    check = fws[phys.of_node("check")[0].worker_id]
    return check.op.result(), {w: fw.op.result() for w, fw in counts.items()}


def test_each_word_is_counted_on_one_worker_and_its_flushed_counts_reach_downstream():
    sentences = list(generate_sentences(300, seed=11, words=6, vocabulary_size=60))
    reference = Counter(w for s in sentences for w in s.split())
    seen, per_worker = run_wordcount(sentences)
    keys = seen["keys"]
    # what count_by_key emitted on SIGNAL, summed downstream, is the input's word counts
    assert {k: v["sum"] for k, v in keys.items()} == dict(reference)
    # each word came from exactly one count worker, and the workers' key sets are disjoint
    assert all(len(v["from"]) == 1 for v in keys.values()), keys
    owners: dict[int, set[str]] = {}
    for k, v in keys.items():
        owners.setdefault(v["from"][0], set()).add(k)
    assert len(owners) == 3  # 60 words over 3 workers: each owns some
    for wid, result in per_worker.items():
        assert set(result["counts"]) == owners[wid]  # its state holds its own keys only
