"""A worker's queue metric is its whole backlog: what the event loop took from the
transport and has not processed, plus what the transport still holds
(typhoon/runtime/control.py; the load balancer's queue term weighs it)."""

from __future__ import annotations

import time

from typhoon.operators import resolve_operator
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound, Transport
from typhoon.runtime.worker import Worker
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

    def __init__(self) -> None:
        super().__init__()
        self.replies: list[ControlTuple] = []

    def reply(self, ct):
        self.replies.append(ct)

    def queue_bytes(self) -> int:
        return READ_AHEAD


def sink() -> tuple[Framework, int]:
    t = load_topology_text(PIPE)
    phys = schedule(t, ["h1"], 7, first_port=100)
    wid = phys.of_node("sink")[0].worker_id
    op = resolve_operator(t.nodes["sink"].operator)()
    fw = Framework(WorkerSpec(t, phys, wid, batch_size=1), op, Held())
    return fw, phys.of_node("source")[0].worker_id


def batches() -> list[bytes]:
    return [encode_rows([[i, 0, 0.0, b"x" * 40] for i in range(k, k + 50)]) for k in (0, 50)]


def test_queue_counts_what_was_taken_and_not_processed_yet():
    fw, src = sink()
    batch = batches()
    items = [Inbound(src, 1, [p]) for p in batch] + [ControlTuple(Control.METRIC_REQ, {})]
    fw.took(items)
    assert fw.metrics()["queue_bytes"] == READ_AHEAD + sum(map(len, batch))
    fw.deliver(items[0])
    fw.handled = 1
    m = fw.metrics()
    assert m["queue_bytes"] == READ_AHEAD + len(batch[1])
    assert m["queue"] == int(m["queue_bytes"] / (len(batch[0]) / 50))  # in tuples
    fw.deliver(items[1])
    fw.handled = 2
    assert fw.metrics()["queue_bytes"] == READ_AHEAD
    fw.handled = 3  # the control tuple carries no data
    assert fw.metrics()["queue_bytes"] == READ_AHEAD
    fw.took([])  # the next poll brought nothing
    assert fw.metrics()["queue_bytes"] == READ_AHEAD


def test_a_metric_request_in_a_poll_sees_the_data_after_it_as_backlog():
    """Through the event loop's own hand-over (``Worker.handle``): each METRIC_RESP
    counts the data handed out with it and not handled yet, not what came before."""
    t = load_topology_text(PIPE)
    phys = schedule(t, ["h1"], 7, first_port=100)
    io = Held()
    worker = Worker(WorkerSpec(t, phys, phys.of_node("sink")[0].worker_id, batch_size=1), io)
    src = phys.of_node("source")[0].worker_id
    batch = batches()

    def ask(n: int) -> ControlTuple:
        return ControlTuple(Control.METRIC_REQ, {"request_id": n})

    worker.handle(
        [Inbound(src, 1, [batch[0]]), ask(1), Inbound(src, 1, [batch[1]]), ask(2)], time.monotonic
    )
    queued = {r.body["request_id"]: r.body["metrics"]["queue_bytes"] for r in io.replies}
    assert queued == {1: READ_AHEAD + len(batch[1]), 2: READ_AHEAD}
    assert worker.operator.result()["count"] == 100  # the rows reached the operator
    assert worker.fw.metrics()["queue_bytes"] == READ_AHEAD
