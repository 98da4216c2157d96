"""Scenario 3, one-to-many forwarding (paper Fig. 9).

One source sends every tuple to each of N sink workers (``all`` grouping),
the workers spread over three emulated hosts by the same scheduler for both
transports.  ``sdn`` serializes a tuple once and writes one frame per batch;
the switch copies it to each receiver (one copy per remote host on the
multicast tree, then one per local port).  ``tcp`` serializes it N times and
writes it on N connections, as Storm does.  Measured: tuples/s each sink
receives (mean over sinks), and the source's CPU per emitted tuple (its
process CPU time from the start of its event loop).

On this two-core machine N sinks share two cores with the source and the
switch: the per-sink rate must fall with N for both transports once the
sinks, not the source, are the bottleneck.  The source CPU per tuple isolates
what the transport costs the sender.  So the table also gives the CPU ceiling
(cores over the CPU every process spends per tuple) and the share of it each
run reached, and a second series runs *cheap* sinks, which check each row
batch by its ends (``benchmarks.operators.BenchSink``): with the sinks' Python
out of the way, what is left is the fan-out itself, the source and the switch.
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks import measure
from benchmarks.plots import line_panels
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_count, fmt_num, fmt_rate, fmt_ratio, median, paired_ratio, ratio
from benchmarks.testbed import RunResult, RunSpec
from benchmarks.topologies import one_to_many

Runs = dict[tuple[int, str], list[RunResult]]


@register
class OneToMany(Scenario):
    name = "one_to_many"
    title = "One-to-many forwarding"
    figure = "Fig. 9"
    order = 3

    TUPLE_BYTES = 100
    BATCH = 100
    HOSTS = 3
    FULL = {"sinks": (1, 2, 4, 6, 8), "cheap": (1, 6), "duration": 2.0}
    QUICK = {"sinks": (1, 4), "cheap": (1, 4), "duration": 1.0}

    def run(self, bench: Bench) -> ScenarioResult:
        params = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        counts = params["sinks"]

        def spec(point: tuple[int, bool], transport: str) -> RunSpec:
            n, cheap = point
            return RunSpec(
                transport,
                self.HOSTS,
                one_to_many("bcast", n, size=self.TUPLE_BYTES, cheap=cheap),
                batch_size=self.BATCH,
                duration=params["duration"],
                label=f"one-to-many sinks={n}{' cheap' if cheap else ''}",
            )

        points = [(n, False) for n in counts] + [(n, True) for n in params["cheap"]]
        runs = bench.interleaved(points, spec)
        measured = {(p[0], t): r for (p, t), r in runs.items() if not p[1]}
        self._table(res, bench, counts, measured)
        cheap = {(p[0], t): r for (p, t), r in runs.items() if p[1]}
        self._cheap(res, params["cheap"], cheap)
        return res

    def _table(
        self, res: ScenarioResult, bench: Bench, counts: tuple[int, ...], measured: Runs
    ) -> None:
        per: dict[tuple[int, str], float | None] = {}
        cpu: dict[tuple[int, str], float | None] = {}
        sink_cpu: dict[tuple[int, str], float | None] = {}
        ceiling: dict[tuple[int, str], float | None] = {}
        reached: dict[tuple[int, str], float | None] = {}
        cores = os.cpu_count() or 1
        for (n, t), runs in measured.items():
            per[(n, t)] = median(measure.per_sink(r) for r in runs)
            cpu[(n, t)] = median(measure.cpu_us_per_tuple(r) for r in runs)
            sink_cpu[(n, t)] = median(measure.sink_cpu_us_per_tuple(r) for r in runs)
            total = median(measure.total_cpu_us_per_tuple(r) for r in runs)
            ceiling[(n, t)] = cores * 1e6 / total if total else None
            reached[(n, t)] = median(ceiling_share(r, cores) for r in runs)
        pair = {
            n: paired_ratio(measured[(n, "sdn")], measured[(n, "tcp")], measure.per_sink)
            for n in counts
        }
        base = counts[0]
        rows, summary = [], []
        for n in counts:
            row, point = _row(n, base, per, pair, reached, measured)
            row[6:6] = [
                fmt_num(cpu[(n, "sdn")]),
                fmt_num(cpu[(n, "tcp")]),
                fmt_num(sink_cpu[(n, "sdn")]),
                fmt_num(sink_cpu[(n, "tcp")]),
                f"{fmt_rate(ceiling[(n, 'sdn')])} / {fmt_rate(ceiling[(n, 'tcp')])}",
            ]
            rows.append(row)
            summary.append(
                {
                    **point["head"],
                    "sdn_source_cpu_us_per_tuple": cpu[(n, "sdn")],
                    "tcp_source_cpu_us_per_tuple": cpu[(n, "tcp")],
                    "sdn_sink_cpu_us_per_tuple": sink_cpu[(n, "sdn")],
                    "tcp_sink_cpu_us_per_tuple": sink_cpu[(n, "tcp")],
                    "sdn_cpu_ceiling_per_sink": ceiling[(n, "sdn")],
                    "tcp_cpu_ceiling_per_sink": ceiling[(n, "tcp")],
                    **point["checks"],
                }
            )
        res.summary = {"batch": self.BATCH, "points": summary}
        res.tables.append(
            Table(
                f"{self.title}: tuples/s per sink and CPU (medians of the interleaved runs; "
                "sdn/tcp = median of the ratios of the two runs of each round)",
                [
                    "sinks",
                    "sdn tuples/s per sink",
                    "tcp tuples/s per sink",
                    "sdn/tcp",
                    f"sdn vs {base} sink",
                    f"tcp vs {base} sink",
                    "sdn source CPU µs/tuple",
                    "tcp source CPU µs/tuple",
                    "sdn sink CPU µs/tuple",
                    "tcp sink CPU µs/tuple",
                    "CPU ceiling per sink sdn / tcp",
                    "ceiling reached sdn / tcp",
                    "lost sdn / tcp",
                    "dup sdn / tcp",
                    "runs",
                ],
                rows,
                note=(
                    f"all grouping, batch {self.BATCH}, {self.TUPLE_BYTES}-byte payloads, "
                    "sinks spread over three emulated hosts. Lost and dup are summed over "
                    "sinks and runs (every sink must get every tuple). CPU ceiling = "
                    f"{cores} cores / (CPU of every worker and of ovs-vswitchd per tuple): "
                    "the per-sink rate this machine could reach if nothing but CPU limited it; "
                    "reached = measured rate / that ceiling (median over runs)."
                ),
            )
        )
        ref = 6 if 6 in counts else counts[-1]
        if base == 1:
            res.ratios.append(
                Ratio.against(
                    f"one-to-many sdn: {ref} sinks vs 1 sink, tuples/s per sink",
                    ratio(per[(ref, "sdn")], per[(1, "sdn")]),
                    at_least=0.8,
                )
            )
            res.ratios.append(
                Ratio(
                    f"one-to-many tcp: {ref} sinks vs 1 sink, tuples/s per sink",
                    ratio(per[(ref, "tcp")], per[(1, "tcp")]),
                )
            )
        res.ratios.append(
            Ratio.against(
                f"one-to-many sdn/tcp at {ref} sinks, tuples/s per sink",
                pair[ref],
                at_least=3.0,
            )
        )
        res.ratios.append(
            Ratio(
                f"one-to-many source CPU per tuple tcp/sdn at {ref} sinks",
                ratio(cpu[(ref, "tcp")], cpu[(ref, "sdn")]),
            )
        )
        if base == 1:
            # what the sender alone allows: the rate if every sink had a core of its own
            res.ratios.append(
                Ratio(
                    f"one-to-many sdn source CPU per tuple, 1 sink / {ref} sinks "
                    f"(source-bound rate at {ref} vs 1 sink)",
                    ratio(cpu[(1, "sdn")], cpu[(ref, "sdn")]),
                )
            )
        res.ratios.append(
            Ratio(
                f"one-to-many sdn: share of the CPU ceiling reached at {ref} sinks",
                reached[(ref, "sdn")],
            )
        )
        res.plots.append(
            line_panels(
                bench.out_dir / "fig9_one_to_many.png",
                f"Fig. 9: one source to N sinks (all grouping, batch {self.BATCH})",
                list(counts),
                "sinks",
                {
                    "tuples/s per sink": {t: [per[(n, t)] for n in counts] for t in ("sdn", "tcp")},
                    "source CPU µs per tuple": {
                        t: [cpu[(n, t)] for n in counts] for t in ("sdn", "tcp")
                    },
                },
            )
        )

    def _cheap(self, res: ScenarioResult, counts: tuple[int, ...], measured: Runs) -> None:
        """The cheap-sink series: the fan-out measured with sinks that cost little."""
        cores = os.cpu_count() or 1
        per = {k: median(measure.per_sink(r) for r in runs) for k, runs in measured.items()}
        reached = {k: median(ceiling_share(r, cores) for r in runs) for k, runs in measured.items()}
        pair = {
            n: paired_ratio(measured[(n, "sdn")], measured[(n, "tcp")], measure.per_sink)
            for n in counts
        }
        rows, points = [], []
        for n in counts:
            sink_cpu = {
                t: median(measure.sink_cpu_us_per_tuple(r) for r in measured[(n, t)])
                for t in ("sdn", "tcp")
            }
            row, point = _row(n, counts[0], per, pair, reached, measured)
            row.insert(6, f"{fmt_num(sink_cpu['sdn'])} / {fmt_num(sink_cpu['tcp'])}")
            rows.append(row)
            points.append({**point["head"], **point["checks"]})
        res.summary["cheap_sinks"] = points
        res.tables.append(
            Table(
                f"{self.title}, cheap sinks (each row batch checked by its ends): tuples/s "
                "per sink (medians)",
                [
                    "sinks",
                    "sdn tuples/s per sink",
                    "tcp tuples/s per sink",
                    "sdn/tcp",
                    f"sdn vs {counts[0]} sink",
                    f"tcp vs {counts[0]} sink",
                    "sink CPU µs/tuple sdn / tcp",
                    "ceiling reached sdn / tcp",
                    "lost sdn / tcp",
                    "dup sdn / tcp",
                    "runs",
                ],
                rows,
                note=(
                    "Same runs as above but the sinks account for each arriving row batch by "
                    "its first, middle and last sequence numbers (row by row whenever those "
                    "do not line up), so loss and duplicates are still counted exactly."
                ),
            )
        )
        ref, base = counts[-1], counts[0]
        res.ratios.append(
            Ratio(
                f"one-to-many, cheap sinks: sdn {ref} sinks vs {base}, tuples/s per sink",
                ratio(per[(ref, "sdn")], per[(base, "sdn")]),
            )
        )
        res.ratios.append(Ratio(f"one-to-many, cheap sinks: sdn/tcp at {ref} sinks", pair[ref]))


def ceiling_share(run: RunResult, cores: int) -> float | None:
    """Measured tuples/s per sink over the CPU ceiling of the same run."""
    total = measure.total_cpu_us_per_tuple(run)
    rate = measure.per_sink(run)
    if not total or rate is None:
        return None
    return rate / (cores * 1e6 / total)


def _row(
    n: int,
    base: int,
    per: dict[tuple[int, str], float | None],
    pair: dict[int, float | None],
    reached: dict[tuple[int, str], float | None],
    measured: Runs,
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The cells and summary entries both series share for ``n`` sinks: the per-sink
    rates and their ratios first; the ceiling reached, what was lost or duplicated and
    the runs last (a series inserts its own columns at index 6)."""
    runs = {t: measured[(n, t)] for t in ("sdn", "tcp")}
    lost = {t: [measure.lost(r) for r in rs] for t, rs in runs.items()}
    dups = {t: [measure.duplicates(r) for r in rs] for t, rs in runs.items()}
    cells = [
        str(n),
        fmt_rate(per[(n, "sdn")]),
        fmt_rate(per[(n, "tcp")]),
        fmt_ratio(pair[n]),
        fmt_ratio(ratio(per[(n, "sdn")], per[(base, "sdn")])),
        fmt_ratio(ratio(per[(n, "tcp")], per[(base, "tcp")])),
        f"{fmt_pct(reached[(n, 'sdn')])} / {fmt_pct(reached[(n, 'tcp')])}",
        f"{fmt_count(lost['sdn'])} / {fmt_count(lost['tcp'])}",
        f"{fmt_count(dups['sdn'])} / {fmt_count(dups['tcp'])}",
        str(len(runs["sdn"])),
    ]
    head = {
        "sinks": n,
        "sdn_per_sink_tuples_s": per[(n, "sdn")],
        "tcp_per_sink_tuples_s": per[(n, "tcp")],
        "sdn_over_tcp": pair[n],
    }
    checks = {
        "sdn_ceiling_reached": reached[(n, "sdn")],
        "tcp_ceiling_reached": reached[(n, "tcp")],
        "sdn_runs_per_sink": [measure.per_sink(r) for r in runs["sdn"]],
        "tcp_runs_per_sink": [measure.per_sink(r) for r in runs["tcp"]],
        "lost": lost,
        "duplicates": dups,
    }
    return cells, {"head": head, "checks": checks}


def fmt_pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"
