"""``emit_rows`` routes a list of tuples exactly as ``emit`` on each row would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_framework import Recorder

from typhoon.operators import resolve_operator
from typhoon.operators.base import Spout
from typhoon.operators.sources import SequenceSource
from typhoon.runtime.framework import Framework
from typhoon.runtime.hooks import batch_hook
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import Control, ControlTuple, decode_rows

# the columns test (test_emit_columns.py) builds on these: another spout, declared columns
TOPOLOGY = """
name: emit
spouts:
  - id: source
    operator: {spout}
    args: {{count: 10}}
bolts:
  - id: sink
    operator: sequence_check
    parallelism: {par}
  - id: other
    operator: sequence_check
    parallelism: 2
streams:
  - from: source
    to: sink
    grouping: {grouping}{columns}
  - from: source
    to: other
    grouping: shuffle{columns}
"""

GROUPINGS = ["shuffle", "global", "all", "{type: fields, fields: [seq]}", "local_or_shuffle"]


def framework(
    grouping: str,
    par: int,
    batch: int,
    multicast: bool,
    spout: str = "sequence_source",
    columns: str = "",
) -> tuple[Framework, Recorder]:
    """The source's framework layer on a recording transport; ``columns``: what follows
    each stream's grouping (a ``columns:`` line)."""
    text = TOPOLOGY.format(spout=spout, par=par, grouping=grouping, columns=columns)
    topo = load_topology_text(text, "t.yaml")
    phys = schedule(topo, ["h1", "h2"], 7)
    wid = phys.of_node("source")[0].worker_id
    io = Recorder(multicast)
    op = resolve_operator("sequence_source")(count=10)
    return Framework(WorkerSpec(topo, phys, wid, batch_size=batch), op, io), io


def sent(io: Recorder) -> list[tuple]:
    return [(kind, dst, stream, decode_rows(p)) for kind, dst, stream, ps in io.sent for p in ps]


def per_link(io: Recorder) -> dict[tuple, list]:
    """The entries sent on each link, in order (links are independent of each other)."""
    out: dict[tuple, list] = {}
    for kind, dst, stream, rows in sent(io):
        out.setdefault((kind, dst, stream), []).append(rows)
    return out


@settings(max_examples=150, deadline=None)
@given(
    grouping=st.sampled_from(GROUPINGS),
    par=st.integers(1, 5),
    batch=st.integers(1, 12),
    multicast=st.booleans(),
    chunks=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    flush_after=st.sets(st.integers(0, 5)),
)
def test_emit_rows_sends_what_emit_row_by_row_sends(
    grouping: str, par: int, batch: int, multicast: bool, chunks: list[int], flush_after: set
) -> None:
    one, io_one = framework(grouping, par, batch, multicast)
    many, io_many = framework(grouping, par, batch, multicast)
    seq = 0
    for i, n in enumerate(chunks):
        rows = [[1, seq + k, 0.5, b"x"] for k in range(n)]
        seq += n
        for r in rows:
            one.emit(list(r))
        many.emit_rows([list(r) for r in rows])
        if i in flush_after:  # the turn ends: finished batches leave
            one.push()
            many.push()
    one.flush(force=True)
    many.flush(force=True)
    assert per_link(io_many) == per_link(io_one)
    assert many.sent_to == one.sent_to
    assert many.serializations == one.serializations
    assert {s: r.emitted for s, r in many.routers.items()} == {
        s: r.emitted for s, r in one.routers.items()
    }
    assert sum(len(rows) for *_, rows in sent(io_many)) >= seq


def test_a_batch_size_shrunk_below_what_is_buffered_sends_at_once() -> None:
    fw, io = framework("shuffle", 1, 10, False)
    fw.emit_rows([[1, s, 0.0, b""] for s in range(6)])
    fw.set_batch_size(4)  # a BATCH control tuple came meanwhile
    fw.emit_rows([[1, 6, 0.0, b""]])
    fw.push()
    (_, _, _, rows), *_ = sent(io)
    assert [r[1] for r in rows] == list(range(7))


class Plain(SequenceSource):  # overrides next_batch only: the inherited next_rows must not run
    def next_batch(self, emit, max_count):  # noqa: ANN001, ANN201 - a test double
        return super().next_batch(emit, max_count)


def test_next_rows_only_when_it_sits_beside_next_batch() -> None:
    assert batch_hook(SequenceSource(count=1), "next_rows", "next_batch") is not None
    assert batch_hook(Plain(count=1), "next_rows", "next_batch") is None
    assert batch_hook(Spout(), "next_rows", "next_batch") is None


def test_a_spout_with_next_rows_emits_what_next_batch_emits() -> None:
    outs = []
    for use_rows in (True, False):
        fw, io = framework("shuffle", 3, 7, False)
        if not use_rows:
            fw._next_rows = None
        fw.control(ControlTuple(Control.ACTIVATE, {}))
        while not fw.done:
            fw.step_spout()
            fw.flush()
        outs.append({k: [[r[:2] for r in rows] for rows in v] for k, v in per_link(io).items()})
    assert outs[0] == outs[1]
    data = [r for k, v in outs[0].items() if k[2] in (1, 2) for rows in v for r in rows]
    assert sorted(data) == sorted([[1, s] for s in range(10)] * 2)


def test_a_batch_larger_than_a_frame_leaves_when_a_frame_is_full() -> None:
    fw, io = framework("shuffle", 1, 5000, False)
    fw.rows_per_entry = 100  # as if learnt: a frame holds 100 of these rows
    fw.set_batch_size(5000)
    fw.emit_rows([[1, s, 0.0, b""] for s in range(350)])
    fw.push()
    sent_rows = {link: sum(map(len, entries)) for link, entries in per_link(io).items()}
    assert len(sent_rows) == 3  # sink, and other's two workers
    assert all(n and n % 100 == 0 for n in sent_rows.values()), sent_rows
    assert all(len(rows) < 100 for rows in fw.out.values())  # the rest waits
    assert sum(sent_rows.values()) + sum(map(len, fw.out.values())) == 2 * 350


def test_a_spout_flat_out_sends_whole_frames_and_the_rest_after_the_max_delay() -> None:
    fw, io = framework("global", 1, 1, False)  # batch 1: every row is a finished batch
    fw.rows_per_entry = 100  # as if learnt: a frame holds 100 of these rows
    fw.flat_out = True
    fw.emit_rows([[1, s, 0.0, b""] for s in range(150)])
    fw.flush()
    # the sink's link (150 rows) sent one full frame; other's two workers (75 each) none
    assert [sum(map(len, e)) for e in per_link(io).values()] == [100]
    assert sorted(map(len, fw.ready.values())) == [50, 75, 75]
    assert 0 < fw.next_deadline() <= fw.max_delay + 1e-9
    fw.flush()  # nothing new, not due yet: still held
    assert sum(map(len, fw.ready.values())) == 200
    fw.now += fw.max_delay
    fw.flush()
    assert not fw.ready and not fw.ready_since
    links = per_link(io)
    assert sorted(sum(map(len, e)) for e in links.values()) == [75, 75, 150]
    for entries in links.values():  # in order on every link
        seqs = [r[1] for rows in entries for r in rows]
        assert seqs == sorted(seqs)


def test_a_spout_not_flat_out_or_a_forced_flush_holds_nothing() -> None:
    for flat_out, force in ((False, False), (True, True)):
        fw, io = framework("global", 1, 1, False)
        fw.rows_per_entry = 100
        fw.flat_out = flat_out
        fw.emit_rows([[1, s, 0.0, b""] for s in range(150)])
        fw.flush(force=force)
        assert not fw.ready
        assert sorted(sum(map(len, e)) for e in per_link(io).values()) == [75, 75, 150]


def test_step_spout_says_flat_out_only_unthrottled_with_more_to_come() -> None:
    fw, _ = framework("global", 1, 10, False)
    fw.op = resolve_operator("sequence_source")(count=10_000)
    fw._next_rows = fw.op.next_rows
    fw.active = True
    fw.step_spout()
    assert fw.flat_out
    fw.rate = 1000.0
    fw.tokens = 5.0
    fw.step_spout()
    assert not fw.flat_out


def test_a_spout_flat_out_holds_nothing_for_a_chained_receiver() -> None:
    """A worker of the same chain gets its rows by function call: no frame to fill."""
    fw, io = framework("global", 1, 1, False)
    fw.rows_per_entry = 100
    fw.flat_out = True
    sink = fw.spec.physical.of_node("sink")[0].worker_id
    got: list[Inbound] = []

    class Peer:
        def deliver(self, item: Inbound) -> None:
            got.append(item)

    fw.chained[sink] = Peer()
    fw.emit_rows([[1, s, 0.0, b""] for s in range(130)])
    fw.flush()
    # the chained sink has all 130 rows at once; other's two workers (65 each) still wait
    assert [len(i.rows) for i in got] == [130] and not io.sent
    assert sorted(map(len, fw.ready.values())) == [65, 65]
