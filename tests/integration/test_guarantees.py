"""Guaranteed processing end to end: Mininet (3 hosts), real OVS, Ryu with the
fault detector, wordcount (1 source, 2 split, 4 count) under a guarantee.

Mid-run a count worker is SIGKILLed, then a split worker, then a count and a
split worker at once.  Each time the fault detector replaces the dead worker,
every worker rolls back to the newest global checkpoint as a new generation
and the source replays from its offset.  Pass: the merged counts equal the
reference computed from the sentences exactly (``exactly_once``), or no word
is under-counted (``at_least_once``); the run report is ok with the dead
workers listed as recovered.  Exact counts alone would also follow from a
rollback to the start with a full replay, so each kill waits for a completed
global checkpoint (read from the store) and the tests check that the recovery
restored it or a newer one (incident records, every worker's report) and that
the source replayed from the offset that checkpoint holds, not from the start.
"""

from __future__ import annotations

import collections
import copy
import os
import secrets
import signal
from pathlib import Path

import msgpack
import pytest
from harness import emulated_cluster, wait

from mininet_env.run import EmulatedCluster
from typhoon.checkpoint.store import open_store
from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report, read_worker_reports, restored_epochs
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = 24_000
RATE = 2_000  # sentences per second: a 12 s run


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = "metrics_interval = 0.25\n[fault_detector]\nheartbeat_timeout = 15.0\n"
    with emulated_cluster(
        tmp_path_factory.mktemp("guarantees"), "g", apps=["apps/fault_detector.py"], config=config
    ) as c:
        yield c


def reference(args: dict) -> dict[str, int]:
    words = collections.Counter()
    for s in generate_sentences(args["count"], args["seed"], args["words"], args["vocabulary"]):
        words.update(s.split())
    return dict(words)


def checkpointed(c: EmulatedCluster, name: str, store: Path, after: int) -> int:
    """Wait for a global checkpoint newer than ``after`` (every active worker's part
    written and verified in the store); its epoch."""
    parts = {f"{w.node}-{w.index}" for w in c.coordinator.get_physical(name).workers if w.active}
    s = open_store(str(store), name)
    return wait(
        lambda: (e := s.latest_complete(parts)) is not None and e > after and e,
        30,
        f"a global checkpoint of {name} after epoch {after}",
    )


def kill(
    c: EmulatedCluster, name: str, nodes: list[str], store: Path, restored: list[int]
) -> list[int]:
    """Once a global checkpoint newer than the last restore is complete, SIGKILL one
    worker of each node (the lowest index); wait until each is replaced and the job
    rolled back, and check the recovery restored that checkpoint or a newer one (not
    the start); its epoch is appended to ``restored``."""
    done = checkpointed(c, name, store, max(restored, default=0))
    physical = c.coordinator.get_physical(name)
    statuses = c.coordinator.worker_statuses(name)
    victims = [physical.active_of_node(n)[0].worker_id for n in nodes]
    for v in victims:
        os.kill(statuses[v].pid, signal.SIGKILL)

    def recovered():
        # worker IDs repeat across applications: only this one's incidents
        incidents = {i["worker"]: i for i in c.rest("GET", "/faults")[1] if i["app"] == name}
        done = [incidents.get(v) for v in victims]
        if all(i is not None and i["state"] in ("rejoined", "failed") for i in done):
            return done
        return None

    incidents = wait(recovered, 60, f"the replacements of {victims} to rejoin")
    for i in incidents:
        assert i["state"] == "rejoined", i
        assert i["generation"] is not None, i
        assert i["restore_epoch"] is not None and i["restore_epoch"] >= done, (done, i)
        restored.append(i["restore_epoch"])
    return victims


def check_restores(reports: list[dict], name: str, store: Path, restored: list[int]) -> None:
    """Every worker's restores went to epochs the recoveries chose (>= 1, none to the
    start), and the source replayed from the offset its checkpoint of that epoch holds
    (read from the store here), past the start."""
    epochs = [e for r in reports for e in restored_epochs(r["metrics"])]
    assert epochs and min(epochs) >= 1 and set(epochs) <= set(restored), (epochs, restored)
    (source,) = [r for r in reports if r["node"] == "source"]
    s = open_store(str(store), name)
    last = restored_epochs(source["metrics"])[-1]
    saved = msgpack.unpackb(s.read(last, "source-0"), raw=False, strict_map_key=False)
    replayed = source["metrics"]["replayed_from"]
    assert replayed == saved["offset"], (replayed, saved["offset"])
    assert 0 < replayed["emitted"] < SENTENCES, replayed  # not from the start


def wordcount(c: EmulatedCluster, guarantee: str, store: Path):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.name = f"g{guarantee[:2]}{secrets.token_hex(2)}"
    t.nodes["source"].args.update(count=SENTENCES, rate=RATE)
    t.config.update(guarantee=guarantee, checkpoint_interval_ms=500, checkpoint_store=str(store))
    c.submit(t)
    c.wait_active(t.name)
    return t, t.name


def why(c: EmulatedCluster, report: dict, reports: list[dict]) -> dict:
    """What a wrong count needs to be understood from CI's output alone: the report's
    problems, each worker's end, the recovered workers."""
    return {
        "problems": report["problems"],
        "workers": [(r["worker"], r["node"], r["index"], r.get("error")) for r in reports],
        "recovered": c.recovered,
        "incidents": [
            {k: i.get(k) for k in ("worker", "state", "generation", "restore_epoch", "rolled_back")}
            for i in c.rest("GET", "/faults")[1]
            if i["app"] == report["topology"]
        ],
    }


def exact(c: EmulatedCluster, t, name: str) -> tuple[dict, list[dict]]:
    """Wait for the end; the report and the worker reports, after checking every
    word's count."""
    clean = c.wait_finished(name)
    reports = read_worker_reports(c.report_dir(name))
    c.kill(name)
    report = build_report(t, reports, ok=clean, recovered=c.recovered, transport="sdn")
    counts = {k: int(v) for k, v in report["results"]["count"]["counts"].items()}
    want = reference(t.nodes["source"].args)
    diff = {w: (counts.get(w, 0), n) for w, n in want.items() if counts.get(w, 0) != n}
    assert not diff and set(counts) == set(want), (list(diff.items())[:10], why(c, report, reports))
    assert report["ok"], report["problems"]
    return report, reports


@pytest.mark.integration
@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_wordcount_counts_survive_kills_of_count_and_split_workers(cluster, guarantee, tmp_path):
    c = cluster
    store = tmp_path / "ckpt"
    t, name = wordcount(c, guarantee, store)
    restored: list[int] = []
    killed = kill(c, name, ["count"], store, restored)
    killed += kill(c, name, ["split"], store, restored)
    killed += kill(c, name, ["count", "split"], store, restored)
    clean = c.wait_finished(name)
    reports = read_worker_reports(c.report_dir(name))
    c.kill(name)
    report = build_report(t, reports, ok=clean, recovered=c.recovered, transport="sdn")
    assert set(killed) <= set(c.recovered), (killed, c.recovered)
    counts = {k: int(v) for k, v in report["results"]["count"]["counts"].items()}
    want = reference(t.nodes["source"].args)
    if guarantee == "exactly_once":
        diff = {w: (counts.get(w, 0), n) for w, n in want.items() if counts.get(w, 0) != n}
        assert not diff and set(counts) == set(want), (
            list(diff.items())[:10],
            why(c, report, reports),
        )
        assert report["ok"], report["problems"]
    else:
        short = {w: (counts.get(w, 0), n) for w, n in want.items() if counts.get(w, 0) < n}
        assert not short, (list(short.items())[:10], why(c, report, reports))
    rollbacks = [r["metrics"].get("rollbacks", 0) for r in reports]
    assert max(rollbacks) >= 1, rollbacks
    check_restores(reports, name, store, restored)


@pytest.mark.integration
def test_exact_after_a_controller_restart_in_the_middle_of_a_recovery(cluster, tmp_path):
    """The controller is SIGKILLed once the replacement is written, before the job
    rolled back; the restarted one resends the routes and rolls back whoever missed it."""
    c = cluster
    store = tmp_path / "ckpt"
    t, name = wordcount(c, "exactly_once", store)
    done = checkpointed(c, name, store, 0)
    victim = c.coordinator.get_physical(name).active_of_node("count")[0].worker_id
    os.kill(c.coordinator.worker_statuses(name)[victim].pid, signal.SIGKILL)
    wait(
        lambda: victim not in {w.worker_id for w in c.coordinator.get_physical(name).workers},
        20,
        "the replacement to be written",
    )
    c.restart_controller(down_s=0.5)
    report, reports = exact(c, t, name)
    assert victim in c.recovered, (victim, c.recovered)
    assert report["ok"]
    # the restarted controller's incident record is gone: the workers say what they restored
    epochs = [e for r in reports for e in restored_epochs(r["metrics"])]
    assert epochs and min(epochs) >= done, (done, epochs)
    check_restores(reports, name, store, epochs)


@pytest.mark.integration
def test_exact_after_the_source_and_two_consecutive_stages_die_at_once(cluster, tmp_path):
    """SAND's claim: a source and the two stages after it fail together; the source's
    replacement seeks to the checkpointed offset and the counts are still exact."""
    c = cluster
    store = tmp_path / "ckpt"
    t, name = wordcount(c, "exactly_once", store)
    restored: list[int] = []
    killed = kill(c, name, ["source", "split", "count"], store, restored)
    report, reports = exact(c, t, name)
    assert set(killed) <= set(c.recovered), (killed, c.recovered)
    assert report["ok"]
    check_restores(reports, name, store, restored)
