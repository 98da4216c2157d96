"""The fault detector's decisions (controller/recovery/fault_detector.py) on the Fig. 10
wordcount."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from controller.recovery.fault_detector import (
    Heartbeats,
    failover,
    held_up_by_receivers,
    lost_hosts,
    rejoin,
    silent_host,
    without,
)
from typhoon.topology import load_topology, schedule

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["h1", "h2", "h3"]


@pytest.fixture
def wc():
    topology = load_topology(ROOT / "topologies" / "wordcount.yaml")
    return topology, schedule(topology, HOSTS, 0x42, first_port=10)


def ids(physical, node):
    return [w.worker_id for w in physical.active_of_node(node)]


def test_failover_reroutes_predecessors_around_the_dead_split(wc):
    topology, physical = wc
    source, splits, counts = ids(physical, "source"), ids(physical, "split"), ids(physical, "count")
    dead = splits[0]
    f = failover(topology, physical, dead, HOSTS, 10, min_id=100)
    assert list(f.routes) == source
    (route,) = f.routes[source[0]]
    assert route.next_hops == [splits[1]]
    assert f.receivers == counts  # they must wait for the replacement instead
    assert f.replacement >= 100
    new = f.physical.by_id(f.replacement)
    old = physical.by_id(dead)
    assert (new.node, new.index) == (old.node, old.index)
    assert (new.host, new.port) != (old.host, old.port)
    assert dead not in {w.worker_id for w in f.physical.workers}
    assert f.physical.version == physical.version + 1
    # everybody else keeps ID, host and port
    rest = {w for w in physical.workers if w.worker_id != dead}
    assert rest <= set(f.physical.workers)


def test_failover_avoids_ports_of_other_applications(wc):
    topology, physical = wc
    dead = physical.by_id(ids(physical, "count")[0])
    taken = {(h, p) for h in HOSTS for p in range(10, 30)}
    f = failover(topology, physical, dead.worker_id, HOSTS, 10, avoid=taken)
    new = f.physical.by_id(f.replacement)
    assert new.port >= 30
    # a dead count worker is rerouted away from by every split (fields routing on the rest)
    assert set(f.routes) == set(ids(physical, "split"))
    for routes in f.routes.values():
        assert dead.worker_id not in routes[0].next_hops
        assert len(routes[0].next_hops) == 3
    assert f.receivers == []  # count is a sink


def test_rejoin_brings_the_replacement_back(wc):
    topology, physical = wc
    dead = ids(physical, "split")[1]
    f = failover(topology, physical, dead, HOSTS, 10)
    r = rejoin(topology, f.physical, f.replacement)
    (source,) = ids(physical, "source")
    assert r.routes[source][0].next_hops == sorted(
        [ids(physical, "split")[0], f.replacement],
        key=lambda w: f.physical.by_id(w).index,
    )


def test_pending_replacements_stay_out_of_routes(wc):
    topology, physical = wc
    a, b = ids(physical, "split")
    first = failover(topology, physical, a, HOSTS, 10)
    second = failover(topology, first.physical, b, HOSTS, 10, pending=[first.replacement])
    (source,) = ids(physical, "source")
    assert second.routes[source][0].next_hops == []
    assert first.replacement != second.replacement
    r = rejoin(topology, second.physical, first.replacement, pending=[second.replacement])
    assert r.routes[source][0].next_hops == [first.replacement]


def test_rejoin_tells_the_replacement_its_senders_and_routes(wc):
    """Source and split die together: the split's replacement, started from the
    topology with the dead source, learns the source's replacement (still pending) as
    its sender and gets its own routes; the dead source is removed."""
    topology, physical = wc
    (source,) = ids(physical, "source")
    split = ids(physical, "split")[0]
    first = failover(topology, physical, split, HOSTS, 10)
    second = failover(topology, first.physical, source, HOSTS, 10, pending=[first.replacement])
    r = rejoin(
        topology, second.physical, first.replacement,
        pending=[second.replacement], gone=[source, split],
    )  # fmt: skip
    # every dead worker it might still expect is removed (a non-sender: no effect)
    assert r.upstream == {"add": [second.replacement], "remove": [source, split], "reopen": False}
    counts = ids(physical, "count")
    assert sorted(r.routes[first.replacement][0].next_hops) == sorted(counts)
    assert second.replacement not in r.routes  # a pending sender routes once it rejoins


def test_draining_worker_is_not_failed_over(wc):
    topology, physical = wc
    dead = ids(physical, "split")[0]
    drained = replace(
        physical,
        workers=[
            replace(w, state="draining") if w.worker_id == dead else w for w in physical.workers
        ],
    )
    with pytest.raises(ValueError, match="draining"):
        failover(topology, drained, dead, HOSTS, 10)


def test_without_keeps_version(wc):
    _, physical = wc
    assert without(physical, {1}).version == physical.version
    assert 1 not in {w.worker_id for w in without(physical, {1}).workers}


def beat(hb: Heartbeats, workers: list[int], t0: float, t1: float, step: float = 0.25):
    """Replies of ``workers`` every ``step`` from ``t0`` to ``t1`` (both included)."""
    k = 0
    while t0 + k * step <= t1 + 1e-9:
        for w in workers:
            hb.seen("wc", w, t0 + k * step)
        k += 1


def test_heartbeats_report_only_silent_workers_after_the_timeout():
    hb = Heartbeats(timeout=3.0, quiet=0.5)
    hb.watch("wc", [1, 2], now=0.0)
    beat(hb, [1], 0.25, 3.0)
    assert hb.stale(3.0) == []  # silent exactly the timeout, not longer
    beat(hb, [1], 3.25, 3.5)
    assert hb.stale(3.5) == [("wc", 2, 3.5)]
    hb.watch("wc", [1], now=4.0)  # worker 2 left the topology: forgotten
    beat(hb, [1], 3.75, 6.0)
    assert hb.stale(6.0) == []
    hb.forget("wc", 1)
    assert hb.stale(100.0) == []


def test_heartbeats_judge_nobody_while_nobody_is_heard():
    hb = Heartbeats(timeout=2.0, quiet=0.5)
    hb.watch("wc", [1, 2], now=0.0)
    assert hb.stale(10.0) == []  # no reply ever: nobody can be told apart
    beat(hb, [1, 2], 0.25, 1.0)
    # the controller hears nobody from 1.0 on (its switch connections stalled): ticks
    # keep coming, nobody is declared dead
    assert hb.stale(5.0) == [] and hb.stale(9.0) == []
    # replies resume, queued ones first, in any order: 1's before 2's
    hb.seen("wc", 1, 9.0)
    assert hb.stale(9.0) == []
    assert hb.unheard_s == 9.0 - 1.0 - 0.5
    hb.seen("wc", 2, 9.05)
    # now 2 hangs while 1 answers: found once 1 was heard for the timeout without it
    beat(hb, [1], 9.25, 11.0)
    assert hb.stale(11.0) == []
    beat(hb, [1], 11.25, 11.25)
    [(app, w, silent)] = hb.stale(11.25)
    assert (app, w) == ("wc", 2) and silent == pytest.approx(2.2)


def test_a_controller_stall_is_nobodys_silence():
    """The controller's event loop blocked for 2.2 s (a slow write under load): afterwards
    the first reply it reads must not make the workers whose replies wait behind it dead;
    without the stall rule all but that one were declared dead (seen in CI)."""
    hb = Heartbeats(timeout=2.0, quiet=0.5)
    hb.watch("wc", [1, 2, 3], now=0.0)
    beat(hb, [1, 2, 3], 0.25, 3.0)
    # stalled from 3.0 to 5.2; the tick that runs first still sees the old replies
    assert hb.stale(5.2) == []
    hb.seen("wc", 3, 5.21)  # the first queued reply read; 2's stopped at 3.0
    assert hb.stale(5.22) == []
    hb.seen("wc", 1, 5.23)
    # 2 really stopped at 3.0: still found, after others were heard for the timeout
    # without it (the stall beyond the usual gap not counted)
    beat(hb, [1, 3], 5.25, 6.5)
    assert hb.stale(6.5) == []
    beat(hb, [1, 3], 6.75, 7.0)
    [(_, w, silent)] = hb.stale(7.0)
    forgiven = 5.21 - 3.0 - 0.5
    assert w == 2 and silent == pytest.approx(7.0 - 3.0 - forgiven)
    assert hb.excused[("wc", 2)] == pytest.approx(forgiven)  # what the incident reports
    assert ("wc", 1) not in hb.excused  # heard since


def test_a_hung_receiver_explains_its_senders_silence_not_the_other_way_round(wc):
    """SIGSTOPped split: the source waits for its credit and falls silent too."""
    topology, physical = wc
    (source,), splits = ids(physical, "source"), ids(physical, "split")
    counts = ids(physical, "count")
    # both silent at once: only the split is dead, the source waits on it
    assert held_up_by_receivers(topology, physical, {source, splits[0]}) == {source}
    # the split already being failed over (or its replacement not attached yet)
    assert held_up_by_receivers(topology, physical, {source}, suspect={splits[0]}) == {source}
    # nobody downstream silent: the source itself is the one that hangs
    assert held_up_by_receivers(topology, physical, {source}) == set()
    assert held_up_by_receivers(topology, physical, {source}, suspect={counts[0]}) == set()
    # a sink has no receivers; a silent count does hold up both splits
    assert held_up_by_receivers(topology, physical, {counts[0]}) == set()
    assert held_up_by_receivers(topology, physical, {*splits, counts[1]}) == set(splits)
    # a worker the physical topology no longer has is nobody's business here
    assert held_up_by_receivers(topology, physical, {9999, source}, suspect={splits[1]}) == {source}


def test_a_host_whose_agent_is_silent_gets_no_replacement_but_keeps_its_workers(wc):
    """A machine died: its workers' ports went down and its agent reported no exit."""
    topology, physical = wc
    dead = physical.by_id(ids(physical, "count")[3])
    assert [w.host for w in physical.workers].count(dead.host) == 1  # its host: now the emptiest
    assert failover(topology, physical, dead.worker_id, HOSTS, 10).physical.by_id(
        failover(topology, physical, dead.worker_id, HOSTS, 10).replacement
    ).host == dead.host  # fmt: skip
    closed = silent_host(f"port {dead.host}/{dead.port} link_down", None, dead.host)
    assert closed == [dead.host]
    f = failover(topology, physical, dead.worker_id, HOSTS, 10, closed=closed)
    assert f.physical.by_id(f.replacement).host != dead.host
    # a closed host keeps its workers (each is replaced by its own incident)
    f = failover(topology, physical, dead.worker_id, HOSTS, 10, closed=["h1", dead.host])
    assert {w for w in physical.workers if w.host == "h1"} <= set(f.physical.workers)
    assert f.physical.by_id(f.replacement).host == "h2"
    # every host closed: the replacement still goes somewhere
    f = failover(topology, physical, dead.worker_id, HOSTS, 10, closed=HOSTS)
    assert f.physical.by_id(f.replacement).host in HOSTS


def test_an_exit_status_or_a_heartbeat_timeout_leaves_the_host_open():
    assert silent_host("port h1/101 deleted", -9, "h1") == []  # the agent reported the kill
    assert silent_host("no METRIC_RESP for 5.0 s", None, "h1") == []  # may be hung, not gone


def test_a_host_is_lost_only_when_its_switch_and_its_agent_are_both_silent():
    hosts = ["h1", "h2", "h3", "h4"]
    beats = {"h1": 100.0, "h2": 94.0, "h3": 99.0, "h4": None}  # h4: no agent record
    connected = {"h1", "h3"}
    assert lost_hosts(hosts, connected, beats, now=100.0, timeout=5.0) == {"h2", "h4"}
    # a switch gone, its agent heard 1 s ago: a reconnect, not a power cut
    assert lost_hosts(hosts, {"h1"}, beats, now=100.0, timeout=5.0) == {"h2", "h4"}
    # an agent silent, its switch connected: an agent restart, not a power cut
    assert lost_hosts(hosts, set(hosts), beats, now=100.0, timeout=5.0) == set()
    # only the hosts asked about
    assert lost_hosts(["h1", "h2"], connected, beats, now=100.0, timeout=5.0) == {"h2"}
