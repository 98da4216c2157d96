"""Row batches: one msgpack call per frame-sized entry, and ``process_batch`` on arrival."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_framework import Recorder

from typhoon.operators import resolve_operator
from typhoon.operators.base import Bolt, Context
from typhoon.operators.keyed import Digest
from typhoon.operators.sinks import CountByKey, SequenceCheck
from typhoon.operators.transforms import Identity
from typhoon.runtime.framework import Framework
from typhoon.runtime.hooks import batch_hook
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import decode_rows, encode_rows, entry_capacity

FORWARD = """
name: rows
spouts:
  - id: source
    operator: sequence_source
    args: {count: 10}
bolts:
  - id: sink
    operator: sequence_check
streams:
  - from: source
    to: sink
    grouping: shuffle
"""


class A(Bolt):
    def process(self, values, emit):
        pass

    def process_batch(self, rows, emit):
        pass


class B(A):  # overrides process only: the inherited batch hook would bypass it
    def process(self, values, emit):
        pass


class C(B):
    def process_batch(self, rows, emit):
        pass


def test_batch_hook_only_when_it_is_meant_for_the_process_it_sits_beside() -> None:
    assert batch_hook(A()) is not None
    assert batch_hook(B()) is None
    assert batch_hook(C()) is not None
    assert batch_hook(CountByKey()) is not None
    assert batch_hook(Bolt()) is None


def _framework(mtu: int, batch: int) -> tuple[Framework, Recorder]:
    topo = load_topology_text(FORWARD, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    src = phys.of_node("source")[0].worker_id
    spec = WorkerSpec(topo, phys, src, batch_size=batch)
    io = Recorder()
    io.mtu = mtu
    return Framework(spec, resolve_operator("sequence_source")(count=10), io), io


@settings(deadline=None, max_examples=60)
@given(
    st.sampled_from([300, 1500, 9000]),
    st.lists(st.integers(0, 2500), min_size=1, max_size=400),
)
def test_entries_fit_a_frame_keep_order_and_lose_nothing(mtu: int, sizes: list[int]) -> None:
    fw, _ = _framework(mtu, 1000)
    cap = entry_capacity(mtu)
    rows = [[i, b"x" * n] for i, n in enumerate(sizes)]
    entries = fw._entries(rows)
    assert [r for e in entries for r in decode_rows(e)] == rows
    for e in entries:
        assert len(e) <= cap or len(decode_rows(e)) == 1  # only a lone big row is segmented
    # close to as few entries as the bytes need: a stream of equal rows fills its frames
    if len(set(sizes)) == 1 and sizes[0] < cap // 4:
        need = len(encode_rows(rows)) / cap
        assert len(entries) <= need * 1.25 + 2


def test_a_batch_leaves_as_few_frame_sized_entries() -> None:
    fw, io = _framework(9000, 100)
    for i in range(100):
        fw._buffer((2, 1), [1, i, 0.0, b"x" * 100])
    assert io.sent == [] and fw.sent_to == {(2, 1): 100}  # counted, not yet handed over
    fw.push()
    (sent,) = io.sent
    entries = sent[3]
    assert len(entries) == 2 and all(len(e) <= entry_capacity(9000) for e in entries)
    assert [r[1] for e in entries for r in decode_rows(e)] == list(range(100))


def test_small_batches_of_one_turn_share_one_send() -> None:
    fw, io = _framework(9000, 1)
    for i in range(256):  # batch size 1: 256 batches, one event-loop turn
        fw._buffer((2, 1), [1, i, 0.0, b"x" * 10])
    fw.push()
    (sent,) = io.sent  # one hand-over to the I/O layer, one entry: one msgpack call
    assert [r[1] for e in sent[3] for r in decode_rows(e)] == list(range(256))
    assert len(sent[3]) == 1


def _rows_with_faults(seed: int) -> list[list]:
    rng = random.Random(seed)
    rows = []
    for src in (3, 4):
        seqs = list(range(3000))
        rng.shuffle(seqs)
        seqs += rng.sample(range(3000), 50)  # duplicates
        rows += [[src, s, 1e9, b""] for s in seqs if s % 97]  # and gaps
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize(
    "make", [SequenceCheck, CountByKey, Digest, Identity], ids=lambda m: m.__name__
)
def test_process_batch_does_what_process_does_row_by_row(make) -> None:
    rows = _rows_with_faults(11)
    ctx = Context("t", "n", 1, 0, 1, input_fields=["src", "seq", "ts", "payload"])
    one, batched = make(), make()
    one.open(ctx)
    batched.open(ctx)
    out_one: list = []
    out_batched: list = []
    for r in rows:
        one.process(r, lambda v, stream="default": out_one.append(v))
    for i in range(0, len(rows), 77):
        batched.process_batch(rows[i : i + 77], lambda v, stream="default": out_batched.append(v))
    assert out_one == out_batched
    a, b = one.result(), batched.result()
    if make is SequenceCheck:
        for r in (a, b):
            r.pop("timeline"), r.pop("latency_s")
        assert one.latencies and len(one.latencies) == len(batched.latencies)
    assert a == b


def test_deliver_hands_whole_batches_to_process_batch() -> None:
    topo = load_topology_text(FORWARD, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    sink = phys.of_node("sink")[0].worker_id
    calls: list[int] = []

    class Spy(SequenceCheck):
        def process_batch(self, rows, emit):
            calls.append(len(rows))
            super().process_batch(rows, emit)

    op = Spy()
    fw = Framework(WorkerSpec(topo, phys, sink), op, Recorder())
    fw.deliver(Inbound(1, 1, [encode_rows([[1, i, 0.0, b""] for i in range(50)])] * 2))
    assert calls == [100]  # every entry of an arrival in one call
    assert op.received == 100 and op.duplicates == 50
    assert fw.received_from == {(1, 1): 100}
