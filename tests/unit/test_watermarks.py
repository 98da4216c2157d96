"""Watermarks: the pure parts, and the framework layer against a recording transport.

A spout's watermark follows the time field of what it emitted (bounded
out-of-orderness) and leaves behind that data on every path; a bolt's is the
minimum over its live input links, moves the operator's windows, and is passed
on; end of stream closes everything; an idle input stops holding it back.
"""

from __future__ import annotations

import math

import pytest
from test_framework import Recorder

from typhoon.operators import resolve_operator
from typhoon.runtime.framework import EOS_PAYLOAD, Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import EOS_STREAM, Inbound
from typhoon.runtime.watermarks import (
    InputWatermarks,
    WatermarkGenerator,
    WatermarkSpec,
    parse_watermark,
    watermark_payload,
)
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import Control, ControlTuple, decode_rows, encode_control, encode_rows

PIPELINE = """
name: wmtest
spouts:
  - id: events
    operator: event_source
    args: {count: 2000, seed: 3, keys: 4, step_ms: 2, disorder_ms: 30}
    parallelism: 2
    watermark: {time_field: ts, out_of_order_ms: 40, interval_ms: 1, idle_timeout_ms: 100}
bolts:
  - id: window
    operator: window_aggregate
    args: {key: key, time_field: ts, size_ms: 100, aggregate: count}
    parallelism: 2
  - id: sink
    operator: collect
    parallelism: 3
streams:
  - from: events
    to: window
    grouping: {type: fields, fields: [key]}
  - from: window
    to: sink
    grouping: all
"""


def make(node: str, index: int = 0, multicast: bool = False):
    topo = load_topology_text(PIPELINE, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    wid = phys.of_node(node)[index].worker_id
    spec = WorkerSpec(topo, phys, wid, batch_size=1000)
    n = topo.nodes[node]
    io = Recorder(multicast)
    return Framework(spec, resolve_operator(n.operator)(**n.args), io), io, phys


def watermarks(io: Recorder) -> list[tuple[str, object, tuple]]:
    out = []
    for kind, dst, stream, payloads in io.sent:
        if stream == EOS_STREAM:
            for p in payloads:
                wm = parse_watermark(p)
                if wm is not None:
                    out.append((kind, dst, wm))
    return out


# ----- pure parts ------------------------------------------------------------------------


def test_payload_round_trip_and_malformed():
    assert parse_watermark(watermark_payload(-5, True, 3, 2)) == (-5, True, 3, 2)
    assert parse_watermark(b"\x91\x92\xa2wm\x01") is None
    assert parse_watermark(b"garbage") is None


def test_generator_bounded_out_of_orderness_and_bad_times():
    gen = WatermarkGenerator(WatermarkSpec("ts", 10), 1)
    assert gen.current(0) is None
    gen.observe_rows([["a", 100], ["a", 95], ["a", "x"], ["a", math.inf], ["a", 120.5]])
    gen.observe(["short"])
    assert gen.current(0) == 110  # floor(120.5 - 10): never ahead of the bound
    assert gen.bad == 3
    clock = WatermarkGenerator(WatermarkSpec(None, 50, "processing"), None)
    assert clock.current(1_000.0) == 950


def test_input_watermarks_minimum_channels_and_idle():
    inw = InputWatermarks()
    inw.update(1, 100, False, 0, 1)
    assert inw.combined({1, 2}) == (None, False)  # 2 has said nothing: it holds back
    inw.update(2, 50, False, 0, 2)  # 2 sends on two channels: unicast and group 7
    assert inw.combined({1, 2}) == (None, False)
    inw.update(2, 80, False, 7, 0)
    assert inw.combined({1, 2}) == (50, False)
    inw.update(2, 90, False, 0, 2)
    assert inw.combined({1, 2}) == (80, False)
    assert inw.combined({1}) == (100, False)  # 2 finished
    inw.update(1, 100, True, 0, 1)
    assert inw.combined({1, 2}) == (80, False)  # 1 idle: only 2 counts
    inw.update(2, 90, True, 0, 2)
    assert inw.combined({1, 2}) == (None, True)
    assert inw.active(1) and not inw.active(1)
    assert inw.combined({1, 2}) == (100, False)
    inw.update(1, 60, False, 0, 1)  # a lower value never moves a link back
    assert inw.of(1) == 100


# ----- the framework layer ---------------------------------------------------------------


def test_spout_sends_watermark_behind_its_data_on_every_link():
    fw, io, phys = make("events")
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.now += 1.0
    fw.step_spout()
    windows = sorted(w.worker_id for w in phys.of_node("window"))
    wms = watermarks(io)
    assert sorted(d for _, d, _ in wms) == windows
    # the data of the chunk went before the watermark, and no tuple after it is older
    rows = [r for k, d, s, ps in io.sent if s == 1 for p in ps for r in decode_rows(p)]
    emitted = max(r[1] for r in rows)
    wm = wms[0][2][0]
    assert wm == emitted - 40
    first = next(i for i, x in enumerate(io.sent) if x[2] == EOS_STREAM)
    assert all(x[2] == EOS_STREAM for x in io.sent[first:])
    assert fw.metrics()["watermark"] == wm
    encode_control(ControlTuple(Control.METRIC_RESP, {"request_id": 1, "worker": 5,
                                                      "metrics": fw.metrics()}))  # fmt: skip


def test_bolt_takes_the_minimum_fires_windows_and_passes_it_on():
    fw, io, phys = make("window", multicast=True)
    a, b = (w.worker_id for w in phys.of_node("events"))
    sinks = sorted(w.worker_id for w in phys.of_node("sink"))
    key = next(k for k in ("k0", "k1", "k2", "k3") if fw.keyed.group_of(k) in fw.keyed.owned)
    fw.deliver(Inbound(a, 1, [encode_rows([[key, 10, 1], [key, 150, 1]])]))
    fw.deliver(Inbound(a, EOS_STREAM, [watermark_payload(200, False, 0, 1)]))
    assert fw.watermark is None and watermarks(io) == []  # b has said nothing yet
    fw.deliver(Inbound(b, EOS_STREAM, [watermark_payload(120, False, 0, 1)]))
    assert fw.watermark == 120
    out = [(k, d, r) for k, d, r in io.tuples(stream=2)]
    assert [r for _, _, r in out] == [[key, 0, 100, 1]]  # [0, 100) closed, [100, 200) not
    assert {k for k, _, _ in out} == {"group"}
    # passed on behind the results: unicast to each sink (2 channels) and on the group path
    wms = watermarks(io)
    assert sorted((k, d) for k, d, _ in wms) == sorted(
        [("unicast", s) for s in sinks] + [("group", tuple(sinks))]
    )
    assert {w for _, _, w in wms} == {(120, False, 0, 2), (120, False, 2, 0)}
    last_data = max(i for i, x in enumerate(io.sent) if x[2] == 2)
    first_wm = min(i for i, x in enumerate(io.sent) if x[2] == EOS_STREAM)
    assert last_data < first_wm
    # b finishes: a alone counts; then a finishes: +inf closes every window
    fw.deliver(Inbound(b, EOS_STREAM, [EOS_PAYLOAD]))
    assert fw.watermark == 200
    assert [r for _, _, r in io.tuples(stream=2)][-1] == [key, 100, 200, 1]
    fw.deliver(Inbound(a, EOS_STREAM, [EOS_PAYLOAD]))
    assert fw.watermark == math.inf and fw.done
    metrics = fw.metrics()
    assert metrics["watermark_closed"] == 1 and "watermark" not in metrics
    # what METRIC_RESP can carry (msgpack numbers, no None): the wire's own check
    encode_control(ControlTuple(Control.METRIC_RESP, {"request_id": 1, "worker": 5,
                                                      "metrics": metrics}))  # fmt: skip


def test_idle_input_stops_holding_the_watermark_back():
    fw, io, phys = make("window")
    a, b = (w.worker_id for w in phys.of_node("events"))
    fw.deliver(Inbound(a, EOS_STREAM, [watermark_payload(500, False, 0, 1)]))
    fw.deliver(Inbound(b, EOS_STREAM, [watermark_payload(100, False, 0, 1)]))
    assert fw.watermark == 100
    fw.deliver(Inbound(b, EOS_STREAM, [watermark_payload(100, True, 0, 1)]))
    assert fw.watermark == 500  # b idle
    fw.deliver(Inbound(a, EOS_STREAM, [watermark_payload(600, True, 0, 1)]))
    # every input idle: the watermark stays, and our receivers hear that we are idle
    assert fw.wm_idle and fw.watermark == 500
    assert watermarks(io)[-1][2][:2] == (500, True)
    fw.deliver(Inbound(b, 1, [encode_rows([["k0", 150, 1]])]))  # b sends data again
    assert fw.wm_in.idle == {a} and not fw.wm_idle
    assert watermarks(io)[-1][2][:2] == (500, False)
    assert fw.watermark == 500  # b's 100 holds it, and it never goes back


def test_idle_spout_says_so_after_the_timeout():
    fw, io, phys = make("events", index=1)
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.step_spout()
    n = len(watermarks(io))
    fw.now += 0.05
    fw.tick()
    assert len(watermarks(io)) == n  # not idle yet
    fw.now += 0.2
    fw.tick()
    assert [w[:2] for _, _, w in watermarks(io)[n:]] == [(fw.watermark, True)] * 2


def test_malformed_watermark_is_counted():
    fw, io, phys = make("window")
    a = phys.of_node("events")[0].worker_id
    fw.deliver(Inbound(a, EOS_STREAM, [encode_rows([["wm", "x", 0, 0, 1]])]))
    assert fw.io.stats.drops == {"malformed_punctuation": 1}
    assert fw.watermark is None


@pytest.mark.parametrize("multicast", [False, True])
def test_watermark_from_unknown_sender_is_not_processed(multicast):
    fw, io, phys = make("window", multicast=multicast)
    fw.deliver(Inbound(999, EOS_STREAM, [watermark_payload(10**6, False, 0, 1)]))
    assert fw.watermark is None
    assert fw.io.stats.drops == {"not_upstream": 1}


def test_watermark_waits_while_keys_move():
    """A rescale: while tuples wait here for their keys' state, or keys leaving here have
    not left, the watermark does not advance; it catches up once they have."""
    from typhoon.runtime.migration import Migration

    fw, io, phys = make("window")
    a, b = (w.worker_id for w in phys.of_node("events"))
    fw.holding = {3: 99}  # key group 3's state is on its way from worker 99
    fw.deliver(Inbound(a, EOS_STREAM, [watermark_payload(300, False, 0, 1)]))
    fw.deliver(Inbound(b, EOS_STREAM, [watermark_payload(200, False, 0, 1)]))
    assert fw.watermark is None and watermarks(io) == []
    fw.holding = {}
    fw.migration = Migration(1, {5: 77}, {}, {(a, 1)})  # group 5 leaves after a's handoff
    fw.watermark_released()
    assert fw.watermark is None
    fw.migration.shipped = True
    fw.watermark_released()
    assert fw.watermark == 200 and watermarks(io)[-1][2][0] == 200


def test_processing_clock_spout_sends_its_wall_clock(monkeypatch):
    """``clock: processing``: the source's wall clock minus out_of_order_ms, sent every
    interval while the source is active, whether or not it emitted."""
    from typhoon.runtime import watermarks as wmod

    text = PIPELINE.replace(
        "watermark: {time_field: ts, out_of_order_ms: 40, interval_ms: 1, idle_timeout_ms: 100}",
        "watermark: {clock: processing, out_of_order_ms: 250, interval_ms: 100}",
    )
    topo = load_topology_text(text, "t.yaml")
    assert topo.nodes["events"].watermark["clock"] == "processing"
    phys = schedule(topo, ["h1"], 7)
    wid = phys.of_node("events")[0].worker_id
    io = Recorder()
    fw = Framework(WorkerSpec(topo, phys, wid, batch_size=1000),
                   resolve_operator("event_source")(count=10), io)  # fmt: skip
    wall = [1_000.0]
    monkeypatch.setattr(wmod.time, "time", lambda: wall[0])
    fw.tick()
    assert watermarks(io) == []  # not active yet
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    fw.tick()
    assert {w[:2] for _, _, w in watermarks(io)} == {(1_000_000 - 250, False)}
    n = len(watermarks(io))
    wall[0] += 0.05
    fw.now += 0.05
    fw.tick()
    assert len(watermarks(io)) == n  # within the interval
    wall[0] += 0.1
    fw.now += 0.1
    fw.tick()
    assert {w[0] for _, _, w in watermarks(io)[n:]} == {1_000_150 - 250}
