"""Scenario: Redis -> PostgreSQL end to end, with and without exactly_once (issue 32).

The example job ``topologies/redis_postgres_wordcount.yaml`` (a Redis stream of
generated sentences -> split -> running count -> ``postgres_sink`` appending each
``(word, n)``) on 3 emulated hosts over sdn, its source unthrottled and bounded
(``until: end``), under each guarantee: ``none``, ``at_least_once`` and
``exactly_once`` (the sink's two-phase commit per global checkpoint), interleaved
round by round with the order rotated.  The servers are a Redis and a PostgreSQL of
the benchmark's own (``benchmarks/connector_servers.py``) on loopback; the sdn
workers run in the root namespace and reach them there.  sdn only: the tcp
fabric's workers sit in namespaces of their own.

Measured per run: rows/s, the rows the sink committed over the run time
(activation to the last worker's exit), and from the sink workers' metrics the
time of one commit call (a transaction: a batch, or the closed epochs of a
checkpoint) and, under ``exactly_once``, anchor -> visible: from an epoch's
pre-commit to the end of the commit that makes its rows visible in the table.
Every run's table is checked against the reference (every ``(w, 1..c_w)`` once):
a run whose table differs is a failed run and gives no rate.  The headline is
exactly_once rows/s over none rows/s, paired per round (target >= 0.8: an
exactly-once overhead of at most 20%).
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Protocol

from benchmarks.plots import grouped_bars
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_num, fmt_rate, fmt_ratio, median, paired_ratio
from benchmarks.testbed import RunResult, RunSpec
from typhoon.topology import Topology, load_topology

TOPOLOGY = Path(__file__).resolve().parents[2] / "topologies" / "redis_postgres_wordcount.yaml"
VARIANTS = ("none", "at_least_once", "exactly_once")


class Servers(Protocol):
    """What the scenario needs of the outside servers (``LocalServers`` in a real run)."""

    redis_url: str
    pg_dsn: str

    def prepare(self, sentences: int, seed: int) -> Counter: ...
    def clear(self) -> None: ...
    def rows(self) -> list[tuple[str, int]]: ...
    def close(self) -> None: ...


def workload(guarantee: str, servers: Servers, checkpoint_ms: int) -> Topology:
    """The example file on our servers: bounded, unthrottled, workers spread."""
    t = copy.deepcopy(load_topology(TOPOLOGY))
    t.name = f"connectors-{guarantee.replace('_', '-')}"
    t.config.update(placement="spread", guarantee=guarantee, checkpoint_interval_ms=checkpoint_ms)
    t.nodes["source"].args.update(url=servers.redis_url, until="end", rate=0)
    t.nodes["sink"].args.update(dsn=servers.pg_dsn)
    return t


def table_problem(rows: list[tuple[str, int]], want: Counter) -> str:
    """Why the appended running counts are not the reference exactly ('' if they are)."""
    got = Counter(rows)
    dup = sum(1 for k in got.values() if k > 1)
    expected = {(w, i) for w, n in want.items() for i in range(1, n + 1)}
    missing, extra = len(expected - set(got)), len(set(got) - expected)
    if dup or missing or extra:
        return (
            f"the table differs from the reference ({missing} missing, {dup} twice, {extra} extra)"
        )
    return ""


def rows_per_s(run: RunResult) -> float | None:
    written = run.node_result("sink").get("written") if run.ok else None
    elapsed = run.report.get("elapsed_s") if run.ok else None
    return written / elapsed if written is not None and elapsed else None


def sink_timing(run: RunResult, name: str) -> tuple[float | None, float | None]:
    """(median over the sink workers of their p50, worst of their p95) of ``sink_<name>_s``."""
    if not run.ok:
        return None, None
    metrics = [w.get("metrics") or {} for w in run.node_workers("sink")]
    p50 = [m[f"sink_{name}_s_p50"] for m in metrics if f"sink_{name}_s_p50" in m]
    p95 = [m[f"sink_{name}_s_p95"] for m in metrics if f"sink_{name}_s_p95" in m]
    return median(p50), (max(p95) if p95 else None)


def ms(v: float | None) -> str:
    return fmt_num(None if v is None else v * 1000, 1)


@register
class Connectors(Scenario):
    name = "connectors"
    title = "Connectors: Redis -> PostgreSQL under each guarantee"
    figure = "issue 32"
    order = 13

    HOSTS = 3
    BATCH = 100
    CHECKPOINT_MS = 500  # the example's interval
    FULL = 100_000  # sentences (6 words each: 600,000 rows)
    QUICK = 20_000
    SEED = 32

    def start_servers(self) -> Servers:
        from benchmarks.connector_servers import LocalServers

        return LocalServers()

    def run(self, bench: Bench) -> ScenarioResult:
        sentences = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        servers = self.start_servers()
        try:
            want = servers.prepare(sentences, self.SEED)
            measured: dict[str, list[RunResult]] = {v: [] for v in VARIANTS}
            for rnd in range(bench.repeats):
                k = rnd % len(VARIANTS)
                for guarantee in VARIANTS[k:] + VARIANTS[:k]:  # each goes first in turn
                    servers.clear()
                    spec = RunSpec(
                        "sdn",
                        self.HOSTS,
                        workload(guarantee, servers, self.CHECKPOINT_MS),
                        batch_size=self.BATCH,
                        timeout=600.0,
                        label=f"{guarantee} {sentences:,} sentences",
                    )

                    def check(run: RunResult) -> None:
                        problem = table_problem(servers.rows(), want)
                        if problem:
                            run.ok, run.error = False, problem

                    measured[guarantee].append(bench.run(spec, check))
        finally:
            servers.close()
        self.describe(res, bench, measured, sentences, sum(want.values()))
        return res

    def describe(
        self,
        res: ScenarioResult,
        bench: Bench,
        measured: dict[str, list[RunResult]],
        sentences: int,
        rows: int,
    ) -> None:
        table, summary, rates = [], [], []
        latency: dict[str, list[float | None]] = {"commit p50": [], "anchor->visible p50": []}
        for v in VARIANTS:
            runs = measured[v]
            rate = median(map(rows_per_s, runs))
            commit = [sink_timing(r, "commit") for r in runs]
            visible = [sink_timing(r, "visible") for r in runs]
            pair = paired_ratio(runs, measured["none"], rows_per_s)
            c50, c95 = median(c[0] for c in commit), median(c[1] for c in commit)
            v50, v95 = median(x[0] for x in visible), median(x[1] for x in visible)
            failed = sum(not r.ok for r in runs)
            table.append(
                [v, fmt_rate(rate), fmt_ratio(pair), ms(c50), ms(c95), ms(v50), ms(v95),
                 str(failed), str(len(runs))]
            )  # fmt: skip
            summary.append(
                {
                    "guarantee": v,
                    "rows_s": rate,
                    "over_none": pair,
                    "runs_rows_s": [rows_per_s(r) for r in runs],
                    "commit_s_p50": c50,
                    "commit_s_p95": c95,
                    "visible_s_p50": v50,
                    "visible_s_p95": v95,
                    "failed": failed,
                    "errors": [r.error for r in runs if r.error],
                }
            )
            rates.append(rate)
            latency["commit p50"].append(None if c50 is None else c50 * 1000)
            latency["anchor->visible p50"].append(None if v50 is None else v50 * 1000)
        over = summary[VARIANTS.index("exactly_once")]["over_none"]
        res.summary = {
            "sentences": sentences,
            "rows": rows,
            "hosts": self.HOSTS,
            "variants": summary,
        }
        res.ratios.append(
            Ratio.against("connectors: exactly_once rows/s over none rows/s", over, at_least=0.8)
        )
        res.tables.append(
            Table(
                f"{self.title}: rows/s into PostgreSQL and commit latency (medians of the runs)",
                [
                    "guarantee",
                    "rows/s",
                    "over none",
                    "commit p50 ms",
                    "commit p95 ms",
                    "anchor->visible p50 ms",
                    "anchor->visible p95 ms",
                    "failed runs",
                    "runs",
                ],
                table,
                note=(
                    f"{sentences:,} sentences ({rows:,} rows) from a Redis stream -> split -> "
                    f"running count -> postgres_sink (append), {self.HOSTS} emulated hosts, sdn, "
                    f"workers spread, source unthrottled, checkpoints every "
                    f"{self.CHECKPOINT_MS} ms (none: no checkpoints). rows/s: rows committed / "
                    "run time. over none: median of the per-round ratios. commit: one write or "
                    "commit transaction of a sink worker (p50: median over the workers, p95: "
                    "the worst worker's). anchor->visible: exactly_once only, from an epoch's "
                    "pre-commit to its rows being visible. A run whose table differs from the "
                    "reference is failed and gives no numbers."
                ),
            )  # fmt: skip
        )
        res.plots.append(
            grouped_bars(
                bench.out_dir / "connectors.png",
                f"Redis -> PostgreSQL, {self.HOSTS} hosts: rows/s (higher is better)",
                list(VARIANTS),
                {"sdn": rates},
                "rows/s",
            )
        )
        res.plots.append(
            grouped_bars(
                bench.out_dir / "connectors_latency.png",
                "Redis -> PostgreSQL: sink commit latency (lower is better)",
                list(VARIANTS),
                latency,
                "ms",
            )
        )
