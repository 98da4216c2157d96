"""Scenario: locality-aware key routing (seed paper 003, Caneill et al.; issue 17).

``topologies/locality.yaml``'s chain (``pair_source`` -> ``a``: ``count_forward``
on key ``a`` -> ``b``: ``count_by_key`` on key ``b``), one worker of each per
emulated host (``placement: spread``), 80% of the (a, b) pairs correlated, run
with both groupings hashed (``fields``) and with the ``direct`` tables the
locality router would install, side by side in every round.  The tables come
from the same partition the router runs (``typhoon/locality/partition.py``),
fed here with the exact pair counts of the run's first tuples (the generator
is a pure function), so the comparison is of the routings, not of sampling.
The online switch from one to the other, and the router's own sampling, are
tested in ``tests/integration/test_locality_online.py``.

Measured per run: the fraction of ``a`` -> ``b`` tuples that crossed hosts
(each ``a`` worker's per-receiver counts in its exit report, hosts from the
physical topology) and the rate at which ``b`` took them in (tuples over the
run's time).  Counts are checked against the generator in every run.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks.plots import grouped_bars
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_rate, fmt_ratio, median, ratio
from benchmarks.testbed import RunResult, RunSpec
from typhoon.locality.partition import Slot, plan_locality
from typhoon.operators.pairs import expected_counts, pair_tuple
from typhoon.topology import load_topology
from typhoon.topology.model import Grouping, Topology

ROOT = Path(__file__).resolve().parents[2]
KEYS = 100
LOCALITY = 0.8
PLAN_TUPLES = 20_000  # the tables are planned from this many tuples' pairs


@dataclass(frozen=True)
class Point:
    hosts: int
    size: int
    routing: str  # "hash" | "locality"

    @property
    def label(self) -> str:
        return f"locality {self.routing} h={self.hosts} {self.size}B"


def workload(p: Point, count: int, rate: float) -> Topology:
    """The chain with ``p.hosts`` workers per node; locality: both streams ``direct``."""
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "locality.yaml"))
    t.name = f"loc{p.hosts}{p.routing[0]}"
    t.nodes["source"].args.update(count=count, rate=rate, keys_a=KEYS, keys_b=KEYS, size=p.size)
    for node in ("a", "b"):
        t.nodes[node].parallelism = p.hosts
    if p.routing == "locality":
        pairs = Counter(
            tuple(pair_tuple(1, s, KEYS, KEYS, LOCALITY, "")[:2]) for s in range(PLAN_TUPLES)
        )
        # spread placement: worker i of every node on host i mod H
        slots = [Slot(i, f"h{i}") for i in range(p.hosts)]
        plan = plan_locality(pairs, slots, slots)
        t.streams[0].grouping = Grouping("direct", ("a",), dict(plan.table_a))
        t.streams[1].grouping = Grouping("direct", ("b",), dict(plan.table_b))
    return t


def crossing_fraction(run: RunResult) -> float | None:
    """Share of the a -> b tuples (stream 2) whose sender and receiver ran on two hosts."""
    if not run.ok:
        return None
    host = {w["worker"]: w["host"] for w in run.report.get("workers", [])}
    crossed = total = 0
    for w in run.node_workers("a"):
        for key, n in w["links"]["out"].items():
            dst, sid = map(int, key.split(":"))
            if sid == 2:
                total += n
                crossed += n if host.get(dst) != host.get(w["worker"]) else 0
    return crossed / total if total else None


def b_rate(run: RunResult) -> float | None:
    """Tuples/s into ``b`` over the run (source start to last worker's end)."""
    if not run.ok:
        return None
    elapsed = run.report.get("elapsed_s") or run.wall_s
    return run.report["nodes"]["b"]["tuples_in"] / elapsed if elapsed else None


@register
class Locality(Scenario):
    name = "locality"
    title = "Locality-aware key routing: hash vs computed tables"
    figure = "issue 17 (seed paper 003, Fig. 7-9)"
    order = 20

    FULL = {"hosts": (2, 3), "sizes": (100, 1000, 12000), "count": 60_000, "rate": 0.0}
    QUICK = {"hosts": (3,), "sizes": (100,), "count": 20_000, "rate": 0.0}

    def run(self, bench: Bench) -> ScenarioResult:
        params = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        measured: dict[Point, list[RunResult]] = {}
        for hosts in params["hosts"]:  # the cluster is rebuilt when the host count changes
            points = [
                Point(hosts, size, routing)
                for size in params["sizes"]
                for routing in ("hash", "locality")
            ]
            for rnd in range(bench.repeats):
                order = points if rnd % 2 == 0 else points[::-1]
                for p in order:
                    spec = RunSpec(
                        "sdn", hosts, workload(p, params["count"], params["rate"]), label=p.label
                    )
                    run = bench.run(spec)
                    self._check(run, params["count"])
                    measured.setdefault(p, []).append(run)
        self.describe(res, bench, measured)
        return res

    @staticmethod
    def _check(run: RunResult, count: int) -> None:
        """Exact counts, or the run counts as failed (loudly: it is in the records)."""
        if not run.ok:
            return
        want_a, want_b = expected_counts(count, 1, KEYS, KEYS, LOCALITY, 1)
        got_a = run.node_result("a").get("counts")
        got_b = run.node_result("b").get("counts")
        if got_a != want_a or got_b != want_b:
            run.ok = False
            run.error = "counts differ from the generator's"

    def describe(
        self, res: ScenarioResult, bench: Bench, measured: dict[Point, list[RunResult]]
    ) -> None:
        cross = {p: median(crossing_fraction(r) for r in runs) for p, runs in measured.items()}
        rate = {p: median(b_rate(r) for r in runs) for p, runs in measured.items()}
        cells = sorted({(p.hosts, p.size) for p in measured})
        rows, summary = [], []
        for hosts, size in cells:
            h, loc = Point(hosts, size, "hash"), Point(hosts, size, "locality")
            rows.append(
                [
                    str(hosts),
                    str(size),
                    f"{cross[h]:.3f}" if cross[h] is not None else "-",
                    f"{cross[loc]:.3f}" if cross[loc] is not None else "-",
                    fmt_ratio(ratio(cross[loc], cross[h])),
                    fmt_rate(rate[h]),
                    fmt_rate(rate[loc]),
                    fmt_ratio(ratio(rate[loc], rate[h])),
                    str(len(measured[h])),
                ]
            )
            summary.append(
                {
                    "hosts": hosts,
                    "size": size,
                    "crossing_hash": cross[h],
                    "crossing_locality": cross[loc],
                    "b_tuples_s_hash": rate[h],
                    "b_tuples_s_locality": rate[loc],
                }
            )
        res.summary = {"points": summary}
        res.tables.append(
            Table(
                f"{self.title}: a -> b tuples crossing hosts and b's input rate (medians)",
                [
                    "hosts",
                    "tuple B",
                    "crossing hash",
                    "crossing locality",
                    "locality/hash",
                    "b tuples/s hash",
                    "b tuples/s locality",
                    "locality/hash",
                    "runs",
                ],
                rows,
                note=f"{int(LOCALITY * 100)}% correlated pairs over {KEYS} keys of each field; "
                "one worker of a and one of b per emulated host.",
            )  # fmt: skip
        )
        for hosts, size in cells:
            h, loc = Point(hosts, size, "hash"), Point(hosts, size, "locality")
            res.ratios.append(
                Ratio(
                    f"locality: crossing fraction locality/hash, {hosts} hosts, {size} B",
                    ratio(cross[loc], cross[h]),
                    "<= 0.5",
                    None
                    if ratio(cross[loc], cross[h]) is None
                    else ratio(cross[loc], cross[h]) <= 0.5,
                )
            )
            res.ratios.append(
                Ratio.against(
                    f"locality: b throughput locality/hash, {hosts} hosts, {size} B",
                    ratio(rate[loc], rate[h]),
                    at_least=1.0,
                )
            )
        labels = [f"{hosts}h-{size}B" for hosts, size in cells]
        res.plots.append(
            grouped_bars(
                bench.out_dir / "locality_crossing.png",
                "Locality: fraction of a -> b tuples crossing hosts",
                labels,
                {r: [cross[Point(hs, sz, r)] for hs, sz in cells] for r in ("hash", "locality")},
                "fraction crossing hosts (median)",
            )
        )
        res.plots.append(
            grouped_bars(
                bench.out_dir / "locality_throughput.png",
                "Locality: tuples/s into b",
                labels,
                {r: [rate[Point(hs, sz, r)] for hs, sz in cells] for r in ("hash", "locality")},
                "tuples/s (median)",
            )
        )
