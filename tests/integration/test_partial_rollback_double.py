"""Double failures under partial rollback, end to end: Mininet (3 hosts), real OVS,
Ryu running the core's built-in recovery, ``exactly_once``, ``partial_rollback:
true`` (docs/guarantees.md "Partial rollback", "Several failures at once").

* Two consecutive stages at once: wordcount's first split worker and the first
  count worker (which that split feeds) are SIGKILLed together.  The rollback
  set is the split's replacement and every count worker (the count's
  replacement included); the source and the other split replay and never
  restore.
* A source and a downstream worker at once: in a job of two independent
  pipelines, ``source_1`` and the first ``count_1`` worker.  A source in the set
  seeks back, so the recovery falls back to pipeline 1's region, the incidents
  say so, and pipeline 2 is never told anything.
* A second kill during the first partial recovery: a count worker is killed,
  and a split worker once the controller's REST shows the first incident
  ``replacing`` (its partial plan and replacement are written, its rollback not
  yet sent).  The split's recovery takes the count's replacement into its set.
* A network partition: a fabric link cut past the credit timeout and restored
  (no worker dies): exact and ok, or not ok naming the link's frames written off.

Each: counts exact against the generator's reference, the run report ok, the
incidents' ``region`` names the rolled-back set, and the workers outside it
report no restore, no rollback and generation 0.
"""

from __future__ import annotations

import copy
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
from harness import emulated_cluster, wait
from test_forced_loss import link_between
from test_guarantees import checkpointed, exact, reference
from test_partial_rollback import wordcount

from benchmarks.recovery_size import pipelines_yaml
from mininet_env.run import EmulatedCluster
from typhoon.report import build_report, read_worker_reports, restored_epochs
from typhoon.topology import load_topology
from typhoon.topology.loader import load_topology_text

ROOT = Path(__file__).resolve().parents[2]
SENTENCES, RATE = 24_000, 2_000  # a 12 s run
PIPE_SENTENCES, PIPE_RATE = 8_000, 700

pytestmark = [pytest.mark.integration, pytest.mark.long]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = "metrics_interval = 0.25\n[fault_detector]\nheartbeat_timeout = 15.0\n"
    with emulated_cluster(tmp_path_factory.mktemp("double"), "pd", apps=(), config=config) as c:
        yield c


def ready(c: EmulatedCluster, name: str, store: Path) -> dict[int, str]:
    """Once two global checkpoints are complete (the workers reported how far their
    buffers reach): worker -> node."""
    first = checkpointed(c, name, store, 0)
    checkpointed(c, name, store, first)
    return {w.worker_id: w.node for w in c.coordinator.get_physical(name).workers}


def victim(c: EmulatedCluster, name: str, node: str) -> int:
    return c.coordinator.get_physical(name).active_of_node(node)[0].worker_id


def sigkill(c: EmulatedCluster, name: str, victims: list[int]) -> None:
    statuses = c.coordinator.worker_statuses(name)
    for v in victims:
        os.kill(statuses[v].pid, signal.SIGKILL)


def incidents(c: EmulatedCluster, name: str) -> dict[int, dict]:
    return {i["worker"]: i for i in c.rest("GET", "/faults")[1] if i["app"] == name}


def rejoined(c: EmulatedCluster, name: str, victims: list[int]) -> dict[int, dict]:
    """Every victim's incident once each replacement rejoined (and was rolled back)."""

    def done():
        now = incidents(c, name)
        if all(now.get(v, {}).get("state") in ("rejoined", "failed") for v in victims):
            return now
        return None

    now = wait(done, 90, f"the replacements of {victims} to rejoin")
    for v in victims:
        i = now[v]
        print("incident:", {k: i.get(k) for k in (
            "worker", "state", "rollback", "generation", "region", "rolled_back", "replayers",
            "restore_epoch", "fallback", "rolled_back_ms", "rejoined_ms")})  # fmt: skip
        assert i["state"] == "rejoined", i
        assert i["restore_epoch"] is not None, i  # a checkpoint, not the start
    return now


def rolled_set(now: dict[int, dict], victims: list[int]) -> set[int]:
    return {w for v in victims for w in now[v]["region"]}


def never_restored(reports: list[dict], outside: set[int]) -> None:
    """Workers of ``outside`` never restored, rolled back or left generation 0; a source
    among them never seeked back."""
    by_worker = {r["worker"]: r for r in reports}
    assert outside and outside <= set(by_worker), (outside, sorted(by_worker))
    for w in outside:
        m = by_worker[w]["metrics"]
        assert restored_epochs(m) == [], (w, m.get("restored_epochs"))
        assert m.get("rollbacks", 0) == 0 and m.get("generation") == 0, (w, m)
        assert "replayed_from" not in m and not m.get("replayed"), (w, m)


def partial_of_both(
    now: dict[int, dict], victims: list[int], want: set[int], replayers: set[int]
) -> None:
    """Both incidents partial; together they roll back exactly ``want``, and only
    ``replayers`` (live senders outside it) replay to it."""
    for v in victims:
        assert now[v]["rollback"] == "partial" and now[v]["fallback"] == "", now[v]
    # a recovery planned before the other victim was replaced names it (dead) as well
    assert rolled_set(now, victims) - set(victims) == want, (rolled_set(now, victims), want)
    told = {int(w) for v in victims for w in now[v]["replayers"]}
    assert told == replayers, (told, replayers)


def test_two_consecutive_stages_killed_at_once_roll_back_their_closure(cluster, tmp_path):
    c = cluster
    store = tmp_path / "ckpt"
    t, name = wordcount(c, store)
    nodes = ready(c, name, store)
    split, count = victim(c, name, "split"), victim(c, name, "count")
    sigkill(c, name, [split, count])
    now = rejoined(c, name, [split, count])
    new = {now[split]["replacement"], now[count]["replacement"]}
    counts = {w for w, n in nodes.items() if n == "count"} - {count}
    (other,) = [w for w, n in nodes.items() if n == "split" and w != split]
    (source,) = [w for w, n in nodes.items() if n == "source"]
    partial_of_both(now, [split, count], new | counts, {source, other})
    _, reports = exact(c, t, name)
    never_restored(reports, {source, other})


def test_a_source_and_a_downstream_worker_fall_back_to_their_region(cluster, tmp_path):
    c = cluster
    store = tmp_path / "ckpt"
    name = f"pd{secrets.token_hex(2)}"
    text = pipelines_yaml(2, name, "partial", str(store), count=PIPE_SENTENCES, rate=PIPE_RATE)
    t = load_topology_text(text)
    c.submit(t)
    c.wait_active(name)
    nodes = ready(c, name, store)
    source, count = victim(c, name, "source_1"), victim(c, name, "count_1")
    sigkill(c, name, [source, count])
    now = rejoined(c, name, [source, count])
    pipeline_1 = {w for w, n in nodes.items() if n.endswith("_1")} - {source, count}
    new = {now[source]["replacement"], now[count]["replacement"]}
    for v in (source, count):
        i = now[v]
        assert i["rollback"] == "region", i
        assert "are in the rollback set: they seek back" in i["fallback"], i
        assert set(i["region"]) <= pipeline_1 | new | {source, count}, i
    assert rolled_set(now, [source, count]) - {source, count} == pipeline_1 | new
    clean = c.wait_finished(name)
    reports = read_worker_reports(c.report_dir(name))
    c.kill(name)
    report = build_report(t, reports, ok=clean, recovered=c.recovered, transport="sdn")
    for i in (1, 2):
        got = {k: int(v) for k, v in report["results"][f"count_{i}"]["counts"].items()}
        want = reference(t.nodes[f"source_{i}"].args)
        diff = {w: (got.get(w, 0), n) for w, n in want.items() if got.get(w, 0) != n}
        assert not diff and set(got) == set(want), (i, list(diff.items())[:10])
    assert report["ok"], report["problems"]
    never_restored(reports, {w for w, n in nodes.items() if n.endswith("_2")})


def test_a_second_kill_during_a_partial_recovery(cluster, tmp_path):
    c = cluster
    store = tmp_path / "ckpt"
    t, name = wordcount(c, store)
    nodes = ready(c, name, store)
    count, split = victim(c, name, "count"), victim(c, name, "split")
    sigkill(c, name, [count])

    def replacing():  # its partial plan is written, its replacement not yet rolled back
        i = incidents(c, name).get(count)
        assert i is None or i["state"] in ("rerouting", "replacing"), ("missed", i)
        return i if i is not None and i["state"] == "replacing" else None

    first = wait(replacing, 30, f"the recovery of {count} to begin", interval=0.05)
    assert first["rollback"] == "partial" and first["generation"] == 1, first
    sigkill(c, name, [split])
    now = rejoined(c, name, [count, split])
    new = {now[split]["replacement"], now[count]["replacement"]}
    counts = {w for w, n in nodes.items() if n == "count"} - {count}
    (other,) = [w for w, n in nodes.items() if n == "split" and w != split]
    (source,) = [w for w, n in nodes.items() if n == "source"]
    # the first was planned with the split alive: its replacement alone, both splits
    # replay; the second takes that replacement into its set, the source replays
    assert now[count]["region"] == [now[count]["replacement"]], now[count]
    assert {int(w) for w in now[count]["replayers"]} == {split, other}, now[count]
    assert set(now[split]["region"]) == new | counts, now[split]
    assert now[split]["generation"] > now[count]["generation"], now[split]
    partial_of_both(now, [split], new | counts, {source, other})
    _, reports = exact(c, t, name)
    never_restored(reports, {source, other})


def test_a_fabric_link_cut_and_restored_mid_run_is_exact_or_named(cluster, tmp_path):
    """A network partition: the fabric link between the first split worker's host and
    a count worker's host goes down mid-run, past the senders' credit timeout (1 s
    here: they write the silent receiver's frames off), and comes back.  No worker
    dies, so no recovery starts.  The run is either exact and ok, or not ok with a
    problem naming the cut link's workers: never ok with wrong counts."""
    c = cluster
    store = tmp_path / "ckpt"
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.name = name = f"pd{secrets.token_hex(2)}"
    t.nodes["source"].args.update(count=SENTENCES, rate=RATE)
    t.config.update(
        guarantee="exactly_once",
        checkpoint_interval_ms=500,
        checkpoint_store=str(store),
        partial_rollback=True,
        sdn={"credit_timeout_s": 1.0},
    )
    c.submit(t)
    c.wait_active(name)
    ready(c, name, store)
    physical = c.coordinator.get_physical(name)
    split = physical.active_of_node("split")[0]
    far = [w for w in physical.active_of_node("count") if w.host != split.host]
    assert far, "every count worker is on the split's host"
    ends = link_between(c, split.host, far[0].host)

    def drops() -> int:
        m = c.coordinator.get_metrics(name).get(split.worker_id, {})
        return m.get("drops", {}).get("credit_timeout", 0)

    cut = time.monotonic()
    for intf in ends:
        subprocess.run(["ip", "link", "set", "dev", intf, "down"], check=True)
    try:
        wait(lambda: drops() > 0, 60, "the split to write the cut receiver off")
    finally:
        for intf in ends:
            subprocess.run(["ip", "link", "set", "dev", intf, "up"], check=True)
    print(f"link {split.host}-{far[0].host} down {time.monotonic() - cut:.1f} s")
    clean = c.wait_finished(name)
    reports = read_worker_reports(c.report_dir(name))
    c.kill(name)
    report = build_report(t, reports, ok=clean, recovered=c.recovered, transport="sdn")
    got = {k: int(v) for k, v in report["results"]["count"]["counts"].items()}
    want = reference(t.nodes["source"].args)
    wrong = sum(abs(got.get(w, 0) - n) for w, n in want.items())
    print("partition:", {"ok": report["ok"], "wrong": wrong, "problems": report["problems"][:5],
                         "incidents": incidents(c, name)})  # fmt: skip
    if report["ok"]:
        assert wrong == 0 and set(got) == set(want), wrong
    else:
        link = f"worker {split.worker_id} (split[{split.index}]) -> worker "
        named = [p for p in report["problems"] if p.startswith(link)]
        assert any("written off" in p for p in named), report["problems"]
