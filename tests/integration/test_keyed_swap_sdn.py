"""A running max with keyed state swapped in place on an emulated sdn cluster mid-run.

The job of tests/runtime/test_keyed_swap_tcp.py on 2 hosts with real OVS, Ryu and
Mininet: ``keyed_source`` -> fields on ``key`` -> ``running_max`` x2 (one per host, runs
alone) -> one ``collect`` sink.  ``typhoon swap`` (REST) to ``running_max`` with
``count: true`` runs in place (write, wait_rules, SWAP, commit; the same workers and
processes) and every row the sink got is recomputed from the source's generator
(tests/running_max_check.py): the maxima go on across the cut, the counts start at it,
one cut per key, every tuple once, 0 lost.
"""

from __future__ import annotations

import pytest
from harness import emulated_cluster, finish
from running_max_check import check_swapped_running_max, swap_job
from test_chaining_sdn import reconfigure, wait_emitted

from typhoon.report import build_report
from typhoon.topology import load_topology_text

pytestmark = [pytest.mark.integration, pytest.mark.long]

SEED, KEYS, COUNT, SIZE = 13, 64, 12_000, 8
JOB = swap_job("sdnkeyswap", SEED, KEYS, COUNT, SIZE, rate=2000, spread=True)


def test_a_keyed_running_max_swapped_in_place_on_sdn_goes_on_from_its_state(tmp_path):
    t = load_topology_text(JOB, "sdnkeyswap.yaml")
    with emulated_cluster(
        tmp_path, "ks", hosts=2, config="metrics_interval = 0.25\nreconfig_step_timeout = 20\n"
    ) as cluster:
        name = t.name
        cluster.submit(t)
        cluster.wait_active(name)
        physical = cluster.coordinator.get_physical(name)
        ids = sorted(w.worker_id for w in physical.of_node("rmax"))
        assert len({w.host for w in physical.of_node("rmax")}) == 2, physical.workers
        before = {w: cluster.coordinator.worker_statuses(name)[w].pid for w in ids}
        wait_emitted(cluster, name, COUNT // 3)
        body = {"node": "rmax", "operator": "running_max", "args": {"count": True}}
        done = reconfigure(cluster, name, "swap", body)
        steps = [(s["action"], s["workers"]) for s in done["steps"]]
        assert steps == [("write", []), ("wait_rules", []), ("control", ids),
                         ("commit", [])], done  # fmt: skip
        assert done["added"] == done["removed"] == []
        now_p = cluster.coordinator.get_physical(name)
        assert now_p.workers == physical.workers
        assert cluster.coordinator.get_topology(name).nodes["rmax"].args == {"count": True}
        assert {w: cluster.coordinator.worker_statuses(name)[w].pid for w in ids} == before
        topology, workers = finish(cluster, name)
    report = build_report(topology, workers)
    assert report["ok"], report["problems"]
    for w in workers:
        assert w["links"]["transport"]["lost"] == 0, w
    got = check_swapped_running_max(report["results"]["sink"]["tuples"], SEED, KEYS, COUNT, SIZE)
    assert got.old_rows and got.new_rows and got.keys_cut and got.carried, got
    by_id = {w["worker"]: w for w in workers}
    for wid in ids:
        (old,) = by_id[wid]["swapped"]  # the same worker: the old logic took a part
        assert old["operator"] == "running_max" and old["args"] == {}, old
        assert old["keyed"]["kept"] == ["max"] and old["keyed"]["added"] == ["count"], old
        assert 0 < old["tuples_in"] < sum(by_id[wid]["metrics"]["in"].values()), old
