"""The autoscaler acting on a job under ``exactly_once``, then a failure, on Mininet with
real OVS and Ryu over 3 emulated hosts (docs/guarantees.md, "Rescaling a guaranteed
job").

Wordcount whose split stage (2 workers, ``split_words`` with a service time of
``SPLIT_COST_US`` per sentence) cannot keep up with the source's rate, with
``apps/autoscaler.py`` (``nodes = split``) and ``apps/fault_detector.py`` loaded.
The autoscaler must scale split 2 -> 3 while the job runs; once a global
checkpoint that includes the added worker is complete in the store, a count
worker is SIGKILLed.  The fault detector replaces it and every worker, the added
split too, rolls back to that checkpoint (or a newer one).  Pass: the counts
equal the reference computed from the source's generator, the report is ok
with the dead worker recovered.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections import Counter

import pytest
from harness import emulated_cluster, wait
from test_autoscaler import decisions, settled, workers_of
from test_guarantees import checkpointed

from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report, read_worker_reports, restored_epochs
from typhoon.topology import load_topology_text

SPLIT_COST_US = 8000  # 125 sentences/s per split worker
RATE = 310  # sentences/s: 1.24 x what 2 split workers serve, 0.83 x what 3 serve
N = 9_000  # about 30 s at the source's rate
JOB = """
name: {name}
config: {{guarantee: exactly_once, checkpoint_interval_ms: 500, checkpoint_store: {store}}}
spouts:
  - id: source
    operator: sentence_source
    args: {{count: {n}, seed: 7, words: 8, vocabulary: 500, rate: {rate}}}
bolts:
  - id: split
    operator: split_words
    parallelism: 2
    args: {{cost_us: {cost}}}
  - id: count
    operator: count_by_key
    args: {{key: word}}
    parallelism: 4
streams:
  - {{from: source, to: split, grouping: shuffle}}
  - {{from: split, to: count, grouping: {{type: fields, fields: [word]}}}}
"""

SETTINGS = (
    "metrics_interval = 0.5\n"
    "reconfig_step_timeout = 20\n"
    "[autoscaler]\n"
    "nodes = split\n"
    "busy_high = 0.9\n"
    "busy_low = 0.3\n"
    "up_window = 3.0\n"
    "down_window = 600.0\n"  # no scale-down in this run
    "cooldown = 4.0\n"
    "min_parallelism = 2\n"
    "max_parallelism = 3\n"
    "[fault_detector]\n"
    "heartbeat_timeout = 15.0\n"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(
        tmp_path_factory.mktemp("gauto"),
        "u",
        apps=["apps/autoscaler.py", "apps/fault_detector.py"],
        config=SETTINGS,
    ) as c:
        yield c


@pytest.mark.integration
def test_the_autoscaler_scales_a_guaranteed_job_and_a_kill_after_it_stays_exact(cluster, tmp_path):
    c = cluster
    store = tmp_path / "ckpt"
    name = f"ga{secrets.token_hex(2)}"
    t = load_topology_text(
        JOB.format(name=name, store=store, n=N, rate=RATE, cost=SPLIT_COST_US), "gauto.yaml"
    )
    c.submit(t)
    c.wait_active(name)
    splits = workers_of(c, name, "split")
    source = c.coordinator.get_physical(name).of_node("source")[0].worker_id

    wait(lambda: settled(c, name, "split", 3), 60, "the autoscaler to scale split to 3")
    (up,) = decisions(c, name, "split", "scale up")
    assert (up["from"], up["to"]) == (2, 3) and "started" in up["outcome"], up
    (added,) = workers_of(c, name, "split") - splits
    done = checkpointed(c, name, store, 0)  # its parts include the added split worker's
    statuses = c.coordinator.worker_statuses(name)
    assert statuses[source].state != "exited"  # mid-run
    victim = c.coordinator.get_physical(name).active_of_node("count")[0].worker_id
    os.kill(statuses[victim].pid, signal.SIGKILL)

    def recovered():
        incidents = {i["worker"]: i for i in c.rest("GET", "/faults")[1] if i["app"] == name}
        i = incidents.get(victim)
        return i if i is not None and i["state"] in ("rejoined", "failed") else None

    incident = wait(recovered, 60, f"the replacement of {victim} to rejoin")
    assert incident["state"] == "rejoined", incident
    assert incident["restore_epoch"] is not None and incident["restore_epoch"] >= done

    clean = c.wait_finished(name)
    reports = read_worker_reports(c.report_dir(name))
    c.kill(name)
    report = build_report(t, reports, ok=clean, recovered=c.recovered, transport="sdn")
    assert victim in c.recovered, (victim, c.recovered)
    assert report["ok"], report["problems"]
    epochs = [e for r in reports for e in restored_epochs(r["metrics"])]
    assert epochs and min(epochs) >= done, (done, epochs)
    (new_split,) = [r for r in reports if r["worker"] == added]
    assert restored_epochs(new_split["metrics"]), new_split["metrics"]  # it rolled back too
    print(
        f"\nautoscaler under exactly_once: {up['reason']}; checkpoint {done} complete after "
        f"the scale, restored {sorted(set(epochs))}; parts not written: "
        f"{ {r['worker']: r['metrics'].get('parts_skipped') for r in reports} }"
    )

    ref = Counter(
        w for s in generate_sentences(N, seed=7, words=8, vocabulary_size=500) for w in s.split()
    )
    counts = {k: int(v) for k, v in report["results"]["count"]["counts"].items()}
    diff = {w: (counts.get(w, 0), n) for w, n in ref.items() if counts.get(w, 0) != n}
    assert not diff and set(counts) == set(ref), list(diff.items())[:10]
