"""A worker's queue metric is its whole backlog: what the event loop took from the
transport and has not processed, plus what the transport still holds
(typhoon/runtime/control.py; the load balancer's queue term weighs it)."""

from __future__ import annotations

from typhoon.operators import resolve_operator
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound, Transport
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import Control, ControlTuple, encode_rows

PIPE = """
name: pipe
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: sink
    operator: collect
streams:
  - {from: source, to: sink, grouping: shuffle}
"""

READ_AHEAD = 300  # bytes the transport read and did not hand out yet


class Held(Transport):
    def poll(self, timeout):
        return []

    def send(self, dst, stream, payloads):
        pass

    def send_group(self, group, dsts, payloads, stream=None):
        raise AssertionError("no multicast here")

    def reply(self, ct):
        pass

    def queue_bytes(self) -> int:
        return READ_AHEAD


def sink() -> tuple[Framework, int]:
    t = load_topology_text(PIPE)
    phys = schedule(t, ["h1"], 7, first_port=100)
    wid = phys.of_node("sink")[0].worker_id
    op = resolve_operator(t.nodes["sink"].operator)()
    fw = Framework(WorkerSpec(t, phys, wid, batch_size=1), op, Held())
    return fw, phys.of_node("source")[0].worker_id


def test_queue_counts_what_was_taken_and_not_processed_yet():
    fw, src = sink()
    batch = [encode_rows([[i, 0, 0.0, b"x" * 40] for i in range(k, k + 50)]) for k in (0, 50)]
    items = [Inbound(src, 1, [p]) for p in batch] + [ControlTuple(Control.METRIC_REQ, {})]
    fw.took(items)
    assert fw.metrics()["queue_bytes"] == READ_AHEAD + sum(map(len, batch))
    fw.deliver(items[0])
    fw.delivered(items[0])
    m = fw.metrics()
    assert m["queue_bytes"] == READ_AHEAD + len(batch[1])
    assert m["queue"] == int(m["queue_bytes"] / (len(batch[0]) / 50))  # in tuples
    fw.deliver(items[1])
    fw.delivered(items[1])
    assert fw.metrics()["queue_bytes"] == READ_AHEAD
    fw.delivered(items[1])  # never below what the transport holds
    assert fw.metrics()["queue_bytes"] == READ_AHEAD
