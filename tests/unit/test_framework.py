"""Framework layer against a recording transport: routing, batching, control tuples."""

from __future__ import annotations

import msgpack
import pytest

from typhoon.operators import resolve_operator
from typhoon.runtime.framework import EOS_PAYLOAD, Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import EOS_STREAM, Inbound, Transport
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import (
    Control,
    ControlTuple,
    decode_control,
    decode_rows,
    encode_control,
    encode_rows,
)

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
    parallelism: 3
    stateful: true
    config: {max_parallelism: 1}  # one key group, on worker 0: every key is its own
streams:
  - from: source
    to: split
    grouping: shuffle
  - from: split
    to: count
    grouping: {type: fields, fields: [word]}
"""

BROADCAST = """
name: bc
spouts:
  - id: source
    operator: sequence_source
    args: {count: 10}
bolts:
  - id: sink
    operator: sequence_check
    parallelism: 4
streams:
  - from: source
    to: sink
    grouping: all
"""


class Recorder(Transport):
    def __init__(self, multicast: bool = False) -> None:
        super().__init__()
        self.multicast = multicast
        self.sent: list[tuple[str, object, int, list[bytes]]] = []
        self.replies: list[ControlTuple] = []
        self.groups: list[int] = []
        self.settled: list[list[int]] = []

    def poll(self, timeout):
        return []

    def send(self, dst, stream, payloads):
        self.sent.append(("unicast", dst, stream, list(payloads)))

    def send_group(self, group, dsts, payloads, stream=None):
        self.groups.append(group)
        self.sent.append(
            ("group", tuple(dsts), group if stream is None else stream, list(payloads))
        )

    def reply(self, ct):
        self.replies.append(ct)

    def settle(self, dsts):
        self.settled.append(list(dsts))
        return []

    def tuples(self, stream=None):
        return [
            (kind, dst, row)
            for kind, dst, s, ps in self.sent
            for p in ps
            if stream is None or s == stream
            for row in decode_rows(p)
        ]


def make(text: str, node: str, index: int = 0, multicast: bool = False, batch: int = 1):
    topo = load_topology_text(text, "t.yaml")
    phys = schedule(topo, ["h1", "h2"], 7)
    wid = phys.of_node(node)[index].worker_id
    spec = WorkerSpec(topo, phys, wid, batch_size=batch)
    n = topo.nodes[node]
    op = resolve_operator(n.operator)(**n.args)
    io = Recorder(multicast)
    return Framework(spec, op, io), io, phys


def test_spout_waits_for_activate_then_emits_round_robin():
    fw, io, phys = make(WORDCOUNT, "source")
    fw.step_spout()
    assert io.sent == []
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.step_spout()
    dsts = [d for _, d, _ in io.tuples(stream=1)]
    assert set(dsts) == {w.worker_id for w in phys.of_node("split")}
    assert fw.done  # 10 sentences < one chunk: exhausted, EOS sent
    eos = [(d, ps) for k, d, s, ps in io.sent if s == EOS_STREAM]
    assert sorted(d for d, _ in eos) == sorted(w.worker_id for w in phys.of_node("split"))
    assert all(ps == [EOS_PAYLOAD] for _, ps in eos)


def test_batching_by_size_and_delay():
    fw, io, _ = make(WORDCOUNT, "split", batch=4)
    fw.deliver(Inbound(1, 1, [encode_rows([["a b c"]])]))
    assert io.sent == []  # 3 tuples spread over receivers, none full
    fw.now += 1.0
    fw.flush()
    assert len(io.tuples()) == 3
    assert fw.out == {}


def test_fields_grouping_keeps_key_on_one_worker():
    fw, io, _ = make(WORDCOUNT, "split")
    fw.deliver(Inbound(1, 1, [encode_rows([["x y x y x"]])] * 5))
    by_word: dict[str, set[int]] = {}
    for _, dst, (word,) in io.tuples(stream=2):
        by_word.setdefault(word, set()).add(dst)
    assert all(len(d) == 1 for d in by_word.values())


def test_broadcast_serializes_once_with_multicast():
    fw, io, phys = make(BROADCAST, "source", multicast=True)
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.step_spout()
    assert fw.serializations == 10
    data = [x for x in io.sent if x[2] == 1]
    assert {x[0] for x in data} == {"group"}
    # end of stream goes to each receiver once, after the transport confirmed that the
    # receiver holds every one-to-many frame (they take another path through the switch)
    eos = [x for x in io.sent if x[2] == EOS_STREAM]
    sinks = sorted(w.worker_id for w in phys.of_node("sink"))
    assert [(x[0], x[1]) for x in eos] == [("unicast", d) for d in sinks]
    assert all(x[3] == [EOS_PAYLOAD] for x in eos)
    assert io.settled == [sinks]
    assert set(io.groups) == {1}


def test_broadcast_serializes_per_receiver_without_multicast():
    fw, io, phys = make(BROADCAST, "source", multicast=False)
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.step_spout()
    assert fw.serializations == 40
    assert len(io.tuples(stream=1)) == 40


def test_routing_control_tuple_replaces_next_hops():
    fw, io, phys = make(WORDCOUNT, "split")
    only = phys.of_node("count")[0].worker_id
    body = {"stream": 2, "policy": "global", "next_hops": [only], "version": 9}
    fw.control(ControlTuple(Control.ROUTING, body))
    fw.deliver(Inbound(1, 1, [encode_rows([["p q r s"]])]))
    assert io.tuples() == []  # serialized; they leave at the end of the event-loop turn
    fw.tick()
    assert {d for _, d, _ in io.tuples(stream=2)} == {only}
    assert io.replies[-1].body["metrics"] == {"ack": "ROUTING", "version": 9}


def test_routing_for_unknown_stream_is_refused():
    fw, _, _ = make(WORDCOUNT, "split")
    with pytest.raises(ValueError):
        fw.control(
            ControlTuple(
                Control.ROUTING, {"stream": 1, "policy": "shuffle", "next_hops": [], "version": 1}
            )
        )


def test_signal_flushes_stateful_cache():
    fw, io, _ = make(WORDCOUNT, "count")
    fw.deliver(Inbound(2, 2, [encode_rows([["w"]])] * 3))
    assert io.sent == []  # no output stream, and cache not flushed yet
    assert fw.op.flushed.get("w") is None
    fw.control(ControlTuple(Control.SIGNAL, {"version": 4}))
    assert fw.op.flushed["w"] == 3  # what was flushed (keyed state: it moves with the key)
    assert fw.op.result() == {"counts": {"w": 3}, "keys": 1, "key_groups": 1}
    assert io.replies[-1].body["metrics"] == {"ack": "SIGNAL", "version": 4}


def test_metric_req_gets_metric_resp():
    fw, io, _ = make(WORDCOUNT, "count")
    fw.deliver(Inbound(2, 2, [encode_rows([["w"]])] * 3))
    fw.control(ControlTuple(Control.METRIC_REQ, {"request_id": 77}))
    resp = io.replies[-1]
    assert resp.type == Control.METRIC_RESP
    assert resp.body["request_id"] == 77
    assert resp.body["metrics"]["in"] == {"2": 3}
    assert "queue" in resp.body["metrics"] and "proc_us" in resp.body["metrics"]


def test_metrics_the_wire_cannot_carry_are_left_out_and_counted_not_fatal():
    """An operator reporting a list, a None or an object: METRIC_RESP's schema has no such
    values, and a reply that raised would kill the worker.  Lists become index maps,
    the rest is left out and counted."""
    from typhoon.wire import encode_control

    fw, io, _ = make(WORDCOUNT, "count")
    fw._op_metrics = lambda: {"op": {"top": [["a", 3]], "none": None, "obj": object(), "on": True}}
    fw.control(ControlTuple(Control.METRIC_REQ, {"request_id": 9}))
    resp = io.replies[-1]
    encode_control(resp)  # raised before: ValueError from the schema
    assert resp.body["metrics"]["op"] == {"top": {"0": {"0": "a", "1": 3}}, "on": 1}
    assert io.stats.drops["unsendable_metric"] == 2
    fw.control(ControlTuple(Control.METRIC_REQ, {"request_id": 10}))
    assert io.stats.drops["unsendable_metric"] == 4


def test_input_rate_limits_spout():
    fw, io, _ = make(BROADCAST.replace("count: 10", "count: 100000"), "source")
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.control(ControlTuple(Control.INPUT_RATE, {"rate": 1000.0}))
    t = fw.now
    for i in range(100):  # one simulated second in 10 ms steps
        fw.now = t + (i + 1) * 0.01
        fw.step_spout()
    assert 900 <= fw.op.next_seq <= 1050


def test_deactivate_stops_spout_and_batch_size_applies():
    fw, io, _ = make(BROADCAST.replace("count: 10", "count: 1000"), "source")
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.control(ControlTuple(Control.BATCH_SIZE, {"size": 7, "max_delay_ms": 3.0}))
    assert fw.batch_size == 7 and fw.max_delay == pytest.approx(0.003)
    fw.control(ControlTuple(Control.DEACTIVATE, {}))
    fw.step_spout()
    assert fw.op.next_seq == 0


def test_drain_finishes_spout_with_eos():
    fw, io, _ = make(BROADCAST.replace("count: 10", "count: 1000"), "source")
    fw.control(ControlTuple(Control.DRAIN, {"version": 5}))
    assert fw.done
    assert io.replies[-1].body["metrics"] == {"ack": "DRAIN", "version": 5}


def test_bolt_finishes_after_eos_from_every_upstream():
    fw, io, phys = make(WORDCOUNT, "count")
    splits = [w.worker_id for w in phys.of_node("split")]
    fw.deliver(Inbound(splits[0], 2, [encode_rows([["w"]])]))
    fw.deliver(Inbound(splits[0], EOS_STREAM, [EOS_PAYLOAD]))
    assert not fw.done
    fw.deliver(Inbound(splits[1], EOS_STREAM, [EOS_PAYLOAD]))
    assert fw.done
    assert fw.op.result()["counts"] == {"w": 1}


def test_malformed_tuples_are_counted_not_fatal():
    fw, io, _ = make(WORDCOUNT, "count")
    bad_rows = encode_rows([["ok"], {"a": 1}, "x"])  # two rows that are not arrays
    fw.deliver(Inbound(2, 2, [b"\xc1garbage", msgpack.packb({"a": 1}), encode_rows([["ok"]])]))
    fw.deliver(Inbound(2, 2, [bad_rows]))
    assert io.stats.drops == {"malformed_batch": 2, "malformed_tuple": 2}
    assert fw.op.result()["counts"] == {"ok": 2}


def test_eos_reaches_a_receiver_removed_by_routing():
    fw, io, phys = make(WORDCOUNT, "source")
    splits = [w.worker_id for w in phys.of_node("split")]
    fw.control(
        ControlTuple(
            Control.ROUTING,
            {"stream": 1, "policy": "global", "next_hops": [splits[0]], "version": 2},
        )
    )
    fw.control(ControlTuple(Control.DRAIN, {"version": 3}))
    eos = sorted(d for k, d, s, ps in io.sent if s == EOS_STREAM)
    assert eos == sorted(splits)


def test_sender_added_at_run_time_is_waited_for():
    """A new sender is announced by UPSTREAM (the reconfiguration's step before any route
    to us changes); from then on its data counts and its end of stream is awaited."""
    fw, io, phys = make(WORDCOUNT, "count")
    splits = [w.worker_id for w in phys.of_node("split")]
    fw.control(
        decode_control(encode_control(ControlTuple(Control.UPSTREAM, {"add": [99], "version": 4})))
    )
    fw.deliver(Inbound(99, 2, [encode_rows([["w"]])]))  # a new split worker
    for s in splits:
        fw.deliver(Inbound(s, EOS_STREAM, [EOS_PAYLOAD]))
    assert not fw.done
    assert fw.received_from == {(99, 2): 1}
    fw.deliver(Inbound(99, EOS_STREAM, [EOS_PAYLOAD]))
    assert fw.done


def test_data_from_a_worker_that_is_not_upstream_is_counted_not_processed():
    """A downstream worker (or any other) sending data or end of stream to us: dropped
    and counted in ``not_upstream``; the operator never sees it, nothing waits for it."""
    fw, io, phys = make(WORDCOUNT, "split")
    counts = [w.worker_id for w in phys.of_node("count")]
    source = phys.of_node("source")[0].worker_id
    fw.deliver(Inbound(counts[0], 1, [encode_rows([["a b"], ["c"]])]))
    fw.deliver(Inbound(77, 1, [encode_rows([["d"]])]))
    fw.deliver(Inbound(counts[1], EOS_STREAM, [EOS_PAYLOAD]))
    assert fw.io.stats.drops == {"not_upstream": 4}
    assert fw.received_from == {} and fw.tuples_in == {} and fw.pending_upstream == {source}
    fw.control(
        decode_control(
            encode_control(ControlTuple(Control.UPSTREAM, {"remove": [source], "version": 5}))
        )
    )
    fw.deliver(Inbound(source, 1, [encode_rows([["late"]])]))  # removed: no longer a sender
    assert fw.io.stats.drops == {"not_upstream": 5} and fw.received_from == {}


def test_frames_after_a_senders_end_of_stream_are_counted_not_processed():
    """A released receiver still gets one-to-many copies: after the EOS they are dropped."""
    fw, io, phys = make(WORDCOUNT, "count")
    splits = [w.worker_id for w in phys.of_node("split")]
    fw.deliver(Inbound(splits[0], 2, [encode_rows([["a"]])]))
    fw.deliver(Inbound(splits[0], EOS_STREAM, [EOS_PAYLOAD]))
    fw.deliver(Inbound(splits[0], 2, [encode_rows([["b"]]), encode_rows([["c"]])]))
    assert io.stats.drops == {"after_eos": 2}
    assert fw.received_from == {(splits[0], 2): 1}
    # an UPSTREAM that adds the sender again opens its link once more
    fw.control(ControlTuple(Control.UPSTREAM, {"add": [splits[0]], "remove": [], "version": 4}))
    fw.deliver(Inbound(splits[0], 2, [encode_rows([["d"]])]))
    assert fw.received_from == {(splits[0], 2): 2}


def test_release_settles_before_and_after_the_end_of_stream():
    fw, io, phys = make(BROADCAST, "source", multicast=True)
    sinks = [w.worker_id for w in phys.of_node("sink")]
    fw.control(
        ControlTuple(
            Control.ROUTING,
            {"stream": 1, "policy": "all", "next_hops": sinks[1:], "version": 2},
        )
    )
    fw.release([sinks[0]])
    assert io.settled == [[sinks[0]], [sinks[0]]]
    assert [(d, s) for k, d, s, _ in io.sent] == [(sinks[0], EOS_STREAM)]


def test_a_bolt_counts_spout_control_as_dropped_and_keeps_working():
    """INPUT_RATE, ACTIVATE, DEACTIVATE pace a spout; a bolt never takes them silently."""
    fw, io, _ = make(WORDCOUNT, "count")
    for ct in (
        ControlTuple(Control.INPUT_RATE, {"rate": 5.0}),
        ControlTuple(Control.DEACTIVATE, {}),
        ControlTuple(Control.ACTIVATE, {}),
    ):
        fw.control(ct)
    fw.control(ControlTuple(Control.BATCH_SIZE, {"size": 9, "max_delay_ms": 4.5}))
    fw.deliver(Inbound(2, 2, [encode_rows([["w"]])] * 3))
    fw.control(ControlTuple(Control.METRIC_REQ, {"request_id": 5}))
    m = io.replies[-1].body["metrics"]
    assert m["drops"] == {"spout_control_to_bolt": 3}
    assert m["rate"] == 0.0 and m["active"] == 1 and m["in"] == {"2": 3}
    assert m["batch_size"] == 9 and m["max_delay_ms"] == 4.5
