"""Storm's event logger as the live-debug benchmark runs it: switched by SIGNAL, one more
serialization per tuple while on; and the scenario's pure arithmetic over a run's timelines."""

from __future__ import annotations

import pytest

from benchmarks.operators import EVENT_LOG_STREAM, EventLogger, EventLoggingSource
from benchmarks.scenario import scenarios
from benchmarks.scenarios.live_debug import (
    LiveDebug,
    cpu_ms_per_1000,
    phase_median,
    serializations_per_tuple,
    topology,
)
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Transport
from typhoon.topology import schedule
from typhoon.wire import Control, ControlTuple, decode_rows


class Recorder(Transport):
    """Keeps what the framework sends: (destination, stream id, payloads)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[int, int, list[bytes]]] = []
        self.replies: list[ControlTuple] = []

    def poll(self, timeout):
        return []

    def send(self, dst, stream, payloads):
        self.sent.append((dst, stream, list(payloads)))

    def reply(self, ct):
        self.replies.append(ct)

    def tuples(self, stream: int) -> list[list]:
        return [row for _, s, ps in self.sent if s == stream for p in ps for row in decode_rows(p)]


def _source(app_copy: bool) -> tuple[Framework, Recorder, dict[str, int]]:
    topo = topology("ld", app_copy=app_copy, count=3 * 256)
    phys = schedule(topo, ["h1", "h2", "h3"], 7)
    wid = phys.of_node("source")[0].worker_id
    node = topo.nodes["source"]
    io = Recorder()
    fw = Framework(WorkerSpec(topo, phys, wid, batch_size=10), EventLoggingSource(**node.args), io)
    streams = {s.name: s.id for s in topo.outputs_of("source")}
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    return fw, io, streams


def test_a_signal_switches_the_second_serialized_copy_on_and_the_next_one_off() -> None:
    fw, io, streams = _source(app_copy=True)
    fw.step_spout()  # 256 tuples, no copy
    assert fw.serializations == 256 and io.tuples(streams[EVENT_LOG_STREAM]) == []
    fw.control(ControlTuple(Control.SIGNAL, {"version": 1}))
    fw.step_spout()  # 256 tuples, each serialized and sent twice
    assert fw.serializations == 256 + 2 * 256
    fw.flush(force=True)
    copies = io.tuples(streams[EVENT_LOG_STREAM])
    data = io.tuples(streams["default"])
    assert copies == data[256:512]  # the same tuples, in order, a second time
    assert io.replies[-1].body["metrics"] == {"ack": "SIGNAL", "version": 1}
    fw.control(ControlTuple(Control.SIGNAL, {"version": 2}))
    fw.step_spout()  # off again; the source is exhausted and finishes
    assert fw.serializations == 3 * 256 + 256
    result = fw.op.result()
    assert result["emitted"] == 768 and result["copies"] == 256
    # on at 256 tuples, off at 512, and end of stream's on_signal after the last one
    assert [s[1:] for s in result["switches"]] == [[1, 256], [0, 512], [1, 768]]
    marks = result["marks"]
    assert marks[-1][1:3] == [768, 256] and all(m[3] >= 0 for m in marks)


def test_without_the_event_log_stream_the_copy_is_unrouted_not_sent() -> None:
    fw, io, _ = _source(app_copy=False)
    fw.control(ControlTuple(Control.SIGNAL, {"version": 1}))
    fw.step_spout()
    assert fw.unrouted == 256 and fw.serializations == 256


def test_event_logger_counts_copies_and_keeps_a_ring() -> None:
    logger = EventLogger(ring=3)
    for i in range(5):
        logger.process([1, i, 0.0, b"x"], lambda *_: None)
    assert logger.result() == {"received": 5}
    assert [v[1] for v in logger.ring] == [2, 3, 4]
    with pytest.raises(ValueError, match="ring"):
        EventLogger(ring=0)


def test_scenario_is_registered_as_fig_12() -> None:
    assert LiveDebug in scenarios() and LiveDebug.figure == "Fig. 12"


def test_phase_arithmetic() -> None:
    series = [(float(t), 100.0 if t < 10 else 90.0) for t in range(20)]
    assert phase_median(series, 2, 10) == 100.0
    assert phase_median(series, 11, 20) == 90.0
    assert phase_median(series, 30, 40) is None
    # marks: [wall, emitted, copies, cpu]; 1 ms CPU per 1000 tuples, then 2 ms
    marks = [[t, 1000 * t, 0, 0.001 * t] for t in range(11)]
    marks += [[t, 1000 * t, 0, 0.01 + 0.002 * (t - 10)] for t in range(11, 21)]
    assert cpu_ms_per_1000(marks, 0, 10) == pytest.approx(1.0)
    assert cpu_ms_per_1000(marks, 11, 20) == pytest.approx(2.0)
    assert cpu_ms_per_1000(marks, 50, 60) is None
    # framework counters polled: (time, serializations, tuples out)
    polled = [(0.0, 0, 0), (5.0, 500, 500), (10.0, 1000, 1000), (15.0, 2000, 1500)]
    assert serializations_per_tuple(polled, 0, 10) == pytest.approx(1.0)
    assert serializations_per_tuple(polled, 10, 15) == pytest.approx(2.0)


def test_pairs_cost_recall_counts_the_exact_top_pairs_found():
    from collections import Counter

    from benchmarks.scenarios import pairs_cost

    exact = Counter({(f"a{i}", "b1"): 100 - i for i in range(30)}) + Counter({("a0", "b2"): 999})
    sample = Counter({(f"a{i}", "b1"): 1 for i in range(10)})
    # b2 is not b[0]'s key: left out; 10 of the exact top 20 toward b1 are in the sample
    assert pairs_cost.recall(sample, exact, {"b1"}) == 0.5
    assert pairs_cost.recall(Counter(), exact, {"b1"}) == 0.0
    assert pairs_cost.recall(sample, exact, {"b9"}) is None
