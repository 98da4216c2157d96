"""An idle source stops holding the watermark back after ``idle_timeout_ms``.

Two sources feed one window node (every worker's real framework layer, in-memory
links, the scheduler of tests/unit/test_windows_model.py); one pauses after 100
events without finishing.  With ``idle_timeout_ms`` the windows of the other go on
closing while it is silent; without, they wait for it.  When it comes back, its
events are older than the watermark the other moved on: they go to ``late``,
counted, none lost.
"""

from __future__ import annotations

from typing import Any

import pytest
from model_net import SeededNet

from typhoon.operators import BUILTINS
from typhoon.operators.events import EventSource

JOB = """
name: idle
spouts:
  - id: fast
    operator: event_source
    args: {{count: 2000, seed: 1, keys: 3, step_ms: 1, disorder_ms: 5, rate: 1000}}
    watermark: {{time_field: ts, out_of_order_ms: 5, interval_ms: 5{idle}}}
  - id: pausing
    operator: model_pausing
    args: {{count: 300, seed: 2, keys: 3, step_ms: 1, disorder_ms: 5, rate: 1000}}
    watermark: {{time_field: ts, out_of_order_ms: 5, interval_ms: 5{idle}}}
bolts:
  - id: window
    operator: window_aggregate
    args: {{key: key, time_field: ts, size_ms: 50, aggregate: count}}
    parallelism: 2
  - {{id: results, operator: collect}}
  - {{id: too_late, operator: collect}}
streams:
  - {{from: fast, to: window, grouping: {{type: fields, fields: [key]}}}}
  - {{from: pausing, to: window, grouping: {{type: fields, fields: [key]}}}}
  - {{from: window, to: results, grouping: global}}
  - {{from: window, to: too_late, stream: late, grouping: global}}
"""


class Pausing(EventSource):
    """``event_source`` that stops after 100 events until ``resume`` is set."""

    resume = False

    def next_rows(self, emit_rows: Any, max_count: int) -> bool:
        if self.next_i >= 100 and not Pausing.resume:
            return True  # nothing now, more later
        return super().next_rows(emit_rows, min(max_count, 100 - self.next_i)
                                 if self.next_i < 100 else max_count)  # fmt: skip


@pytest.fixture(autouse=True)
def _pausing():
    BUILTINS["model_pausing"] = Pausing
    Pausing.resume = False
    yield
    BUILTINS.pop("model_pausing", None)


def closed_ends(net: SeededNet) -> int:
    return max((row[2] for row in net.results("results")), default=0)


@pytest.mark.parametrize("seed", range(3))
def test_idle_source_stops_holding_the_watermark(seed):
    net = SeededNet(JOB.format(idle=", idle_timeout_ms: 100"), seed)
    fast = net.fws[net.phys.of_node("fast")[0].worker_id]
    net.run(400_000, until=lambda: fast.done and not any(net.links.values()))
    # the pausing source stopped near time 100; windows went on closing without it
    assert closed_ends(net) > 1_500
    windows = [net.fws[w.worker_id] for w in net.phys.of_node("window")]
    Pausing.resume = True
    net.run(400_000)
    counted = sum(row[3] for row in last_rows(net))
    late = net.results("too_late")
    assert late and all(t[3][1] < 1_500 for t in late)
    assert counted + len(late) == 2_000 + 300  # none lost
    assert sum(fw.metrics()["window_late"] for fw in windows) == len(late)


def last_rows(net: SeededNet) -> list:
    final = {}
    for key, start, end, value in net.results("results"):
        final[(key, start, end)] = [key, start, end, value]
    return list(final.values())


def test_without_idle_timeout_a_silent_source_holds_the_windows():
    net = SeededNet(JOB.format(idle=""), 0)
    fast = net.fws[net.phys.of_node("fast")[0].worker_id]
    net.run(400_000, until=lambda: fast.done and not any(net.links.values()))
    assert closed_ends(net) <= 200  # nothing after the pausing source's time closes
    Pausing.resume = True
    net.run(400_000)
    assert net.results("too_late") == []
    assert sum(row[3] for row in last_rows(net)) == 2_000 + 300
