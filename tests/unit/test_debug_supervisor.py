"""The agent's debug workers, with a stand-in process, bridge and /sys/class/net."""

from __future__ import annotations

import sys
import time

import pytest

from typhoon.coordinator import open_coordinator
from typhoon.debug.spec import DebugSpec, delete_session, put_session, sessions_on
from typhoon.debug.supervisor import DebugWorkers

# a "debug worker" that creates its TAP (a file in the fake /sys/class/net) and waits
FAKE_WORKER = (
    "import json, pathlib, sys, time; spec = json.load(open(sys.argv[-1])); "
    "pathlib.Path(sys.argv[1], spec['tap']).touch(); time.sleep(60)"
)


class FakeBridge:
    def __init__(self, give: int | None = None) -> None:
        self.ports: dict[str, int] = {}
        self.give = give

    def attach(self, tap: str, ofport: int) -> int | None:
        self.ports[tap] = self.give or ofport
        return self.ports[tap]

    def detach(self, tap: str) -> None:
        self.ports.pop(tap, None)


def spec(session: str = "abc123", host: str = "h1", port: int = 65000) -> DebugSpec:
    return DebugSpec(
        session, "wc", 7, 2, "out", host, port, f"tdbg{session}", "http://c/debug", "key"
    )


def wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def setup(tmp_path):
    c = open_coordinator(str(tmp_path / "c.db"))
    net = tmp_path / "net"
    net.mkdir()
    workers = DebugWorkers(
        c,
        "h1",
        tmp_path / "debug",
        [sys.executable, "-c", FAKE_WORKER, str(net)],
        tap_timeout=5,
        stop_timeout=2,
        sys_net=net,
    )
    yield c, workers
    workers.shutdown(timeout=5)
    c.close()


def test_spec_round_trips_through_the_coordinator(setup):
    c, _ = setup
    s = spec()
    s.workers = {2: ("split", 0)}
    put_session(c, s)
    put_session(c, spec("other", host="h2"))
    assert sessions_on(c, "h1") == {"abc123": s}
    c.put("debug/h1/bad", {"session": "bad"})  # malformed: skipped, not fatal
    assert list(sessions_on(c, "h1")) == ["abc123"]


def test_launch_attach_and_stop_on_detach(setup):
    c, workers = setup
    bridge = FakeBridge()
    put_session(c, spec())
    workers.reconcile(bridge)
    assert workers.ports() == [65000]
    wait(lambda: (workers.supervise(), bridge.ports.get("tdbgabc123"))[1] == 65000)
    assert workers.procs["abc123"].phase == "attached"
    workers.reconcile(bridge)  # nothing changed: nothing happens
    assert len(workers.procs) == 1
    delete_session(c, "h1", "abc123")
    workers.reconcile(bridge)
    wait(lambda: (workers.supervise(), not workers.procs)[1])
    assert bridge.ports == {} and workers.ports() == []


def test_a_worker_that_ended_is_not_started_again(setup):
    c, workers = setup
    bridge = FakeBridge(give=4)  # OVS gave another port: the worker is stopped
    put_session(c, spec())
    workers.reconcile(bridge)
    wait(lambda: (workers.supervise(), not workers.procs)[1])
    workers.reconcile(bridge)
    assert not workers.procs  # the controller ends the session; no restart loop here
    delete_session(c, "h1", "abc123")
    workers.reconcile(bridge)
    assert workers.ran == set()
