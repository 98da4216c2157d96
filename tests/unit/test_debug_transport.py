"""Debug records through the coordinator, and delivery failures that reach the controller."""

from __future__ import annotations

import json
import logging
import sys
import time

import pytest

from typhoon.client import ApiCallError
from typhoon.coordinator import open_coordinator
from typhoon.debug import transport
from typhoon.debug.spec import DebugSpec, put_session
from typhoon.debug.supervisor import DebugWorkers
from typhoon.debug.transport import (
    SLOTS,
    Undelivered,
    coordinator_post,
    forget_batches,
    take_batches,
)
from typhoon.debug.worker import FAILURES_REPORTED, Shipper, delivery


def spec(url: str = "", session: str = "abc123") -> DebugSpec:
    return DebugSpec(session, "wc", 7, 2, "out", "h2", 65000, f"tdbg{session}", url, "key")


@pytest.fixture
def c(tmp_path):
    coordinator = open_coordinator(str(tmp_path / "c.db"))
    yield coordinator
    coordinator.close()


def test_batches_arrive_in_order_and_a_full_ring_is_backpressure(c):
    s = spec()
    put_session(c, s)
    post = coordinator_post(c, s)
    for n in range(SLOTS):
        post({"records": [{"n": n}], "stats": {}})
    with pytest.raises(Undelivered, match=f"has not read the last {SLOTS} batches"):
        post({"records": [{"n": "late"}]})
    got, next_n, error = take_batches(c, s.session, 0)
    assert [b["records"][0]["n"] for b in got] == list(range(SLOTS)) and next_n == SLOTS
    assert error is None and c.list("debugrec") == []
    post({"records": [{"n": SLOTS}]})  # the ring goes round: slot 0 again
    got, next_n, _ = take_batches(c, s.session, next_n)
    assert [b["records"][0]["n"] for b in got] == [SLOTS] and next_n == SLOTS + 1


def test_the_worker_stops_once_the_session_key_is_gone(c):
    s = spec()
    post = coordinator_post(c, s)
    with pytest.raises(transport.SessionEnded):
        post({"records": []})
    put_session(c, s)
    shipper = Shipper(post, lambda: {}, 100)
    shipper.ship_once()
    assert not shipper.gone.is_set()
    c.delete(s.key_path)
    shipper.ship_once(final=True)
    assert shipper.gone.is_set()


def test_a_refused_report_url_reaches_the_controller_with_what_to_do(c, caplog):
    s = spec(url="http://127.0.0.1:9/typhoon/debug")  # nothing listens on port 9
    post, on_failure = delivery(s, c)
    shipper = Shipper(post, lambda: {}, 100, on_failure)
    shipper.add([{"time": 1.0, "values": [1]}])
    with caplog.at_level(logging.WARNING, logger="typhoon.debug.worker"):
        for _ in range(FAILURES_REPORTED + 2):
            shipper.ship_once(final=True)
    assert len(caplog.records) == 1  # logged once, not per batch
    assert len(shipper.backlog) == 1  # the record waits, it is not lost
    _, _, error = take_batches(c, s.session, 0)
    assert error.startswith(
        "the debug worker on h2 cannot deliver at http://127.0.0.1:9/typhoon/debug: "
        "cannot reach the controller"
    )
    assert "set [live_debugger] report_url to an address this host reaches" in error


def test_a_full_ring_is_not_reported_as_a_failure(c):
    s = spec()
    put_session(c, s)
    told = []
    shipper = Shipper(coordinator_post(c, s), lambda: {}, 100, told.append)
    for n in range(SLOTS + FAILURES_REPORTED + 1):
        shipper.add([{"time": 1.0, "values": [n]}])
        shipper.ship_once(final=True)
    assert told == [] and shipper.failures == FAILURES_REPORTED + 1


def test_http_failures_are_reported_once_after_some_in_a_row():
    told = []

    def refuse(body):
        raise ApiCallError(0, "cannot reach the controller (connection refused)")

    shipper = Shipper(refuse, lambda: {}, 100, told.append)
    for _ in range(FAILURES_REPORTED * 3):
        shipper.ship_once(final=True)
    assert told == ["cannot reach the controller (connection refused)"]


def test_batches_are_cut_to_what_the_coordinator_takes(monkeypatch):
    monkeypatch.setattr("typhoon.debug.worker.MAX_BATCH_BYTES", 130)
    sent = []
    shipper = Shipper(sent.append, lambda: {}, 1000)
    small = {"time": 1.0, "values": ["x" * 30]}  # 58 bytes of JSON: two fit in 130
    big = {"time": 2, "v": "y" * 200}
    shipper.add([small] * 5 + [big])
    for _ in range(4):
        shipper.ship_once()
    assert [len(b["records"]) for b in sent] == [2, 2, 1, 1]
    n = len(json.dumps(big))
    assert sent[-1]["records"] == [{"time": 2, "raw": f"a record of {n} bytes"}]


class Bridge:
    def attach(self, tap: str, ofport: int) -> int:
        return ofport

    def detach(self, tap: str) -> None:
        pass


def test_a_debug_worker_that_dies_leaves_its_last_log_line_for_the_controller(c, tmp_path):
    net = tmp_path / "net"
    net.mkdir()
    die = "import sys; print('error: cannot open the coordinator: nope'); sys.exit(2)"
    workers = DebugWorkers(c, "h2", tmp_path / "debug", [sys.executable, "-c", die],
                           tap_timeout=5, stop_timeout=2, sys_net=net)  # fmt: skip
    s = spec()
    put_session(c, s)
    workers.reconcile(Bridge())
    deadline = time.monotonic() + 10
    while workers.procs and time.monotonic() < deadline:
        workers.supervise()
        time.sleep(0.05)
    _, _, error = take_batches(c, s.session, 0)
    assert error == (
        "the debug worker on h2 exited with 2: error: cannot open the coordinator: nope"
    )
    assert forget_batches(c, keep=set()) == [s.session] and c.list("debugrec") == []


class FakeServices:
    """What apps/live_debugger.py asks of the core here: the coordinator's debug keys."""

    def __init__(self, coordinator) -> None:
        self.c = coordinator

    def take_debug_batches(self, session, next_n):
        return take_batches(self.c, session, next_n)

    def delete_debug_session(self, host, session):
        self.c.delete(f"debug/{host}/{session}")

    def delete_debug_batches(self, session):
        transport.delete_batches(self.c, session)


def live_debugger(c, monkeypatch):
    """The app without Ryu's machinery: its sessions, and the core replaced."""
    from apps.live_debugger import LiveDebugger
    from controller.debugging.debugger import DebugSessions, Limits

    app = LiveDebugger.__new__(LiveDebugger)
    app.sessions = DebugSessions(Limits())
    app.logger = logging.getLogger("test-live-debugger")
    fake = FakeServices(c)
    monkeypatch.setattr(LiveDebugger, "core", staticmethod(lambda: fake))
    return app


def start_session(app, c, url: str = ""):
    from controller.debugging.debugger import Session

    s = spec(url)
    session = Session(s, 1, 100, 0.0, 0.0)
    session.state = "starting"
    app.sessions.sessions[s.session] = session
    put_session(c, s)
    return session


def test_records_through_the_coordinator_reach_the_session_ring(c, monkeypatch):
    app = live_debugger(c, monkeypatch)
    session = start_session(app, c)
    shipper = Shipper(coordinator_post(c, session.spec), lambda: {"frames": 3}, 100)
    shipper.add([{"time": 1.0, "values": ["ka"]}, {"time": 1.1, "values": ["lo"]}])
    shipper.ship_once()
    app._collect(session)
    page = session.read(0, 10)
    assert [r["values"] for r in page["records"]] == [["ka"], ["lo"]]
    assert session.stats["frames"] == 3 and session.heard is not None
    assert c.list("debugrec") == []  # read once, then gone


def test_an_attach_that_cannot_deliver_ends_with_the_cause(c, monkeypatch):
    """The issue's case: report_url on the controller's loopback, the worker on h2."""
    app = live_debugger(c, monkeypatch)
    session = start_session(app, c, url="http://127.0.0.1:9/typhoon/debug")
    post, on_failure = delivery(session.spec, c)
    shipper = Shipper(post, lambda: {}, 100, on_failure)
    for _ in range(FAILURES_REPORTED):
        shipper.ship_once(final=True)
    app._collect(session)
    page = session.read(0, 10)  # what `typhoon debug attach` polls
    assert page["state"] == "ended"
    assert page["reason"].startswith(
        "the debug worker on h2 cannot deliver at http://127.0.0.1:9/typhoon/debug: "
    )
    assert c.get(session.spec.key_path) is None  # the agent stops the debug worker
    assert c.list("debugrec") == []
