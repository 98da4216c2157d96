"""Switching senders of a balanced stream to the load-balancer address, without a switch."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from controller.load_balancing.senders import SenderSwitch
from controller.rules.groups import Balanced
from typhoon.topology.model import WorkerAssignment


def worker(wid: int, host: str) -> WorkerAssignment:
    return WorkerAssignment(wid, "split", wid, host, 100 + wid)


B = Balanced(2, "count", 1, (worker(1, "h1"), worker(2, "h2")), (worker(3, "h2"),))
LIVE = {1: SimpleNamespace(state="running"), 2: SimpleNamespace(state="attached")}


def switch() -> SenderSwitch:
    return SenderSwitch(retry_s=2.0, versions=itertools.count(100))


def test_only_live_senders_whose_bridge_holds_the_group_are_due():
    s = switch()
    assert s.due("a", B, LIVE, lambda host: host == "h1", 0.0) == [(1, False)]
    assert s.due("a", B, {1: SimpleNamespace(state="starting")}, lambda h: True, 0.0) == []


def test_a_send_is_retried_until_acked_then_left_alone():
    s = switch()
    v = s.sent(("a", 1, 2), 0.0)
    assert s.due("a", B, LIVE, lambda h: h == "h1", 1.0) == []  # waiting for the ack
    assert s.due("a", B, LIVE, lambda h: h == "h1", 2.5) == [(1, True)]
    s.on_ack("UPSTREAM", v, 2.6)  # not the ROUTING: nothing
    assert s.report("a") == {"1/2": "sent"}
    v2 = s.sent(("a", 1, 2), 2.5)
    s.on_ack("ROUTING", v, 2.6)  # the first version was popped by the UPSTREAM ack already
    assert s.report("a") == {"1/2": "sent"}
    s.on_ack("ROUTING", v2, 2.7)
    assert s.report("a") == {"1/2": "done"} and s.switched() == [("a", 1, 2)]
    assert s.due("a", B, LIVE, lambda h: h == "h1", 100.0) == []


def test_a_restarted_sender_starts_over():
    s = switch()
    s.on_ack("ROUTING", s.sent(("a", 1, 2), 0.0), 0.0)
    s.on_metrics("a", 1, {}, 0.5)  # too soon after the switch to judge
    assert s.switched() == [("a", 1, 2)]
    s.on_metrics("a", 1, {"2": True}, 5.0)  # still balanced
    assert s.switched() == [("a", 1, 2)]
    s.on_metrics("a", 1, {}, 5.0)  # it forgot: switch it again
    assert s.switched() == [] and s.due("a", B, LIVE, lambda h: True, 5.0)[0] == (1, False)
    s.on_ack("ROUTING", s.sent(("a", 1, 2), 6.0), 6.0)
    s.on_worker_up("a", 1)
    assert s.switched() == []
    s.on_ack("ROUTING", s.sent(("b", 1, 2), 7.0), 7.0)
    s.forget("b")
    assert s.report("b") == {}
