"""Fault detector end to end (paper §6.2 Fig. 10): Mininet, real OVS, Ryu with the app.

Wordcount as in Fig. 10: 1 source, 2 split, 4 count workers on 3 emulated
hosts; the source is rate-limited and long, so the count workers' aggregate
input rate is steady.  One split worker's process is SIGKILLed (pid from the
agent's worker status).  Pass: the fault detector wrote the source's ROUTING
without the dead worker within 100 ms of the port event and the source
acknowledged it; the count workers keep receiving after it; the replacement is
attached and receives tuples.  (How much of the throughput the failover keeps
is a rate, measured by ``typhoon bench --only fault``, not asserted here.)  The tuples
lost are counted (source's output minus what the splits received, the dead
one's last METRIC_RESP included) and must be no more than the dead worker
could hold: what reached it since its last METRIC_RESP plus the reroute window.

The slow fallback on the same scenario: a split worker is SIGSTOPped, so its
process (and with it its TAP port) stays up and no port event comes, but it
stops answering METRIC_REQ.  With ``heartbeat_timeout = 2`` the detector must
declare it dead from the missed METRIC_RESPs alone, reroute the source around
it, start a replacement that rejoins, and the count workers keep receiving.
"""

from __future__ import annotations

import copy
import os
import secrets
import signal
import time
from pathlib import Path

import pytest
from harness import emulated_cluster, ryu_apps, stacks_of, wait

from controller.recovery.fault_detector import FaultSettings
from mininet_env.run import EmulatedCluster
from typhoon.report import read_worker_reports
from typhoon.runtime.sdn import DEFAULT_CREDIT_TIMEOUT_S
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
RATE = 2000  # sentences per second
WORDS = 8
METRICS_S = 0.25
ACK_TIMEOUT_MS = FaultSettings().ack_timeout * 1000  # a reroute confirmed sooner was acked


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = f"metrics_interval = {METRICS_S}\n[fault_detector]\nheartbeat_timeout = 5.0\n"
    with emulated_cluster(
        tmp_path_factory.mktemp("faults"), "f", apps=["apps/fault_detector.py"], config=config
    ) as c:
        yield c


def total(m: dict, key: str) -> int:
    return sum(v for k, v in m.get(key, {}).items() if k != "0")


def count_in(c: EmulatedCluster, name: str, ids: list[int]) -> int:
    """Tuples the count workers received, by their last METRIC_RESPs."""
    ms = c.coordinator.get_metrics(name)
    return sum(total(ms.get(w, {}), "in") for w in ids)


def wait_counted(c: EmulatedCluster, name: str, counts: list[int], more: int, what: str) -> int:
    """Until the count workers received ``more`` tuples beyond what they had now, each some
    (a count, not a sleep: under load it takes longer, never fails for that); that many."""
    target = count_in(c, name, counts) + more

    def reached():
        ms = c.coordinator.get_metrics(name)
        each = all(total(ms.get(w, {}), "in") > 0 for w in counts)
        return each and count_in(c, name, counts) >= target

    wait(reached, 60, what, 0.05)
    return more


def wait_rejoined(c: EmulatedCluster, name: str, victim: int) -> dict:
    """The incident of ``victim`` of ``name`` once its replacement rejoined (or the failover
    failed); worker IDs repeat across applications, so never another app's incident."""

    def rejoined():
        mine = [i for i in c.rest("GET", "/faults")[1] if (i["app"], i["worker"]) == (name, victim)]
        return mine[0] if mine and mine[0]["state"] in ("rejoined", "failed") else None

    return wait(rejoined, 40, "the replacement to rejoin")


def steady_wordcount(c: EmulatedCluster, prefix: str):
    """Wordcount (paper Fig. 10: 1 source, 2 split, 4 count) running, every count worker
    receiving: (name, physical topology, source, split workers, count workers)."""
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.name = name = f"{prefix}{secrets.token_hex(2)}"
    t.nodes["source"].args.update(count=10**8, rate=RATE, words=WORDS)
    c.submit(t)
    c.wait_active(name)
    physical = c.coordinator.get_physical(name)
    source = physical.active_of_node("source")[0].worker_id
    splits = [w.worker_id for w in physical.active_of_node("split")]
    counts = [w.worker_id for w in physical.active_of_node("count")]
    wait_counted(c, name, counts, 2 * RATE * WORDS, "words at every count worker")
    return name, physical, source, splits, counts


def drain_and_count(c: EmulatedCluster, name: str, source: int, splits: list[int]):
    """DRAIN the source and wait until every worker has exited: (sentences the source
    sent, sentences the split workers received).

    Exact: the counts come from the reports workers write as they exit (a METRIC_RESP
    can be up to a metrics interval older than a worker's end).  A killed worker
    writes none; its last METRIC_RESP stands in, so what reached it after that
    counts as lost, which is what it held."""
    c.drain(name)

    def exited():
        statuses = c.coordinator.worker_statuses(name)
        return all(
            (s := statuses.get(w.worker_id)) is not None and s.state == "exited"
            for w in c.coordinator.get_physical(name).workers
        )

    def which() -> str:
        statuses = c.coordinator.worker_statuses(name)
        return "; ".join(
            f"{w.node} {w.worker_id}: {statuses.get(w.worker_id)}"
            for w in c.coordinator.get_physical(name).workers
        )

    wait(exited, 30, "every worker to exit after the DRAIN", 0.1, explain=which)
    reports = {r["worker"]: r["metrics"] for r in read_worker_reports(c.report_dir(name))}
    last = c.coordinator.get_metrics(name)
    assert source in reports, sorted(reports)
    sent = total(reports[source], "out")
    received = sum(total(reports.get(w) or last.get(w, {}), "in") for w in splits)
    return sent, received


HEARTBEAT_S = 2.0


@pytest.fixture
def slow_cluster(tmp_path):
    """A cluster of its own: the fallback needs a short heartbeat_timeout (function scope,
    so it is gone before the module's cluster starts)."""
    config = (
        f"metrics_interval = {METRICS_S}\n[fault_detector]\nheartbeat_timeout = {HEARTBEAT_S}\n"
    )
    with emulated_cluster(
        tmp_path / "heartbeat", "h", apps=["apps/fault_detector.py"], config=config
    ) as c:
        yield c


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` ('T': stopped), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_split_worker_that_stops_answering_is_found_by_heartbeat_and_replaced(slow_cluster):
    """SIGSTOP, not SIGKILL: the port stays up, only the missed METRIC_RESPs tell."""
    c = slow_cluster
    name, physical, source, splits, counts = steady_wordcount(c, "wchb")

    victim = splits[0]
    pid = c.coordinator.worker_statuses(name)[victim].pid
    argv = cmdline(pid)
    assert b"typhoon" in argv, argv  # the worker itself, not a wrapper
    try:
        os.kill(pid, signal.SIGSTOP)
        stopped = time.time()

        def incident():
            return next(
                (
                    i
                    for i in c.rest("GET", "/faults")[1]
                    if i["app"] == name and i["worker"] == victim and i["reroute_acked_ms"]
                ),
                None,
            )

        found = wait(incident, 20 + HEARTBEAT_S, "the heartbeat fallback to reroute", 0.02)
        state_then = process_state(pid)  # still there and stopped: its port is up
        # the victim's last METRIC_RESP, stamped by the worker before the controller read it
        last_heard = c.coordinator.get_metrics(name)[victim]["time"]

        def source_answers():
            """The source's first METRIC_RESP after the detection: it sends again."""
            t = c.coordinator.get_metrics(name).get(source, {}).get("time", 0.0)
            return t if t > found["detected_wall"] else None

        # the source is blocked on the stopped worker's credit; the ROUTING without it ends
        # that wait at once (the worker answered no SYNC), not the 10 s credit timeout
        def where_the_source_is() -> str:
            spid = c.coordinator.worker_statuses(name)[source].pid
            last = c.coordinator.get_metrics(name).get(source, {})
            return (
                f"incident {found}; the source's last METRIC_RESP at {last.get('time')} "
                f"({ {k: last.get(k) for k in ('credit_stalls', 'drops', 'out')} })\n"
                + stacks_of(spid)
            )

        recovered = wait(
            source_answers, 30, "the source to answer again", 0.05, explain=where_the_source_is
        )
        after = wait_counted(c, name, counts, RATE * WORDS, "words after the reroute")
        done = wait_rejoined(c, name, victim)
        new = done["replacement"]
        new_in = wait(
            lambda: total(c.coordinator.get_metrics(name).get(new, {}), "in"),
            10,
            "the replacement to receive tuples",
        )
        # the agent stops the worker the new physical topology left out (SIGKILL after its
        # stop timeout, which a stopped process cannot ignore)
        wait(lambda: process_state(pid) is None or cmdline(pid) != argv, 30,
             "the agent to stop the left-out worker")  # fmt: skip
    finally:
        if cmdline(pid) == argv:  # never a reused pid
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)

    incidents = c.rest("GET", "/faults")[1]  # before the end of stream closes every port
    sent, received = drain_and_count(c, name, source, [*splits, new])
    lost = sent - received
    detection_s = found["detected_wall"] - stopped
    print(
        f"\nheartbeat fallback: SIGSTOP -> declared dead {detection_s:.2f} s "
        f"({found['reason']}; heartbeat_timeout {HEARTBEAT_S:g} s, METRIC_REQ every "
        f"{METRICS_S:g} s; unheard spells forgiven {found['unheard_s']:.2f} s), reroute "
        f"written {found['reroute_ms']:.2f} ms after that (ack wait "
        f"ended {found['reroute_acked_ms']:.0f} ms), replacement {new} rejoined "
        f"{done['rejoined_ms']:.0f} ms after; source blocked on the stopped worker's credit "
        f"until {recovered - stopped:.2f} s after the SIGSTOP "
        f"({recovered - found['detected_wall']:.2f} s after the detection); count workers "
        f"received {after} more words after it; replacement received {new_in}; "
        f"sentences sent {sent}, received by splits {received}, lost {lost}; "
        f"incidents {[(i['worker'], i['reason']) for i in incidents]}"
    )
    c.kill(name)

    assert found["reason"].startswith("no METRIC_RESP for"), found  # no port event
    assert state_then == "T", state_then
    # never declared dead before heartbeat_timeout of silence after its last reply (the
    # worker stamps a reply before the controller reads it; the controller's stalls under
    # load only lengthen the allowance, by `unheard_s`, reported); no upper bound beyond the
    # wait's deadline: how soon after that it is declared is a latency, for benchmarks
    assert found["detected_wall"] - last_heard >= HEARTBEAT_S - METRICS_S, (found, last_heard)
    assert found["senders"] == [source]
    # the source applied and acked the reroute while blocked on the stopped worker's credit:
    # confirmed before the detector's ack_timeout, and it sent again before its own credit
    # timeout could have ended the wait (it blocked at the SIGSTOP at the earliest)
    assert found["reroute_acked_ms"] < ACK_TIMEOUT_MS, found
    assert recovered - stopped < DEFAULT_CREDIT_TIMEOUT_S, recovered - stopped
    assert done["state"] == "rejoined", done
    assert new not in {w.worker_id for w in physical.workers}
    assert [i["worker"] for i in incidents] == [victim], incidents  # nobody else declared dead
    # what the stopped worker held: what reached it since its last METRIC_RESP; nothing else
    assert 0 <= lost <= RATE * (detection_s + METRICS_S) + 200


def test_split_worker_killed_is_routed_around_and_replaced(cluster):
    c = cluster
    name, physical, source, splits, counts = steady_wordcount(c, "wcfault")

    victim = splits[0]
    pid = c.coordinator.worker_statuses(name)[victim].pid
    killed = time.time()  # just before: nothing the kill causes can come earlier
    os.kill(pid, signal.SIGKILL)

    incident = wait(
        lambda: next(
            (
                i
                for i in c.rest("GET", "/faults")[1]
                if i["app"] == name and i["worker"] == victim and i["reroute_acked_ms"]
            ),
            None,
        ),
        10,
        "the fault detector to reroute around the dead split worker",
        interval=0.02,
    )
    # the test's own clock: from the SIGKILL to seeing the sender's ROUTING ack recorded
    observed_s = time.time() - killed
    after = wait_counted(c, name, counts, RATE * WORDS, "words after the reroute")
    incident = wait_rejoined(c, name, victim)
    assert incident["state"] == "rejoined", incident
    new = incident["replacement"]
    assert new not in {w.worker_id for w in physical.workers}
    status = c.coordinator.worker_statuses(name)[new]
    assert status.state in ("attached", "running"), status
    new_in = wait(
        lambda: total(c.coordinator.get_metrics(name).get(new, {}), "in"),
        10,
        "the replacement to receive tuples",
    )

    # what was lost: drain the source, let the counters settle, compare
    sent, received = drain_and_count(c, name, source, [*splits, new])
    lost = sent - received
    detection_s = incident["detected_wall"] - killed
    print(
        f"\nfault detector: kill -> ROUTING ack seen by the test {observed_s * 1000:.0f} ms "
        f"(its own clock); kill -> port event {detection_s * 1000:.1f} ms, "
        f"reroute written {incident['reroute_ms']:.2f} ms and acked "
        f"{incident['reroute_acked_ms']:.1f} ms after the port event, replacement {new} "
        f"written {incident['replaced_ms']:.1f} ms, rejoined {incident['rejoined_ms']:.1f} ms; "
        f"count workers received {after} more words after it; "
        f"replacement received {new_in}; sentences sent {sent}, received by splits "
        f"{received}, lost {lost}"
    )
    c.kill(name)

    assert incident["senders"] == [source]
    # the detector's own clock is checked against the test's, as the order of events
    # (causality, not speed): kill, then detection, then the ack, then the test seeing it
    detected_at = incident["detected_wall"]
    acked_at = detected_at + incident["reroute_acked_ms"] / 1000
    seen_at = killed + observed_s
    assert killed <= detected_at <= seen_at, (killed, detected_at, seen_at)
    assert acked_at <= seen_at + 0.05, (acked_at, seen_at)  # 50 ms: two clocks' rounding
    assert incident["reroute_ms"] < 100
    assert incident["reroute_acked_ms"] < 1000
    # the behavioural claim, with a generous bound: routed around within a few seconds
    assert observed_s < 5.0, observed_s
    # only what the dead worker held: its input since its last report plus the reroute window
    assert 0 <= lost <= RATE * (METRICS_S + 0.1 + incident["reroute_acked_ms"] / 1000) + 200


@pytest.mark.parametrize(
    "apps",
    [
        ["apps/fault_detector.py"],
        ["apps/fault_detector.py", "apps/load_balancer.py", "apps/live_debugger.py"],
    ],
    ids=["alone", "with-others"],
)
def test_the_app_starts_alone_and_with_the_others(tmp_path, apps):
    """``ryu-manager apps/fault_detector.py [others]``: the core comes in by itself."""
    with ryu_apps(tmp_path, apps, "[fault_detector]\nheartbeat_timeout = 3.0\n") as ryu:
        assert wait(lambda: ryu.get("/faults"), 30, "the fault detector's REST API") == (200, [])
    text = ryu.log()
    assert "instantiating app controller.core" in text
    assert "fault detector ready: heartbeat_timeout=3 s" in text
