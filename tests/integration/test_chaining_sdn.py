"""Operator chaining on an emulated sdn cluster: the chained wordcount equals the same
job with ``config: {chaining: false}`` and the reference, exactly; scaling a chained
node is refused with 409 naming the switch (docs/topology.md, "Chaining")."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
from harness import ROOT, emulated_cluster, finish

from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report
from typhoon.topology import load_topology

pytestmark = [pytest.mark.integration, pytest.mark.long]


def job(name: str, chaining: bool, rate: int = 0):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount_chained.yaml"))
    t.name = name
    t.config["chaining"] = chaining
    t.nodes["source"].args.update(count=30_000, rate=rate)
    return t


def test_chained_wordcount_over_sdn_equals_unchained_and_the_reference(tmp_path):
    with emulated_cluster(tmp_path, "ch", hosts=2) as cluster:
        reports = {}
        for name, chaining in (("chsdn", True), ("plainsdn", False)):
            t = job(name, chaining, rate=10_000)
            cluster.submit(t)
            cluster.wait_active(name)
            status, reply = cluster.rest(
                "POST", f"/apps/{name}/scale", {"node": "split", "parallelism": 3}
            )
            if chaining:  # one sentence, naming the switch that unchains
                assert status == 409, reply
                assert "config: {chaining: false}" in reply["error"], reply
            else:  # unchained, forward's equal parallelism is what refuses it
                assert status == 400 and "parallelism differs" in reply["error"], reply
            topology, workers = finish(cluster, name)
            reports[name] = build_report(topology, workers)
    args = job("x", True).nodes["source"].args
    want: Counter[str] = Counter()
    for s in generate_sentences(args["count"], args["seed"], args["words"], args["vocabulary"]):
        want.update(s.split())
    chained, plain = reports["chsdn"], reports["plainsdn"]
    for r in (chained, plain):
        assert r["ok"], r["problems"]
        assert {k: int(v) for k, v in r["results"]["count"]["counts"].items()} == dict(want)
    assert chained["nodes"] == plain["nodes"]
    assert chained["results"] == plain["results"]
    # the chained job's source and split workers shared their processes (one log each)
    logs = {p.name for p in (cluster.workdir / "chsdn").glob("worker-*.log")}
    assert logs == {f"worker-{w}.log" for w in (1, 2, 5, 6, 7, 8)}, logs
