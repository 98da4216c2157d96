"""Keyed state that moves, on Mininet with real OVS and Ryu over 3 emulated hosts.

A non-additive pipeline (docs/keyed_state.md): ``running_count`` emits each
word's running count on every tuple, ``max_by_key`` keeps the largest per word.
The sink's maxima equal the word counts only if every word's count went on
from where it was through each rescale; the reference is computed from the
source's generator, independently of the run.  After the updates, each
word's state is on exactly one ``running_count`` worker: the one the senders'
routing tables (from the physical topology the controller installed) send it
to.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from harness import emulated_cluster, finish, wait

from mininet_env.run import EmulatedCluster
from typhoon.live import data_tuples
from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report
from typhoon.runtime.policies import Router
from typhoon.topology import load_topology_text
from typhoon.topology.routing import routes_for

N = 90_000
RUNNING = f"""
name: keyedsdn
spouts:
  - id: source
    operator: sentence_source
    args: {{count: {N}, seed: 11, words: 6, vocabulary: 400, rate: 9000}}
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: count
    operator: running_count
    parallelism: 4
    config: {{max_parallelism: 64}}
  - id: max
    operator: max_by_key
    parallelism: 2
streams:
  - {{from: source, to: split, grouping: shuffle}}
  - {{from: split, to: count, grouping: {{type: fields, fields: [word]}}}}
  - {{from: count, to: max, grouping: {{type: fields, fields: [key]}}}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(
        tmp_path_factory.mktemp("keyed"),
        "k",
        config="metrics_interval = 0.25\nreconfig_step_timeout = 20\n",
    ) as c:
        yield c


def reconfigure(c: EmulatedCluster, name: str, kind: str, body: dict) -> dict:
    status, record = c.rest("POST", f"/apps/{name}/{kind}", body)
    assert status == 202, record

    def finished():
        record = c.rest("GET", f"/apps/{name}/reconfig")[1]
        return record if record["state"] != "running" else None

    record = wait(finished, 90, f"{kind} of {name}", 0.05)
    assert record["state"] == "done", json.dumps(record, indent=1)
    return record


def test_running_counts_stay_exact_through_scale_up_and_down(cluster):
    t = load_topology_text(RUNNING, "keyedsdn.yaml")
    cluster.submit(t)
    cluster.wait_active(t.name)
    source = cluster.coordinator.get_physical(t.name).of_node("source")[0].worker_id

    def counted() -> int:  # tuples the count workers took in so far
        ms = cluster.coordinator.get_metrics(t.name)
        counts = cluster.coordinator.get_physical(t.name).of_node("count")
        return sum(data_tuples(ms.get(w.worker_id, {}).get("in", {})) for w in counts)

    # the counts are under way: by count, not a sleep
    wait(lambda: counted() >= 20_000, 60, "20,000 words at the count workers", 0.05)
    up = reconfigure(cluster, t.name, "scale", {"node": "count", "parallelism": 6})
    # stepwise (docs/keyed_state.md): prepare and finish per round of 4 key groups
    moves = [s["state"] for s in up["steps"] if s["what"].startswith("KEYGROUPS")]
    assert len(moves) >= 4 and len(moves) % 2 == 0 and set(moves) == {"done"}, up["steps"]
    assert not any(s["what"].startswith("SIGNAL") for s in up["steps"])
    assert cluster.coordinator.worker_statuses(t.name)[source].state != "exited"  # mid-run
    down = reconfigure(cluster, t.name, "scale", {"node": "count", "parallelism": 3})
    moves = [s["state"] for s in down["steps"] if s["what"].startswith("KEYGROUPS")]
    assert len(moves) >= 4 and len(moves) % 2 == 0 and set(moves) == {"done"}, down["steps"]
    assert cluster.coordinator.worker_statuses(t.name)[source].state != "exited"  # mid-run
    for what, record in (("4 -> 6", up), ("6 -> 3", down)):
        steps = {
            s["what"].split(":")[0] + f" {i}": s["seconds"] for i, s in enumerate(record["steps"])
        }
        print(f"\nscale {what}: {record['seconds']} s in all; steps: {steps}")
    final = cluster.coordinator.get_physical(t.name)
    topology, reports = finish(cluster, t.name)
    report = build_report(topology, reports)
    assert report["ok"], report["problems"]
    for w in report["workers"]:
        if w["node"] == "count":
            print(f"count worker {w['worker']}: {w['keyed']}")

    ref = Counter(
        w for s in generate_sentences(N, seed=11, words=6, vocabulary_size=400) for w in s.split()
    )
    merged = report["results"]["max"]
    assert merged["keys_on_several_workers"] == 0
    assert merged["max"] == {k: v for k, v in ref.items()}

    # each word's state lives on exactly one count worker: the one routing sends it to
    counts = [r for r in reports if r["node"] == "count"]
    assert len(counts) == 4 + 2  # 4 at the start, 2 added; 3 of them drained later
    owned = {w["worker"]: w["keyed"]["groups"] for w in report["workers"] if w["node"] == "count"}
    active = {w.worker_id for w in final.active_of_node("count")}
    assert sum(owned.values()) == 64 and all(owned[w] == 0 for w in owned if w not in active)
    holders: dict[str, list[int]] = {}
    for w in counts:
        for k in w["result"]["key_list"]:
            holders.setdefault(k, []).append(w["worker"])
    assert set(holders) == set(ref)
    split = final.of_node("split")[0].worker_id
    (route,) = routes_for(topology, final, split)
    router = Router(route)
    wrong = {k: ws for k, ws in holders.items() if ws != [router.select([k])]}
    assert not wrong, wrong
    assert {ws[0] for ws in holders.values()} <= active
