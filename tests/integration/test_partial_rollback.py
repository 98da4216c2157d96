"""Partial rollback with upstream backup end to end: Mininet (3 hosts), real OVS,
Ryu running the core's built-in recovery, wordcount (1 source, 2 split, 4 count)
under ``exactly_once`` with ``partial_rollback: true`` (docs/guarantees.md
"Partial rollback").  wordcount is one failover region, so without partial
rollback every worker would roll back.

Once two global checkpoints are complete (the workers have reported how far their
output buffers reach), a count worker is SIGKILLed (second test: a split worker).
Pass: its incident says ``"rollback": "partial"``; its ``region`` is the
replacement alone (a split's: the replacement and every count worker) and no
other worker rolled back; the senders of that set are its ``replayers`` and
resent from their buffers (the incident's ``replayed``); every worker outside the set
reports no restore, no rollback and generation 0, and the source never seeked
back; the counts are exact and the run report is ok.
"""

from __future__ import annotations

import copy
import os
import secrets
import signal
from pathlib import Path

import pytest
from harness import emulated_cluster, wait
from test_guarantees import checkpointed, exact

from mininet_env.run import EmulatedCluster
from typhoon.report import restored_epochs
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = 24_000
RATE = 2_000  # sentences per second: a 12 s run

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


def kill_one(c: EmulatedCluster, name: str, node: str, store: Path) -> tuple[dict, dict]:
    """After two complete global checkpoints, SIGKILL the first worker of ``node``; its
    incident once it rejoined, and the physical topology before the kill."""
    first = checkpointed(c, name, store, 0)
    checkpointed(c, name, store, first)  # METRIC_RESP said how far the buffers reach
    physical = c.coordinator.get_physical(name)
    victim = physical.active_of_node(node)[0].worker_id
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
    return incident, {w.worker_id: w.node for w in physical.workers}


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
    (source,) = [r for r in reports if r["node"] == "source"]
    assert "replayed_from" not in source["metrics"] and not source["metrics"].get("replayed")


def test_a_dead_count_worker_rolls_back_alone(cluster, tmp_path):
    c = cluster
    store = tmp_path / "ckpt"
    t, name = wordcount(c, store)
    incident, nodes = kill_one(c, name, "count", store)
    new = incident["replacement"]
    splits = sorted(w for w, n in nodes.items() if n == "split")
    assert incident["rollback"] == "partial" and incident["fallback"] == "", incident
    assert incident["region"] == [new] and incident["rolled_back"] == [], incident
    assert incident["restore_epoch"] is not None, incident  # a checkpoint, not the start
    assert {int(w): ms for w, ms in incident["replayers"].items()} == {s: [new] for s in splits}
    incident = with_replays(c, name, incident["worker"], set(splits))
    report, reports = exact(c, t, name)
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
    incident, nodes = kill_one(c, name, "split", store)
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
