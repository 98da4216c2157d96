"""The Nexmark queries on both transports (issue 31): events per second per query, sdn and tcp.

Each query file of topologies/nexmark/ (docs/nexmark.md) with its sources
unthrottled (``rate: 0``) and a fixed number of generated events, its workers
spread over three emulated hosts, sdn and tcp runs interleaved round by round.
Measured: the events the query's sources emitted over the run time (activation
to the last worker's exit).  Every run's sinks are checked against the
reference (``typhoon.operators.nexmark_reference``): a run whose results differ
is a failed run, counted in the table, and gives no rate.  The checked sinks'
tuples are then left out of the run's record (their counts stay), so
``results.json`` does not carry every bid.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

from benchmarks.plots import grouped_bars
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_num, fmt_rate, fmt_ratio, geomean, median, paired_ratio
from benchmarks.testbed import TRANSPORTS, RunResult, RunSpec
from typhoon.operators import nexmark_reference as ref
from typhoon.topology import Topology, load_topology

QUERIES_DIR = Path(__file__).resolve().parents[2] / "topologies" / "nexmark"


def sources(topology: Topology) -> list[str]:
    return [n for n, node in topology.nodes.items() if node.operator == "nexmark_source"]


def workload(query: str, count: int) -> Topology:
    """The query's file with ``count`` events, unthrottled sources, workers spread."""
    t = copy.deepcopy(load_topology(QUERIES_DIR / f"{query}.yaml"))
    t.name = f"nexmark-{query}"
    t.config["placement"] = "spread"
    for n in sources(t):
        t.nodes[n].args.update(count=count, rate=0)
    return t


@functools.lru_cache(maxsize=16)
def _expected(query: str, count: int) -> dict[str, Any]:
    t = workload(query, count)
    return ref.expected(query, {n: node.args for n, node in t.nodes.items()})


def check(run: RunResult, query: str, count: int) -> None:
    """Every sink equals the reference, or the run failed; then the tuples leave the record."""
    if not run.ok:
        return
    results = run.report.get("results") or {}
    for sink, want in _expected(query, count).items():
        rows = (results.get(sink) or {}).get("tuples")
        if rows is None or ref.observed(query, sink, rows) != want:
            run.ok = False
            run.error = f"sink '{sink}' differs from the reference"
            return
    for sink in _expected(query, count):
        results[sink] = {"count": results[sink].get("count"), "checked": True}


def emitted(run: RunResult, query: str, count: int) -> int | None:
    """Events the query's sources emitted (all their workers)."""
    if not run.ok:
        return None
    t = workload(query, count)
    return sum(int(run.node_result(n).get("emitted") or 0) for n in sources(t))


def run_time(run: RunResult) -> float | None:
    return run.report.get("elapsed_s") if run.ok else None


def events_per_s(run: RunResult, query: str, count: int) -> float | None:
    n, t = emitted(run, query, count), run_time(run)
    return n / t if n is not None and t else None


@register
class Nexmark(Scenario):
    name = "nexmark"
    title = "Nexmark queries"
    figure = "issue 31"
    order = 12

    HOSTS = 3
    BATCH = 100
    FULL = 200_000  # generated events (persons, auctions and bids together) per run
    QUICK = 30_000

    def run(self, bench: Bench) -> ScenarioResult:
        count = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        measured: dict[tuple[str, str], list[RunResult]] = {
            (q, t): [] for q in ref.QUERIES for t in TRANSPORTS
        }
        for rnd in range(bench.repeats):
            order = TRANSPORTS if rnd % 2 == 0 else TRANSPORTS[::-1]
            for q in ref.QUERIES:
                for transport in order:
                    spec = RunSpec(
                        transport,
                        self.HOSTS,
                        workload(q, count),
                        batch_size=self.BATCH,
                        timeout=600.0,
                        label=f"{q} {count:,} events",
                    )
                    run = bench.run(spec, functools.partial(check, query=q, count=count))
                    measured[(q, transport)].append(run)
        self.describe(res, bench, measured, count)
        return res

    def describe(
        self,
        res: ScenarioResult,
        bench: Bench,
        measured: dict[tuple[str, str], list[RunResult]],
        count: int,
    ) -> None:
        rows, summary, plot = [], [], {"sdn": [], "tcp": []}
        ratios = []
        for q in ref.QUERIES:
            sdn, tcp = measured[(q, "sdn")], measured[(q, "tcp")]

            def rate(r: RunResult, q: str = q) -> float | None:
                return events_per_s(r, q, count)

            med = {"sdn": median(map(rate, sdn)), "tcp": median(map(rate, tcp))}
            pair = paired_ratio(sdn, tcp, rate)  # sdn events/s / tcp events/s, per round
            ratios.append(pair)
            failed = {"sdn": sum(not r.ok for r in sdn), "tcp": sum(not r.ok for r in tcp)}
            events = median(emitted(r, q, count) for r in sdn + tcp)
            rows.append(
                [
                    q,
                    "–" if events is None else f"{events:,.0f}",
                    fmt_rate(med["sdn"]),
                    fmt_rate(med["tcp"]),
                    fmt_ratio(pair),
                    fmt_num(median(map(run_time, sdn))),
                    fmt_num(median(map(run_time, tcp))),
                    f"{failed['sdn']} / {failed['tcp']}",
                    str(len(sdn)),
                ]
            )
            summary.append(
                {
                    "query": q,
                    "events": events,
                    "sdn_events_s": med["sdn"],
                    "tcp_events_s": med["tcp"],
                    "sdn_over_tcp": pair,
                    "sdn_runs_events_s": [rate(r) for r in sdn],
                    "tcp_runs_events_s": [rate(r) for r in tcp],
                    "failed": failed,
                    "errors": [r.error for r in sdn + tcp if r.error],
                }
            )
            for t in ("sdn", "tcp"):
                plot[t].append(med[t])
        res.summary = {"generated_events": count, "hosts": self.HOSTS, "queries": summary}
        res.ratios.append(
            Ratio(
                "Nexmark: sdn events/s over tcp events/s, geometric mean over the queries",
                geomean(ratios),
            )
        )
        res.tables.append(
            Table(
                f"{self.title}: events/s per query (medians of the interleaved runs; "
                "sdn/tcp = median of the per-round ratios)",
                [
                    "query",
                    "events",
                    "sdn events/s",
                    "tcp events/s",
                    "sdn/tcp",
                    "sdn s",
                    "tcp s",
                    "failed runs sdn / tcp",
                    "runs",
                ],
                rows,
                note=(
                    f"{count:,} generated events per run (a query's sources emit their kinds' "
                    f"share: bids 92%, auctions 6%, persons 2%), unthrottled; {self.HOSTS} "
                    f"emulated hosts, workers spread, batch {self.BATCH}. Events/s: events the "
                    "query's sources emitted / run time (activation to the last worker's exit: "
                    "start of flow, end of stream and exit included). A run whose sinks differ "
                    "from the reference is failed and gives no rate."
                ),
            )
        )
        res.plots.append(
            grouped_bars(
                bench.out_dir / "nexmark.png",
                f"Nexmark, {self.HOSTS} hosts: events/s (higher is better)",
                list(ref.QUERIES),
                plot,
                "events/s",
            )
        )
