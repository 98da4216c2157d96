"""Scenario: start-up and teardown (issue 33 item 5; no figure in the paper).

What every emulated run, benchmark and integration test pays before its first
tuple and after its last one, measured over ``repeats`` rounds:

* **sdn, 3 hosts up**: an emulated cluster from nothing (bridges, controller,
  agents: ``EmulatedCluster.start``) plus a submitted wordcount's 7 workers
  launched, attached and ACTIVATEd (submit -> ``active``);
* **sdn down**: the finished job killed (its workers and rules gone) and the
  cluster closed (agents and controller stopped, bridges and links removed);
* **tcp workers up**: ``TcpCluster.start`` for the same wordcount, from the
  first launch to every worker's hello and the peer list sent.

Each row also gives the cluster's own step times (``EmulatedCluster.phases``).
Targets: sdn up <= 3 s, sdn down <= 1 s, tcp workers up <= 0.5 s (medians).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from mininet_env.fabric import FabricPlan
from mininet_env.run import SdnRunOptions, start_cluster
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology_text

HOSTS = 3
SENTENCES = 2000  # a short job: the run between start and stop is not what is measured
TARGETS = {"sdn up": 3.0, "sdn down": 1.0, "tcp workers up": 0.5}
WORDCOUNT = f"""
name: startup_wordcount
spouts:
  - id: source
    operator: sentence_source
    args: {{count: {SENTENCES}, seed: 7, words: 8, vocabulary: 500}}
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: count
    operator: count_by_key
    args: {{key: word}}
    parallelism: 4
    stateful: true
streams:
  - from: source
    to: split
    grouping: shuffle
  - from: split
    to: count
    grouping: {{type: fields, fields: [word]}}
"""


def sdn_round(bench: Bench, rnd: int) -> dict[str, Any]:
    """One emulated cluster up, a short wordcount, and down; seconds per step."""
    topology = load_topology_text(WORDCOUNT)
    prefix = f"{bench.testbed.sdn_prefix}s"
    options = SdnRunOptions(
        plan=FabricPlan(hosts=HOSTS, prefix=prefix),
        live=False,
        workdir=bench.testbed.workdir / f"startup-{rnd}",
    )
    t0 = time.monotonic()
    cluster = start_cluster(options, bench.out)
    try:
        t_cluster = time.monotonic()
        cluster.submit(topology)
        cluster.wait_active(topology.name)
        t_active = time.monotonic()
        clean = cluster.wait_finished(topology.name)
        t_down = time.monotonic()
        cluster.kill(topology.name)
        t_killed = time.monotonic()
    finally:
        cluster.close()
    t_closed = time.monotonic()
    return {
        "ok": clean,
        "cluster up": t_cluster - t0,
        "workers up": t_active - t_cluster,
        "sdn up": t_active - t0,
        "kill": t_killed - t_down,
        "close": t_closed - t_killed,
        "sdn down": t_closed - t_down,
        "phases": dict(getattr(cluster, "phases", {})),
    }


def tcp_round(bench: Bench, rnd: int) -> dict[str, Any]:
    """The same wordcount over tcp: seconds from the first launch to every hello."""
    topology = load_topology_text(WORDCOUNT)
    options = RunOptions(hosts=[f"h{i}" for i in range(1, HOSTS + 1)], live=False)
    workdir = bench.testbed.workdir / f"startup-tcp-{rnd}"
    cluster = TcpCluster(topology, options, workdir=workdir, out=bench.out)
    try:
        t0 = time.monotonic()
        cluster.start()
        t_up = time.monotonic()
        cluster.activate()
        clean = cluster.wait()
        t_done = time.monotonic()
    finally:
        cluster.close()
    return {
        "ok": clean,
        "tcp workers up": t_up - t0,
        "tcp stop": time.monotonic() - t_done,
    }


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get("ok") and key in r]
    return round(statistics.median(values), 3) if values else None


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


@register
class Startup(Scenario):
    name = "startup"
    title = "Start-up: an emulated cluster and a tcp run's workers, up and down"
    figure = "issue 33"
    order = 22

    def run(self, bench: Bench) -> ScenarioResult:
        result = self.result(bench)
        sdn: list[dict[str, Any]] = []
        tcp: list[dict[str, Any]] = []
        for rnd in range(bench.repeats):
            for kind in ("sdn", "tcp") if rnd % 2 == 0 else ("tcp", "sdn"):
                row = sdn_round(bench, rnd) if kind == "sdn" else tcp_round(bench, rnd)
                (sdn if kind == "sdn" else tcp).append(row)
                bench.record({"label": "startup", "transport": kind, **row}, row["ok"])
                shown = {k: round(v, 2) for k, v in row.items() if isinstance(v, float)}
                print(f"  startup [{kind}] round {rnd + 1}: {shown}", file=bench.out, flush=True)
        columns = ["cluster up", "workers up", "sdn up", "kill", "close", "sdn down"]
        result.tables.append(
            Table(
                f"sdn, {HOSTS} hosts, wordcount ({SENTENCES} sentences): seconds, median",
                columns,
                [[seconds(median(sdn, c)) for c in columns]],
                "cluster up: bridges, controller and agents; workers up: submit -> every "
                "worker attached and ACTIVATEd; kill: the finished job's workers and rules "
                "removed; close: agents and controller stopped, bridges and links removed.",
            )
        )
        steps = sorted({k for r in sdn for k in r["phases"]})
        if steps:
            result.tables.append(
                Table(
                    "sdn: steps of EmulatedCluster.start and close, seconds, median",
                    steps,
                    [[seconds(median([r["phases"] | {"ok": r["ok"]} for r in sdn], s))
                      for s in steps]],
                )
            )  # fmt: skip
        result.tables.append(
            Table(
                "tcp, the same wordcount: seconds, median",
                ["tcp workers up", "tcp stop"],
                [[seconds(median(tcp, c)) for c in ("tcp workers up", "tcp stop")]],
                "tcp workers up: the first worker launched -> every hello in, peers sent.",
            )
        )
        values = {"sdn up": median(sdn, "sdn up"), "sdn down": median(sdn, "sdn down")}
        values["tcp workers up"] = median(tcp, "tcp workers up")
        for name, limit in TARGETS.items():
            v = values[name]
            met = None if v is None else v <= limit
            result.ratios.append(Ratio(f"startup: {name} (s)", v, f"<= {limit:g}", met))
        result.summary = {"sdn": sdn, "tcp": tcp, "medians": values}
        return result
