"""The Nexmark queries (topologies/nexmark/) over the tcp transport: ``typhoon run --transport
tcp``, real worker processes, real sockets.

Each query file runs as it is, with 30,000 events (the ``--arg`` overrides
below, applied to the reference's arguments too); every sink's tuples in the run
report must equal what ``typhoon.operators.nexmark_reference`` computes from the
generated events: the bids arrive out of order (200 ms of disorder, the
watermark's bound), so the windowed queries are exact only if every watermark
travelled behind the data it covers and every window worker took the minimum of
its inputs.  Nothing may be late anywhere.  The report's per-source counts say
how many events each source emitted.  Under ``exactly_once``, a join or window
worker SIGKILLed mid-run changes none of it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from midrun_kill import run_killing, sent_by
from test_tcp_runs import typhoon

from typhoon.operators import nexmark_reference as ref
from typhoon.operators.nexmark import kind_count
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "topologies" / "nexmark"
COUNT = 30_000

pytestmark = pytest.mark.slow


def sources(name: str) -> list[str]:
    topo = load_topology(QUERIES / f"{name}.yaml")
    return [n for n, node in topo.nodes.items() if node.operator == "nexmark_source"]


def node_args(name: str) -> dict[str, dict]:
    """The args the run used: the file's, with the overrides below."""
    topo = copy.deepcopy(load_topology(QUERIES / f"{name}.yaml"))
    for n in sources(name):
        topo.nodes[n].args["count"] = COUNT
    return {n: node.args for n, node in topo.nodes.items()}


@pytest.mark.parametrize("name", ref.QUERIES)
def test_query_sinks_equal_the_reference(tmp_path, name):
    report_file = tmp_path / "report.json"
    overrides = [x for n in sources(name) for x in ("--arg", f"{n}.count={COUNT}")]
    work = ["--workdir", str(tmp_path / "work")]
    file = str(QUERIES / f"{name}.yaml")
    p = typhoon("run", file, "--transport", "tcp", "--report", str(report_file), "-q", *work,
                *overrides)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(report_file.read_text())
    assert report["ok"], report["problems"]
    args = node_args(name)
    for n in sources(name):
        kind = args[n]["kind"]
        assert report["results"][n]["emitted"] == kind_count(kind, COUNT), n
    want = ref.expected(name, args)
    for sink, value in want.items():
        got = ref.observed(name, sink, report["results"][sink]["tuples"])
        assert got == value, f"{name}: sink '{sink}' differs from the reference"
        assert value
    # no event came late for any window, join or interval (the reports of the workers that
    # have windows carry window_late; interval_join's merged result counts its late tuples)
    windowed = [w for w in report["workers"] if "window_late" in w]
    assert windowed or name in ("q0", "q1", "q2", "q3")
    assert all(w["window_late"] == 0 for w in windowed)
    if name == "q4":
        assert report["results"]["closing"]["late"] == 0


@pytest.mark.parametrize(
    "name, victim", [("q3", "join"), ("q4", "closing"), ("q5", "count"), ("q8", "join")]
)
def test_query_stays_exact_through_a_sigkill_under_exactly_once(tmp_path, name, victim):
    """A join or window worker SIGKILLed mid-run under ``exactly_once``: relaunched from the
    last global checkpoint (its keyed state, its watermark), the sources replayed from
    their offsets (``nexmark_source``'s seek), every sink still equals the reference."""
    t = copy.deepcopy(load_topology(QUERIES / f"{name}.yaml"))
    t.name = f"nexmark{name}kill"
    first = sources(name)[0]
    for n in sources(name):
        args = t.nodes[n].args
        args["count"] = COUNT
        args["rate"] = args["rate"] / 10  # a run of several seconds: checkpoints before the kill
    t.config.update(
        guarantee="exactly_once", checkpoint_interval_ms=300, checkpoint_store=str(tmp_path / "ck")
    )
    total = kind_count(t.nodes[first].args["kind"], COUNT)
    cluster = TcpCluster(t, RunOptions(live=False, timeout=180), workdir=tmp_path / "run")
    try:
        cluster.start()
        cluster.activate()
        workers = cluster.physical.of_node(victim)
        target = workers[len(workers) // 2].worker_id
        sent = sent_by(cluster, first)
        mid = 0.4 * total / len(cluster.physical.of_node(first))
        # mid-run by count (the source's METRIC_RESPs), not a sleep
        clean = run_killing(cluster, [target], lambda: sent() >= mid, deadline_s=90)
        report = cluster.report(clean)
    finally:
        cluster.close()
    assert len(cluster.recovered) == 1, cluster.recovered
    assert report["ok"], report["problems"]
    args = {n: node.args for n, node in t.nodes.items()}
    for sink, value in ref.expected(name, args).items():
        got = ref.observed(name, sink, report["results"][sink]["tuples"])
        assert got == value, f"{name}: sink '{sink}' differs from the reference"
