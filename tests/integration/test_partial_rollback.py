"""Partial rollback with upstream backup end to end: Mininet (3 hosts), real OVS,
Ryu running the core's built-in recovery, under ``exactly_once`` with
``partial_rollback: true`` (docs/guarantees.md "Partial rollback").

First test: a job of 4 independent wordcount pipelines (``source_N -> split_N x2 ->
count_N x2``); a count worker of pipeline 1 is SIGKILLed.  Second test: wordcount
(1 source, 2 split, 4 count), one failover region, so without partial rollback
every worker would roll back; a split worker is SIGKILLed.

Each kill comes once two global checkpoints are complete (the workers have
reported how far their output buffers reach).  Pass: its incident says
``"rollback": "partial"``; its ``region`` is the replacement alone (a split's: the
replacement and every count worker) and no other worker rolled back; the senders
of that set are its ``replayers`` and resent from their buffers (the incident's
``replayed``); every worker outside the set reports no restore, no rollback and
generation 0, and no source seeked back; the counts are exact and the run report
is ok.  In the first test the other pipelines' count workers never pause: every
1 s window from the kill until the replays are recorded holds input of each of
those pipelines; and the incident says when pipeline 1's count workers were back
at 80% of their rate before (``back_at_80_ms``, ``typhoon/sink_rates.py``).
"""

from __future__ import annotations

import copy
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import emulated_cluster, wait
from test_guarantees import checkpointed, exact, reference

from benchmarks.recovery_size import pipelines_yaml
from mininet_env.run import EmulatedCluster
from typhoon.coordinator import open_coordinator
from typhoon.report import build_report, read_worker_reports, restored_epochs
from typhoon.sink_rates import Progress, data_in, window_rate
from typhoon.topology import load_topology
from typhoon.topology.loader import load_topology_text

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = 24_000
RATE = 2_000  # sentences per second: a 12 s run
PIPELINES = 4
PIPE_SENTENCES, PIPE_RATE = 6_000, 500  # per pipeline: a 12 s run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = "metrics_interval = 0.25\n[fault_detector]\nheartbeat_timeout = 15.0\n"
    with emulated_cluster(tmp_path_factory.mktemp("partial"), "pr", apps=(), config=config) as c:
        yield c


def wordcount(c: EmulatedCluster, store: Path):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.name = f"pr{secrets.token_hex(2)}"
    t.nodes["source"].args.update(count=SENTENCES, rate=RATE)
    t.config.update(
        guarantee="exactly_once",
        checkpoint_interval_ms=500,
        checkpoint_store=str(store),
        partial_rollback=True,
    )
    c.submit(t)
    c.wait_active(t.name)
    return t, t.name


def pipelines(c: EmulatedCluster, store: Path):
    name = f"pr{secrets.token_hex(2)}"
    text = pipelines_yaml(
        PIPELINES, name, "partial", str(store), count=PIPE_SENTENCES, rate=PIPE_RATE
    )
    t = load_topology_text(text)
    c.submit(t)
    c.wait_active(name)
    return t, name


class SinkPoller(threading.Thread):
    """The count workers' input per pipeline, from the coordinator every 0.1 s (its own
    connection: the sqlite coordinator is one per thread)."""

    def __init__(self, c: EmulatedCluster, name: str) -> None:
        super().__init__(daemon=True)
        self.url, self.name = c.coordinator_url, name
        self.logs: dict[str, dict[int, Progress]] = {}  # node -> worker -> progress
        self.lock = threading.Lock()
        self.done = threading.Event()

    def run(self) -> None:
        coordinator = open_coordinator(self.url)
        try:
            while not self.done.wait(0.1):
                physical = coordinator.get_physical(self.name)
                nodes = {w.worker_id: w.node for w in physical.workers}
                for wid, m in coordinator.get_metrics(self.name).items():
                    node, n = nodes.get(wid, ""), data_in(m)
                    if not node.startswith("count_") or n is None or "time" not in m:
                        continue
                    with self.lock:
                        log = self.logs.setdefault(node, {}).setdefault(wid, Progress())
                        if log.last is None or m["time"] > log.last:
                            log.add(m["time"], n)
        finally:
            coordinator.close()

    def of(self, node: str) -> list[Progress]:
        with self.lock:
            return list(self.logs.get(node, {}).values())

    def since(self, node: str) -> float:
        """Seconds between the first and the last reply of ``node``'s workers."""
        logs = [p for p in self.of(node) if p.first is not None]
        return max(p.last for p in logs) - min(p.first for p in logs) if logs else 0.0


def kill_one(
    c: EmulatedCluster,
    name: str,
    node: str,
    store: Path,
    ready: Callable[[], bool] = lambda: True,
) -> tuple[dict, dict, float]:
    """After two complete global checkpoints (and ``ready``), SIGKILL the first worker of
    ``node``; its incident once it rejoined, the physical topology before the kill, and
    the time of the kill."""
    first = checkpointed(c, name, store, 0)
    checkpointed(c, name, store, first)  # METRIC_RESP said how far the buffers reach
    wait(ready, 30, "the job to be ready for the kill")
    physical = c.coordinator.get_physical(name)
    victim = physical.active_of_node(node)[0].worker_id
    killed = time.time()
    os.kill(c.coordinator.worker_statuses(name)[victim].pid, signal.SIGKILL)

    def rejoined():
        for i in c.rest("GET", "/faults")[1]:
            if i["app"] == name and i["worker"] == victim and i["state"] in ("rejoined", "failed"):
                return i
        return None

    incident = wait(rejoined, 60, f"the replacement of {victim} to rejoin")
    assert incident["state"] == "rejoined", incident
    print("incident:", {k: incident.get(k) for k in (
        "worker", "rollback", "region", "rolled_back", "replayers", "restore_epoch", "fallback",
        "rolled_back_ms", "rejoined_ms")})  # fmt: skip
    return incident, {w.worker_id: w.node for w in physical.workers}, killed


def with_replays(c: EmulatedCluster, name: str, victim: int, replayers: set[int]) -> dict:
    """The incident once every replayer's METRIC_RESP said what it resent for it."""

    def recorded():
        for i in c.rest("GET", "/faults")[1]:
            if i["app"] == name and i["worker"] == victim:
                if {int(w) for w in i["replayed"]} >= replayers:
                    return i
        return None

    return wait(recorded, 30, f"the replay counts of {sorted(replayers)}")


def check_untouched(reports: list[dict], rolled: set[int]) -> None:
    """Workers outside the rollback set never restored or rolled back; the source (never
    in the set here) did not seek back: its replays came from the splits' buffers."""
    outside = [r for r in reports if r["worker"] not in rolled]
    assert outside
    for r in outside:
        m = r["metrics"]
        assert restored_epochs(m) == [], (r["worker"], m.get("restored_epochs"))
        assert m.get("rollbacks", 0) == 0 and m.get("generation") == 0, (r["worker"], m)
    sources = [r for r in reports if r["node"].startswith("source")]
    assert sources
    for source in sources:
        m = source["metrics"]
        assert "replayed_from" not in m and not m.get("replayed"), (source["worker"], m)


def exact_pipelines(c: EmulatedCluster, t, name: str) -> list[dict]:
    """Wait for the end; the worker reports, after checking every pipeline's counts."""
    clean = c.wait_finished(name)
    reports = read_worker_reports(c.report_dir(name))
    c.kill(name)
    report = build_report(t, reports, ok=clean, recovered=c.recovered, transport="sdn")
    for i in range(1, PIPELINES + 1):
        counts = {k: int(v) for k, v in report["results"][f"count_{i}"]["counts"].items()}
        want = reference(t.nodes[f"source_{i}"].args)
        diff = {w: (counts.get(w, 0), n) for w, n in want.items() if counts.get(w, 0) != n}
        assert not diff and set(counts) == set(want), (i, list(diff.items())[:10])
    assert report["ok"], report["problems"]
    return reports


def never_paused(poller: SinkPoller, node: str, start: float, end: float) -> None:
    """Every 1 s window of ``node``'s count workers from ``start`` to ``end`` (sliding by
    0.5 s) holds input."""
    wait(
        lambda: all(p.last is not None and p.last >= end for p in poller.of(node)),
        30,
        f"{node}'s replies past the recovery",
    )
    logs, lo = poller.of(node), start
    while lo + 1.0 <= end:
        assert window_rate(logs, lo, lo + 1.0) > 0, (node, lo - start)
        lo += 0.5


def test_a_dead_count_worker_rolls_back_alone_and_the_other_pipelines_never_pause(
    cluster, tmp_path
):
    c = cluster
    store = tmp_path / "ckpt"
    t, name = pipelines(c, store)
    poller = SinkPoller(c, name)
    poller.start()
    try:
        # a baseline for the incident's back_at_80_ms: whole seconds of input before
        incident, nodes, killed = kill_one(
            c, name, "count_1", store, lambda: poller.since("count_1") >= 2.5
        )
        new = incident["replacement"]
        splits = sorted(w for w, n in nodes.items() if n == "split_1")
        assert incident["rollback"] == "partial" and incident["fallback"] == "", incident
        assert incident["region"] == [new] and incident["rolled_back"] == [], incident
        assert incident["restore_epoch"] is not None, incident  # a checkpoint, not the start
        assert {int(w): ms for w, ms in incident["replayers"].items()} == {s: [new] for s in splits}
        incident = with_replays(c, name, incident["worker"], set(splits))
        recovered = max(time.time(), killed + 2.0)
        for i in range(2, PIPELINES + 1):
            never_paused(poller, f"count_{i}", killed, recovered)
        incident = wait(
            lambda: next(
                (
                    i
                    for i in c.rest("GET", "/faults")[1]
                    if i["app"] == name and i["worker"] == incident["worker"]
                    if i["back_at_80_ms"] is not None
                ),
                None,
            ),
            30,
            "pipeline 1's count workers back at 80%",
        )
        print("sinks:", {k: incident[k] for k in (
            "sinks", "sink_rate_before", "sink_rate_lowest", "back_at_80_ms")})  # fmt: skip
        assert incident["sinks"] == ["count_1"] and incident["sink_rate_before"] > 0, incident
        assert incident["back_at_80_ms"] >= 0, incident
    finally:
        poller.done.set()
        poller.join(timeout=5)
    reports = exact_pipelines(c, t, name)
    check_untouched(reports, {new})
    by_worker = {r["worker"]: r for r in reports}
    assert restored_epochs(by_worker[new]["metrics"])[0] == incident["restore_epoch"]
    replayed = {int(w): n for w, n in incident["replayed"].items()}
    assert set(replayed) == set(splits) and all(n > 0 for n in replayed.values()), incident
    for s in splits:  # each resent what followed the anchor on its link, as it reports
        mine = by_worker[s]["metrics"]["backup_replayed_tuples"]
        assert mine[str(incident["generation"])] >= replayed[s], (mine, replayed)


def test_a_dead_split_worker_takes_the_count_workers_and_the_source_replays(cluster, tmp_path):
    c = cluster
    store = tmp_path / "ckpt"
    t, name = wordcount(c, store)
    incident, nodes, _ = kill_one(c, name, "split", store)
    new, victim = incident["replacement"], incident["worker"]
    counts = sorted(w for w, n in nodes.items() if n == "count")
    (other,) = [w for w, n in nodes.items() if n == "split" and w != victim]
    (source,) = [w for w, n in nodes.items() if n == "source"]
    assert incident["rollback"] == "partial", incident
    assert set(incident["region"]) == {new, *counts}, incident
    assert incident["rolled_back"] == counts, incident
    replayers = {int(w): ms for w, ms in incident["replayers"].items()}
    assert replayers == {source: [new], other: counts}, replayers
    incident = with_replays(c, name, victim, {source, other})
    assert all(n > 0 for n in incident["replayed"].values()), incident
    report, reports = exact(c, t, name)
    check_untouched(reports, {new, *counts})
    by_worker = {r["worker"]: r for r in reports}
    resent = by_worker[source]["metrics"]["backup_replayed_tuples"]
    assert resent[str(incident["generation"])] > 0, resent
