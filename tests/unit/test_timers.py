"""Event-time timers (``context.timer`` + ``on_timer``) through the framework layer.

An operator of one's own sets a timer per key 100 ms of event time after each
tuple and one of the worker's own; they fire, oldest first, when the watermark
reaches them, before ``on_watermark``; the rest fire at end of stream.  Keyed
timers are keyed state: they are in the checkpointed mapping and leave with
their key.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from test_framework import Recorder

from typhoon.operators import BUILTINS, Bolt, Context
from typhoon.runtime.framework import EOS_PAYLOAD, Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.timers import TIMERS
from typhoon.runtime.transport import EOS_STREAM, Inbound
from typhoon.runtime.watermarks import watermark_payload
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import encode_rows

JOB = """
name: timers
spouts:
  - id: events
    operator: event_source
    args: {count: 10}
    watermark: {time_field: ts}
bolts:
  - id: quiet
    operator: model_quiet
    config: {max_parallelism: 1}
streams:
  - {from: events, to: quiet, grouping: {type: fields, fields: [key]}}
"""


class Quiet(Bolt):
    """Emits ``[key, ts, n]`` once a key has been quiet for 100 ms of event time."""

    keyed: ClassVar[bool] = True
    fields: ClassVar[tuple[str, ...]] = ("key", "at", "n")

    def open(self, context: Context) -> None:
        super().open(context)
        self.n = context.keyed_state("n", default=0)
        self.last = context.keyed_state("last", default=None)
        self.calls: list[Any] = []
        context.timer(1_000)  # the worker's own: fires once the watermark reaches 1000

    def process(self, values: list, emit: Any) -> None:
        key, ts = values[0], values[1]
        self.n[key] += 1
        self.last[key] = max(ts, self.last[key] or ts)
        self.context.timer(ts + 100, key)

    def on_timer(self, ts: float, key: Any, emit: Any) -> None:
        self.calls.append(("timer", ts, key))
        if key is not None and ts == self.last[key] + 100:  # no newer tuple since
            emit([key, ts, self.n[key]])

    def on_watermark(self, wm: float, emit: Any) -> None:
        self.calls.append(("wm", wm))


@pytest.fixture(autouse=True)
def _quiet():
    BUILTINS["model_quiet"] = Quiet
    yield
    BUILTINS.pop("model_quiet", None)


def make() -> tuple[Framework, Recorder, int]:
    topo = load_topology_text(JOB, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    wid = phys.of_node("quiet")[0].worker_id
    io = Recorder()
    fw = Framework(WorkerSpec(topo, phys, wid), Quiet(), io)
    return fw, io, phys.of_node("events")[0].worker_id


def test_timers_fire_in_order_when_the_watermark_reaches_them():
    fw, io, src = make()
    fw.deliver(Inbound(src, 1, [encode_rows([["a", 10, 1], ["b", 20, 1], ["a", 50, 1]])]))
    assert fw.metrics()["timers_pending"] == 4  # a@110, a@150, b@120, the worker's 1000
    fw.deliver(Inbound(src, EOS_STREAM, [watermark_payload(130, False, 0, 1)]))
    assert fw.op.calls == [("timer", 110, "a"), ("timer", 120, "b"), ("wm", 130)]
    fw.deliver(Inbound(src, EOS_STREAM, [watermark_payload(150, False, 0, 1)]))
    assert fw.op.calls[3:] == [("timer", 150, "a"), ("wm", 150)]
    fw.deliver(Inbound(src, 1, [encode_rows([["b", 400, 1]])]))
    fw.deliver(Inbound(src, EOS_STREAM, [EOS_PAYLOAD]))  # end of stream: +inf, all fire
    assert fw.op.calls[5:] == [("timer", 500, "b"), ("timer", 1000, None), ("wm", float("inf"))]
    assert fw.metrics()["timers_fired"] == 5 and fw.metrics()["timers_pending"] == 0
    assert fw.done


def test_emitted_on_timer_and_passed_on_behind():
    fw, io, src = make()
    out: list = []
    fw.emit = lambda values, stream="default": out.append(values)  # type: ignore[method-assign]
    fw.deliver(Inbound(src, 1, [encode_rows([["a", 10, 1], ["a", 30, 1], ["b", 5, 1]])]))
    fw.deliver(Inbound(src, EOS_STREAM, [watermark_payload(200, False, 0, 1)]))
    assert out == [["b", 105, 1], ["a", 130, 2]]  # a's timer at 110 found a newer tuple


def test_keyed_timers_are_keyed_state_and_checkpointed():
    fw, io, src = make()
    fw.deliver(Inbound(src, 1, [encode_rows([["a", 10, 1], ["a", 20, 1]])]))
    assert dict(fw.keyed.stores[TIMERS].data) == {"a": [110, 120]}
    packed = fw.keyed.pack()
    again, _, _ = make()
    again.keyed.restore(packed)
    again.deliver(Inbound(src, EOS_STREAM, [watermark_payload(115, False, 0, 1)]))
    assert again.op.calls == [("timer", 110, "a"), ("wm", 115)]
    assert fw.context.timers.snapshot() == [1000]


def test_bad_timers_are_refused_with_a_sentence():
    fw, _, _ = make()
    with pytest.raises(ValueError, match="must be a number"):
        fw.context.timer("soon")
    fw.context.keyed_declared = False
    with pytest.raises(TypeError, match="does not declare keyed = True"):
        fw.context.timer(5, "a")
