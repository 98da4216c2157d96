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

``locality-shaped`` (:class:`LocalityShaped`) is the same comparison on a
network-bound fabric, as the paper measured: every inter-host link shaped to
``BW_MBIT`` (Mininet's htb), one source per host (as the paper's spouts), so
that a tuple crossing hosts costs link time; fewer tuples for the big sizes
keep the runs short, and one extra point compares 50% with 80% locality.
"""

from __future__ import annotations

import copy
import functools
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
    locality: float = LOCALITY  # share of correlated (a, b) pairs

    @property
    def label(self) -> str:
        loc = "" if self.locality == LOCALITY else f" loc={self.locality:g}"
        return f"locality {self.routing} h={self.hosts} {self.size}B{loc}"


def workload(p: Point, count: int, rate: float, sources: int = 1) -> Topology:
    """The chain with ``p.hosts`` workers per node (and ``sources`` sources, each
    emitting ``count``); locality: both streams ``direct``."""
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "locality.yaml"))
    t.name = f"loc{p.hosts}{p.routing[0]}"
    t.nodes["source"].args.update(
        count=count, rate=rate, keys_a=KEYS, keys_b=KEYS, size=p.size, locality=p.locality
    )
    t.nodes["source"].parallelism = sources
    for node in ("a", "b"):
        t.nodes[node].parallelism = p.hosts
    if p.routing == "locality":
        pairs = Counter(
            tuple(pair_tuple(1, s, KEYS, KEYS, p.locality, "")[:2]) for s in range(PLAN_TUPLES)
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
    BW_MBIT: float | None = None  # fabric links unshaped
    SOURCES_PER_HOST = False  # one source in all (on the first host)

    # count: tuples per source, per tuple size; extra: (hosts, size, locality) points
    # run beside the grid (hash and locality each)
    FULL: dict = {
        "hosts": (2, 3),
        "sizes": (100, 1000, 12000),
        "count": {100: 60_000, 1000: 60_000, 12000: 60_000},
        "rate": 0.0,
        "extra": (),
    }
    QUICK: dict = {
        "hosts": (3,),
        "sizes": (100,),
        "count": {100: 20_000},
        "rate": 0.0,
        "extra": (),
    }

    def run(self, bench: Bench) -> ScenarioResult:
        params = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        measured: dict[Point, list[RunResult]] = {}
        for hosts in params["hosts"]:  # the cluster is rebuilt when the host count changes
            points = [
                Point(hosts, size, routing)
                for size in params["sizes"]
                for routing in ("hash", "locality")
            ] + [
                Point(h, size, routing, loc)
                for h, size, loc in params["extra"]
                if h == hosts
                for routing in ("hash", "locality")
            ]
            sources = hosts if self.SOURCES_PER_HOST else 1
            for rnd in range(bench.repeats):
                order = points if rnd % 2 == 0 else points[::-1]
                for p in order:
                    count = params["count"][p.size]
                    spec = RunSpec(
                        "sdn",
                        hosts,
                        workload(p, count, params["rate"], sources),
                        label=p.label,
                        bw_mbit=self.BW_MBIT,
                    )
                    run = bench.run(
                        spec,
                        functools.partial(
                            self._check, count=count, sources=sources, locality=p.locality
                        ),
                    )
                    measured.setdefault(p, []).append(run)
        self.describe(res, bench, measured)
        return res

    @staticmethod
    def _check(run: RunResult, count: int, sources: int, locality: float) -> None:
        """Exact counts, or the run counts as failed (loudly: it is in the records)."""
        if not run.ok:
            return
        want_a, want_b = expected_counts(count, sources, KEYS, KEYS, locality, 1)
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
        cells = sorted({(p.hosts, p.size, p.locality) for p in measured})
        rows, summary = [], []
        for hosts, size, lf in cells:
            h, loc = Point(hosts, size, "hash", lf), Point(hosts, size, "locality", lf)
            rows.append(
                [
                    str(hosts),
                    str(size),
                    f"{lf:g}",
                    f"{cross[h]:.3f}" if cross[h] is not None else "-",
                    f"{cross[loc]:.3f}" if cross[loc] is not None else "-",
                    fmt_ratio(ratio(cross[loc], cross[h])),
                    fmt_rate(rate[h]),
                    fmt_rate(rate[loc]),
                    fmt_ratio(ratio(rate[loc], rate[h])),
                    f"{sum(r.ok for r in measured[h])}+{sum(r.ok for r in measured[loc])}",
                ]
            )
            summary.append(
                {
                    "hosts": hosts,
                    "size": size,
                    "locality": lf,
                    "crossing_hash": cross[h],
                    "crossing_locality": cross[loc],
                    "b_tuples_s_hash": rate[h],
                    "b_tuples_s_locality": rate[loc],
                }
            )
        res.summary = {"points": summary, "bw_mbit": self.BW_MBIT}
        res.tables.append(
            Table(
                f"{self.title}: a -> b tuples crossing hosts and b's input rate (medians)",
                [
                    "hosts",
                    "tuple B",
                    "locality",
                    "crossing hash",
                    "crossing locality",
                    "locality/hash",
                    "b tuples/s hash",
                    "b tuples/s locality",
                    "locality/hash",
                    "ok runs hash+locality",
                ],
                rows,
                note=self.note(),
            )  # fmt: skip
        )
        for hosts, size, lf in cells:
            h, loc = Point(hosts, size, "hash", lf), Point(hosts, size, "locality", lf)
            res.ratios.append(
                Ratio(
                    f"{self.name}: crossing fraction locality/hash, {hosts} hosts, {size} B, "
                    f"{lf:g} locality",
                    ratio(cross[loc], cross[h]),
                    "<= 0.5",
                    None
                    if ratio(cross[loc], cross[h]) is None
                    else ratio(cross[loc], cross[h]) <= 0.5,
                )
            )
            res.ratios.append(
                Ratio.against(
                    f"{self.name}: b throughput locality/hash, {hosts} hosts, {size} B, "
                    f"{lf:g} locality",
                    ratio(rate[loc], rate[h]),
                    at_least=1.0,
                )
            )
        labels = [
            f"{hosts}h-{size}B" + ("" if lf == LOCALITY else f"-{lf:g}")
            for hosts, size, lf in cells
        ]
        res.plots.append(
            grouped_bars(
                bench.out_dir / f"{self.name.replace('-', '_')}_crossing.png",
                f"{self.name}: fraction of a -> b tuples crossing hosts",
                labels,
                {
                    r: [cross[Point(hs, sz, r, lf)] for hs, sz, lf in cells]
                    for r in ("hash", "locality")
                },
                "fraction crossing hosts (median)",
            )
        )
        res.plots.append(
            grouped_bars(
                bench.out_dir / f"{self.name.replace('-', '_')}_throughput.png",
                f"{self.name}: tuples/s into b",
                labels,
                {
                    r: [rate[Point(hs, sz, r, lf)] for hs, sz, lf in cells]
                    for r in ("hash", "locality")
                },
                "tuples/s (median)",
            )
        )
        res.plots.append(
            grouped_bars(
                bench.out_dir / f"{self.name.replace('-', '_')}_gain.png",
                f"{self.name}: b's input rate, locality/hash",
                labels,
                {
                    "locality/hash": [
                        ratio(rate[Point(hs, sz, "locality", lf)], rate[Point(hs, sz, "hash", lf)])
                        for hs, sz, lf in cells
                    ]
                },
                "throughput ratio (medians)",
            )
        )

    def note(self) -> str:
        """What the table's runs had in common."""
        sources = "one source per host" if self.SOURCES_PER_HOST else "one source"
        fabric = "unshaped" if self.BW_MBIT is None else f"shaped to {self.BW_MBIT:g} Mbit/s"
        return (
            f"correlated pairs (the locality column) over {KEYS} keys of each field; "
            f"one worker of a and one of b per emulated host, {sources}; "
            f"inter-host links {fabric}."
        )


@register
class LocalityShaped(Locality):
    """The same comparison with a network-bound fabric (the paper's setting)."""

    name = "locality-shaped"
    title = "Locality-aware key routing on shaped inter-host links"
    order = 20
    BW_MBIT = 20.0
    SOURCES_PER_HOST = True

    FULL: dict = {
        "hosts": (3, 2),
        "sizes": (100, 1000, 12000),
        "count": {100: 20_000, 1000: 10_000, 12000: 1_000},
        "rate": 0.0,
        "extra": ((3, 1000, 0.5),),
    }
    QUICK: dict = {
        "hosts": (3,),
        "sizes": (1000,),
        "count": {1000: 5_000},
        "rate": 0.0,
        "extra": (),
    }
