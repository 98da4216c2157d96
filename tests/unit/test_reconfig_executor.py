"""The reconfiguration executor against a simulated cluster: confirmations, timeouts, rollback.

The fake core answers like the real one (acks from live workers, rules ready
once the written version is read) and its ``sleep`` plays the agents: new
workers get attached, removed ones stop.  Workers listed in ``silent`` never
answer; ``crash`` ones exit before they are attached.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from controller.reconfigure import Executor, Registry
from controller.rules.composer import Source
from controller.rules.view import ClusterView
from typhoon.cluster import Cluster, HostInfo
from typhoon.coordinator import AgentState, SqliteCoordinator, WorkerStatus
from typhoon.manager import Manager
from typhoon.reconfig import ReconfigError, Scale, Swap
from typhoon.topology import load_topology_text
from typhoon.wire import Control

FORWARD = """
name: fwd
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: sink
    operator: sequence_check
streams:
  - {from: source, to: sink, grouping: shuffle}
"""


class FakeCore:
    def __init__(self, coordinator: SqliteCoordinator) -> None:
        self.coordinator = coordinator
        self.view = ClusterView.read(coordinator)
        self.sent: list[tuple[int, str, dict]] = []
        self.acks: dict[tuple[str, int], set[int]] = {}
        self.kept: dict[str, dict] = {}
        self.silent: set[int] = set()
        self.crash: set[int] = set()

    def send_control(self, app, worker_ids, ct):
        for w in worker_ids:
            self.sent.append((w, ct.type.name, ct.body))
            if w in self.silent:
                continue
            self.acks.setdefault((ct.type.name, ct.body["version"]), set()).add(w)
        return len(worker_ids)

    def next_control_version(self) -> int:
        return len(self.sent) + 1000

    def acked(self, app, what, version):
        return self.acks.get((what, version), set())

    def rules_ready(self, app, version):
        a = self.view.apps.get(app)
        return a is not None and a.physical.version >= version

    def set_rules(self, source, owner, rules):
        assert source is Source.KEPT
        self.kept[owner] = rules

    def clear_rules(self, source, owner):
        assert source is Source.KEPT
        self.kept.pop(owner, None)

    def _status(self, w: int, state: str, code: int | None = None) -> None:
        self.coordinator.put_worker_status(
            "fwd", WorkerStatus(w, "h1", state, exit_code=code, updated=time.time())
        )

    def sleep(self, seconds: float) -> None:
        """The agents' turn: attach new workers, stop removed ones; then re-read."""
        c = self.coordinator
        physical = c.get_physical("fwd")
        statuses = c.worker_statuses("fwd")
        ids = {w.worker_id for w in physical.workers} if physical else set()
        for w in ids - set(statuses):
            crashed = w in self.crash
            self._status(w, "exited" if crashed else "attached", 1 if crashed else None)
        running = sorted(w for w in ids if w in statuses and statuses[w].state != "exited")
        c.put_agent(AgentState("h1", 1, time.time(), (100, 200), [], {"fwd": running}))
        self.view = ClusterView.read(c)
        time.sleep(min(seconds, 0.001))


@pytest.fixture
def setup(tmp_path: Path):
    c = SqliteCoordinator(tmp_path / "coord.db")
    c.put_cluster(Cluster({"h1": HostInfo("h1", "br1", 1, first_worker_port=100)}))
    m = Manager(c)
    t = load_topology_text(FORWARD)
    phys = m.submit(t)
    c.put_app_state("fwd", {"active": True})
    core = FakeCore(c)
    core.sleep(0)
    yield core, m, phys
    c.close()


def run(core, manager, request, timeout=0.5):
    registry = Registry()
    record = registry.begin("fwd", lambda: manager.plan("fwd", request))
    Executor(core, manager, record, step_timeout=timeout).run()
    return record


def test_scale_up_runs_every_step_in_order(setup):
    core, m, phys = setup
    rec = run(core, m, Scale("sink", 3))
    assert rec.state == "done", rec.to_dict()
    assert [s["state"] for s in rec.to_dict()["steps"]] == ["done"] * len(rec.steps)
    assert [t for _, t, _ in core.sent] == ["ROUTING"]
    assert len(core.coordinator.get_physical("fwd").of_node("sink")) == 3
    assert core.kept == {}  # the old rules are no longer kept


def test_scale_down_drains_and_writes_the_final_topology(setup):
    core, m, phys = setup
    assert run(core, m, Scale("sink", 3)).state == "done"
    rec = run(core, m, Scale("sink", 1))
    assert rec.state == "done", rec.to_dict()
    assert [t for _, t, _ in core.sent[1:]] == ["ROUTING", "ROUTING", "DRAIN", "DRAIN"]
    final = core.coordinator.get_physical("fwd")
    assert [w.worker_id for w in final.of_node("sink")] == [2] and not final.draining()
    assert core.coordinator.get_app_state("fwd")["max_worker_id"] == 4


def test_a_silent_sender_times_out_and_everything_is_undone(setup):
    core, m, phys = setup
    core.silent = {1}  # the source never confirms ROUTING
    rec = run(core, m, Scale("sink", 3))
    d = rec.to_dict()
    assert rec.state == "rolled_back"
    assert "workers [1] did not confirm ROUTING within 0.5 s" in d["error"]
    assert [r["action"] for r in d["rollback"]] == [
        "undo ROUTING", "undo write", "undo kept_rules",
    ]  # fmt: skip
    now = core.coordinator.get_physical("fwd")
    assert [(w.worker_id, w.node) for w in now.workers] == [(1, "source"), (2, "sink")]
    assert now.version > phys.version  # a new version, so readers see the change back
    assert core.coordinator.get_topology("fwd").nodes["sink"].parallelism == 1
    back = [b for w, t, b in core.sent if t == "ROUTING"][-1]
    assert back["next_hops"] == [2] and back["release"] == [3, 4]
    assert core.kept == {}


def test_a_new_worker_that_dies_at_start_fails_the_update_cleanly(setup):
    core, m, phys = setup
    core.crash = {3}
    rec = run(core, m, Swap("sink", "sequence_check", {"ts": "ts"}))
    assert rec.state == "rolled_back"
    assert "new worker 3 exited before it was attached" in rec.error
    assert core.sent == []  # nothing was ever rerouted
    assert core.coordinator.get_topology("fwd").nodes["sink"].args == {}


def test_after_the_commit_a_stuck_drain_is_reported_and_the_update_finishes(setup):
    core, m, phys = setup
    assert run(core, m, Scale("sink", 2)).state == "done"
    core.silent = {3}  # the removed worker never confirms DRAIN and never exits
    rec = run(core, m, Scale("sink", 1))
    assert rec.state == "incomplete"
    assert "did not confirm DRAIN" in rec.error
    final = core.coordinator.get_physical("fwd")
    assert [w.worker_id for w in final.workers] == [1, 2]  # its agent stops it


def test_a_sender_that_finished_instead_of_answering_is_accepted(setup):
    core, m, phys = setup

    def exit_source(app, worker_ids, ct, _send=core.send_control):
        if ct.type == Control.ROUTING and 1 in worker_ids:
            core._status(1, "exited", 0)
            return 1
        return _send(app, worker_ids, ct)

    core.send_control = exit_source
    rec = run(core, m, Scale("sink", 2))
    assert rec.state == "done", rec.to_dict()
    # the new worker is told not to wait for the source's end of stream
    assert any(t == "UPSTREAM" and b["remove"] == [1] for _, t, b in core.sent)


def test_only_one_reconfiguration_per_application_runs(setup):
    core, m, phys = setup
    registry = Registry()
    registry.begin("fwd", lambda: m.plan("fwd", Scale("sink", 2)))
    with pytest.raises(ReconfigError) as e:
        registry.begin("fwd", lambda: m.plan("fwd", Scale("sink", 3)))
    assert e.value.status == 409 and "still running" in e.value.message


def test_a_kill_during_the_update_aborts_it(setup):
    core, m, phys = setup
    core.crash = set()
    sleep = core.sleep

    def kill_while_waiting(seconds):
        m.kill("fwd")
        sleep(seconds)

    core.sleep = kill_while_waiting
    rec = run(core, m, Scale("sink", 3))
    assert rec.state == "aborted" and rec.rollback == [] and core.kept == {}


def test_a_move_runs_through_the_executor_and_leaves_the_worker_on_its_new_host(setup):
    """``typhoon move``: the controller's step is the executor's (no path of its own):
    the new worker is launched on h2, the state moves by KEYGROUPS around the senders'
    ROUTING, the old worker is released and drained, and only the new one stays."""
    from typhoon.reconfig import Move

    core, m, phys = setup
    c = core.coordinator
    c.put_cluster(
        Cluster(
            {
                h: HostInfo(h, f"br{i}", i, first_worker_port=100)
                for i, h in enumerate(["h1", "h2"], 1)
            }
        )
    )
    (sink,) = phys.of_node("sink")
    rec = run(core, m, Move(sink.worker_id, "h2"))
    assert rec.state == "done", rec.to_dict()
    (new,) = rec.plan.added
    sent = [(w, t, b.get("phase", "")) for w, t, b in core.sent]
    assert sent == [
        (sink.worker_id, "KEYGROUPS", "prepare"),
        (new, "KEYGROUPS", "prepare"),
        (1, "ROUTING", ""),
        (sink.worker_id, "KEYGROUPS", "finish"),
        (new, "KEYGROUPS", "finish"),
        (1, "ROUTING", ""),
        (sink.worker_id, "DRAIN", ""),
    ]
    bodies = [b for _, t, b in core.sent]
    assert bodies[0]["operator_out"] == new and bodies[1]["operator_in"] == sink.worker_id
    assert bodies[2]["handoff"] and bodies[2]["next_hops"] == [new]
    assert bodies[5]["release"] == [sink.worker_id]
    final = c.get_physical("fwd")
    assert [(w.worker_id, w.host) for w in final.of_node("sink")] == [(new, "h2")]
    assert not final.draining() and core.kept == {}
