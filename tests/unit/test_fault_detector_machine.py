"""The fault detector's state machine with a fake core and a fake clock: no Ryu, no switch."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controller.recovery.fault_detector import FaultSettings
from controller.recovery.fault_detector_machine import FaultMachine
from controller.rules.dead_addresses import PRIO_DEAD_ADDRESS
from controller.rules.view import AppView
from typhoon.coordinator import WorkerStatus
from typhoon.manager import Placement
from typhoon.topology import load_topology, schedule
from typhoon.wire import mac_str, worker_mac

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["h1", "h2", "h3"]
APP = "wc"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeCore:
    """The services the machine uses; acks come at once unless the worker is silent."""

    def __init__(self, topology, physical) -> None:
        statuses = {
            w.worker_id: WorkerStatus(w.worker_id, w.host, "running") for w in physical.workers
        }
        self.app = AppView(topology, physical, statuses, {"active": True})
        self.view = type("View", (), {})()
        self.view.apps = {APP: self.app}
        self.view.cluster = SimpleNamespace(hosts={h: None for h in HOSTS})
        self.rules: dict[str, object] = {}  # owner -> contribution (set_rules)
        self.gone_hosts: set[str] = set()  # hosts whose agent record is gone
        self.unplugged: set[str] = set()  # hosts whose switch is not connected
        self.agent_beats: dict[str, float] = {}  # host -> its agent's last heartbeat
        self.stored = physical
        self.sent: list[tuple[int, str, dict]] = []
        self.acks: dict[tuple[str, int], set[int]] = {}
        self.silent: set[int] = set()
        self.versions = iter(range(1, 10_000))
        self.ready = True

    def send_control(self, app, worker_ids, ct):
        for w in worker_ids:
            self.sent.append((w, ct.type.name, ct.body))
            if w not in self.silent and "version" in ct.body:
                self.acks.setdefault((ct.type.name, ct.body["version"]), set()).add(w)
            elif w not in self.silent and ct.type.name == "ROLLBACK":  # acked by generation
                self.acks.setdefault((ct.type.name, ct.body["generation"]), set()).add(w)
        return len(worker_ids)

    def next_control_version(self):
        return next(self.versions)

    def acked(self, app, what, version):
        return self.acks.get((what, version), set())

    def rules_ready(self, app, version):
        return self.ready and self.app.physical.version >= version

    def reconfiguration(self, app):
        return None

    def stored_topology(self, app):
        return self.app.topology

    def stored_physical(self, app):
        return self.stored

    def placement(self, app):
        return Placement(HOSTS, 10, set(), 100)

    def update_physical(self, app, physical):
        self.stored = physical
        return physical

    def job_progress(self, app):
        return None

    def agent(self, host):
        if host in self.gone_hosts:
            return None
        return SimpleNamespace(host=host, heartbeat=self.agent_beats.get(host, time.time()))

    def connected_hosts(self):
        return set(HOSTS) - self.unplugged

    def set_rules(self, source, owner, value):
        self.rules[owner] = value

    def clear_rules(self, source, owner):
        self.rules.pop(owner, None)

    # the agents' and the coordinator poll's part
    def status(self, wid: int, state: str, code: int | None = None) -> None:
        self.app.statuses[wid] = WorkerStatus(wid, "h1", state, exit_code=code)

    def poll(self) -> None:
        self.app.physical = self.stored


def machine_for(topology: Any) -> tuple[FaultMachine, FakeCore, Clock, Any]:
    """A fault machine over ``topology`` scheduled on HOSTS, with its fake core and clock
    (and the physical topology)."""
    physical = schedule(topology, HOSTS, 0x42, first_port=10)
    core, clock = FakeCore(topology, physical), Clock()
    conf = FaultSettings(confirm_timeout=2.0, ack_timeout=5.0, attach_timeout=30.0)
    machine = FaultMachine(conf, core, 1.0, logging.getLogger("test"), clock)
    return machine, core, clock, physical


@pytest.fixture
def setup():
    return machine_for(load_topology(ROOT / "topologies" / "wordcount.yaml"))


def ids(physical, node):
    return [w.worker_id for w in physical.active_of_node(node)]


def test_a_dead_split_is_rerouted_replaced_and_rejoined_in_order(setup):
    machine, core, clock, physical = setup
    sources, splits, counts = (ids(physical, n) for n in ("source", "split", "count"))
    dead = splits[0]
    machine.worker_down(APP, dead, "h1", 11, "deleted", clock.now)
    # step 1, in the event handler: ROUTING without it to every source
    assert {(w, t) for w, t, _ in core.sent} == {(s, "ROUTING") for s in sources}
    (incident,) = machine.incidents
    assert incident.state == "rerouting" and incident.senders == sources
    # step 2 waits for the agent's exit status: nothing happens until it comes
    clock.now += 0.5
    machine.step()
    assert len(core.sent) == len(sources) and incident.replacement is None
    core.status(dead, "exited", -9)
    machine.step()
    new = incident.replacement
    assert incident.state == "replacing" and incident.exit_code == -9
    assert new in {w.worker_id for w in core.stored.workers} and dead not in core.stored.workers
    upstream = [(w, b) for w, t, b in core.sent if t == "UPSTREAM"]
    assert sorted(w for w, _ in upstream) == counts
    assert all(b["add"] == [new] and b["remove"] == [dead] for _, b in upstream)
    # step 3 waits until the replacement is attached and its rules are in
    mark = len(core.sent)
    machine.step()
    assert len(core.sent) == mark
    core.poll()
    core.status(new, "attached")
    core.ready = False
    machine.step()
    assert len(core.sent) == mark  # rules not confirmed yet
    core.ready = True
    machine.step()
    after = [(w, t) for w, t, _ in core.sent[mark:]]
    # UPSTREAM to the replacement before any sender routes to it
    assert after[0] == (new, "UPSTREAM")
    # then ROUTING: the senders with it, and the replacement its own routes
    assert set(after[1:]) == {(s, "ROUTING") for s in [*sources, new]}
    assert incident.state == "rejoined" and incident.detail == ""
    assert len(machine.tasks) == 0


def test_unconfirmed_steps_time_out_on_the_clock(setup):
    machine, core, clock, physical = setup
    dead = ids(physical, "count")[0]
    core.silent = set(ids(physical, "split"))
    machine.worker_down(APP, dead, "h1", 20, "deleted", clock.now)
    (incident,) = machine.incidents
    clock.now += 4.9
    machine.step()
    assert incident.reroute_acked_ms is None  # still waiting for the splits
    clock.now += 0.2
    machine.step()  # ack_timeout over: on to the exit status
    assert incident.reroute_acked_ms == pytest.approx(5100, abs=1)
    clock.now += 2.1
    machine.step()  # confirm_timeout over, exit status unknown: replaced anyway
    assert incident.state == "replacing" and incident.exit_code is None
    clock.now += 30.1
    machine.step()  # never attached
    assert incident.state == "failed" and "not attached in 30.0 s" in incident.detail
    assert len(machine.tasks) == 0


def test_a_worker_that_finished_is_not_replaced(setup):
    machine, core, clock, physical = setup
    dead = ids(physical, "count")[0]
    machine.worker_down(APP, dead, "h1", 20, "deleted", clock.now)
    core.status(dead, "exited", 0)
    machine.step()
    (incident,) = machine.incidents
    assert incident.state == "finished" and core.stored is physical


def test_what_is_left_alone(setup):
    machine, core, clock, physical = setup
    split, count = ids(physical, "split")[0], ids(physical, "count")[0]
    machine.metrics(APP, count, {"done": True}, clock.now)
    machine.worker_down(APP, count, "h1", 20, "deleted", clock.now)  # finished its input
    machine.worker_down(APP, 999, "h1", 99, "deleted", clock.now)  # not in the topology
    core.status(split, "starting")
    machine.worker_down(APP, split, "h1", 11, "deleted", clock.now)  # not attached yet
    assert machine.incidents == [] and core.sent == []


def test_a_dead_workers_address_gets_a_counting_drop_rule_on_every_bridge(setup):
    """What its senders still write to it is counted apart (the run report lists it with
    the incident); the rules go once the application is gone."""
    machine, core, clock, physical = setup
    dead = ids(physical, "count")[0]
    machine.worker_down(APP, dead, "h1", 20, "deleted", clock.now)
    rules = core.rules[f"dead-addresses:{APP}"]
    assert set(rules) == set(HOSTS)
    (rule,) = rules["h1"]
    assert rule.priority == PRIO_DEAD_ADDRESS and rule.actions == ()
    assert rule.match_dict() == {"eth_dst": mac_str(worker_mac(physical.app_id, dead))}
    core.view.apps = {}
    machine.tick()
    assert f"dead-addresses:{APP}" not in core.rules


def test_a_worker_of_a_host_that_is_gone_is_replaced_elsewhere(setup):
    """A host whose agent record vanished (a power cut: the bridge and every process
    went) gets no replacement, and the incident names it."""
    machine, core, clock, physical = setup
    victim = ids(physical, "count")[0]
    host = physical.by_id(victim).host
    core.gone_hosts.add(host)
    machine.fail(APP, victim, "no METRIC_RESP for 2.1 s", clock.now)
    clock.now += 2.1
    machine.step()  # no exit status (the agent is gone): replaced after confirm_timeout
    (incident,) = machine.incidents
    assert incident.host == host and incident.state == "replacing"
    assert core.stored.by_id(incident.replacement).host != host
    assert f"host {host} is gone" in incident.detail


def power_cut(agent_silent_s: float, source_done: bool = False):
    """A spread wordcount on HOSTS whose host h2 (a split and a count) falls silent, its
    switch gone and its agent last heard ``agent_silent_s`` ago (``source_done``: the
    source, the split's only sender, says it finished); the machine after the heartbeat
    judged it.  Returns (machine, core, clock, physical, h2's workers)."""
    topology = load_topology(ROOT / "topologies" / "wordcount.yaml")
    topology.config["placement"] = "spread"
    machine, core, clock, physical = machine_for(topology)
    conf = FaultSettings(heartbeat_timeout=5.0, agent_timeout=3.0, confirm_timeout=2.0)
    machine = FaultMachine(conf, core, 0.5, logging.getLogger("test"), clock)
    cut = [w.worker_id for w in physical.workers if w.host == "h2"]
    assert sorted(physical.by_id(w).node for w in cut) == ["count", "split"]
    core.unplugged.add("h2")
    core.agent_beats["h2"] = time.time() - agent_silent_s
    machine.tick()  # everybody watched from now
    for _ in range(12):  # the others answer every 0.5 s; h2's workers never again
        clock.now += 0.5
        for w in physical.workers:
            if w.worker_id not in cut:
                done = source_done and w.node == "source"
                machine.metrics(APP, w.worker_id, {"done": True} if done else {}, clock.now)
        machine.tick()
    return machine, core, clock, physical, cut


@pytest.mark.parametrize("source_done", [False, True])
def test_a_power_cut_host_is_lost_its_workers_die_together_and_get_no_replacement(source_done):
    """Switch gone and agent silent: the split on h2 is not spared as held up by the
    count beside it, nor as ending after its finished source (no exit status will come
    from h2): both are dead, and neither replacement goes to h2."""
    machine, core, clock, physical, cut = power_cut(10.0, source_done)
    assert {i.worker for i in machine.incidents} == set(cut)
    assert all(i.host == "h2" and i.reason.startswith("no METRIC_RESP") for i in machine.incidents)
    clock.now += 2.1
    machine.step()  # no exit status (nobody on h2 reports one): replaced after confirm
    for i in machine.incidents:
        assert i.state == "replacing", i
        assert core.stored.by_id(i.replacement).host != "h2"
        assert "host h2 is lost" in i.detail
    assert machine.lost_hosts(HOSTS) == {"h2"}


def test_a_switch_gone_with_its_agent_alive_is_no_power_cut():
    """A disconnected switch alone (a controller restart, a flapping link): the split
    waiting on a silent count is held up as before, and h2 stays open."""
    machine, *_, cut = power_cut(agent_silent_s=0.0)
    (incident,) = machine.incidents
    assert physical_node(machine, incident.worker) == "count" and incident.worker in cut
    assert machine.lost_hosts(HOSTS) == set()


def physical_node(machine: FaultMachine, wid: int) -> str:
    return machine.core.stored_physical(APP).by_id(wid).node


def test_a_scoped_machine_leaves_applications_outside_its_scope_alone(setup):
    """The core's built-in recovery handles guaranteed applications only."""
    _, core, clock, physical = setup
    conf = FaultSettings(heartbeat_timeout=1.0)
    machine = FaultMachine(
        conf, core, 1.0, logging.getLogger("test"), clock, scope=lambda app: False
    )
    split = ids(physical, "split")[0]
    machine.worker_down(APP, split, "h1", 11, "deleted", clock.now)
    clock.now += 10
    machine.tick()  # silent for 10 s: not watched either
    assert machine.incidents == [] and core.sent == [] and core.rules == {}


def test_with_port_events_off_only_the_heartbeat_detects(setup):
    machine, core, clock, physical = setup
    machine.conf = FaultSettings(port_events=False, heartbeat_timeout=5.0)
    machine.worker_down(APP, ids(physical, "split")[0], "h1", 11, "deleted", clock.now)
    assert machine.incidents == [] and core.sent == []


def test_a_failing_step_fails_its_incident_not_the_machine(setup):
    machine, core, clock, physical = setup
    dead = ids(physical, "split")[0]

    def broken(app):
        raise RuntimeError("placement exploded")

    core.placement = broken
    machine.worker_down(APP, dead, "h1", 11, "deleted", clock.now)
    core.status(dead, "exited", -9)
    machine.step()
    (incident,) = machine.incidents
    assert incident.state == "failed" and "placement exploded" in incident.detail
    assert len(machine.tasks) == 0


def test_two_failures_at_once_roll_back_once_after_both_replacements_are_routed(setup, tmp_path):
    """A count and a split worker die together under a guarantee: two generations.  The
    split's replacement is routed to first; rolling back then would replay words of the
    dead count worker's key groups while the splits leave them unrouted, and the count's
    own (older) ROLLBACK would be ignored after it.  So nobody rolls back until both
    replacements are routed to, and then everyone once, to the newest generation."""
    machine, core, clock, physical = setup
    core.app.topology.config.update(guarantee="exactly_once", checkpoint_store=str(tmp_path))
    count, split = ids(physical, "count")[0], ids(physical, "split")[0]
    machine.worker_down(APP, count, "h1", 13, "deleted", clock.now)
    machine.worker_down(APP, split, "h1", 11, "deleted", clock.now)
    core.status(count, "exited", -9)
    core.status(split, "exited", -9)
    machine.step()
    a, b = machine.incidents
    assert (a.worker, b.worker) == (count, split) and (a.generation, b.generation) == (1, 2)
    core.poll()
    core.status(b.replacement, "attached")  # the split's replacement first
    for _ in range(3):
        machine.step()
    assert not [w for w, t, _ in core.sent if t == "ROLLBACK"]
    core.status(a.replacement, "attached")
    for _ in range(4):
        machine.step()
    rolled = [(w, body) for w, t, body in core.sent if t == "ROLLBACK"]
    assert {body["generation"] for _, body in rolled} == {2}
    targets = [w for w, _ in rolled]
    assert len(targets) == len(set(targets))  # once each
    assert a.replacement in targets  # started in generation 1: it restores again
    assert b.replacement not in targets  # started restored in generation 2
    assert a.state == b.state == "rejoined", (a, b)


def test_a_worker_killed_after_its_senders_finished_is_replaced_and_one_that_ends_is_not(setup):
    """Every sender of a count worker finished: its port going down may be its own end, or
    a death while it still worked on their last tuples (CI: a Spark node's bridge killed
    while Spark was slow).  The agent's exit status decides: -9 is a failure, 0 an end."""
    machine, core, clock, physical = setup
    for s in ids(physical, "source") + ids(physical, "split"):
        machine.metrics(APP, s, {"done": True}, clock.now)
    killed, ended = ids(physical, "count")[:2]
    machine.worker_down(APP, killed, "h1", 20, "deleted", clock.now)
    machine.worker_down(APP, ended, "h1", 21, "deleted", clock.now)
    machine.step()
    assert machine.incidents == []  # nothing known yet: no reroute of a worker that may end
    core.status(killed, "exited", -9)
    core.status(ended, "exited", 0)
    machine.step()
    (incident,) = machine.incidents
    assert incident.worker == killed and "exited with -9" in incident.reason
