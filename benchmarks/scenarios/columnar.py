"""The columnar path end to end (issue 33's moonshot: 3M tuples/s through one sdn link).

``forwarding``'s source -> sink, 100-byte payloads, as fast as the source can, in
two forms: **rows** (``sequence_source``, msgpack row batches) and **columns**
(``sequence_columns``: numpy columns sent with ``emit_columns`` as column blocks on
a stream that declares its columns; the sink checks them as columns).  Both
transports in every round (alternated), on one emulated host and on two.  Every
run's sequence check must be exact; the table says how many tuples went missing or
came twice.  Frames: the sdn workers' default (64,000 bytes, what the byte windows
take several of), and tcp's the same by default (``typhoon.worker_specs.tcp_mtu``;
``typhoon bench --tcp-mtu 9000`` for the size tcp had before); the table's note says
what the runs used.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks import measure
from benchmarks.plots import grouped_bars
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_count, fmt_rate, fmt_ratio, median, paired_ratio
from benchmarks.testbed import RunResult, RunSpec
from benchmarks.topologies import forwarding

PLACEMENTS = {"local": 1, "remote": 2}  # emulated hosts the two workers spread over
TARGET = 3_000_000  # tuples/s at the sink: issue 33's moonshot


@dataclass(frozen=True)
class Point:
    placement: str
    columns: bool

    @property
    def form(self) -> str:
        return "columns" if self.columns else "rows"

    @property
    def label(self) -> str:
        return f"columnar {self.placement} {self.form}"


@register
class Columnar(Scenario):
    name = "columnar"
    title = "Columnar forwarding: rows against column blocks"
    figure = "issue 33"
    order = 24

    TUPLE_BYTES = 100
    FULL = {"duration": 3.0, "batch": 1000}
    QUICK = {"duration": 1.0, "batch": 1000}

    def run(self, bench: Bench) -> ScenarioResult:
        params = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        measured: dict[tuple[Point, str], list[RunResult]] = {}
        for placement, hosts in PLACEMENTS.items():  # the sdn cluster changes with the hosts
            points = [Point(placement, c) for c in (False, True)]

            def spec(p: Point, transport: str, hosts: int = hosts) -> RunSpec:
                return RunSpec(
                    transport,
                    hosts,
                    forwarding("col", size=self.TUPLE_BYTES, columns=p.columns),
                    batch_size=params["batch"],
                    duration=params["duration"],
                    label=p.label,
                )

            measured.update(bench.interleaved(points, spec))
        self.describe(res, bench, measured, params)
        return res

    def describe(
        self,
        res: ScenarioResult,
        bench: Bench,
        measured: dict[tuple[Point, str], list[RunResult]],
        params: dict[str, float],
    ) -> None:
        med = {k: median(measure.throughput(r) for r in runs) for k, runs in measured.items()}
        points = sorted({p for p, _ in measured}, key=lambda p: (p.placement, p.columns))
        rows, summary = [], []
        for p in points:
            runs = {t: measured[(p, t)] for t in ("sdn", "tcp")}
            lost = {t: [measure.lost(r) for r in rs] for t, rs in runs.items()}
            dups = {t: [measure.duplicates(r) for r in rs] for t, rs in runs.items()}
            each = {t: [measure.throughput(r) for r in rs] for t, rs in runs.items()}
            best = max((v for v in each["sdn"] if v is not None), default=None)
            pair = paired_ratio(runs["sdn"], runs["tcp"], measure.throughput)
            rows.append(
                [
                    p.placement.upper(),
                    p.form,
                    fmt_rate(med[(p, "sdn")]),
                    fmt_rate(best),
                    fmt_rate(med[(p, "tcp")]),
                    fmt_ratio(pair),
                    f"{fmt_count(lost['sdn'])} / {fmt_count(lost['tcp'])}",
                    f"{fmt_count(dups['sdn'])} / {fmt_count(dups['tcp'])}",
                    str(len(runs["sdn"])),
                ]
            )
            summary.append(
                {
                    "placement": p.placement,
                    "form": p.form,
                    "sdn_tuples_s": med[(p, "sdn")],
                    "tcp_tuples_s": med[(p, "tcp")],
                    "sdn_runs_tuples_s": each["sdn"],
                    "tcp_runs_tuples_s": each["tcp"],
                    "sdn_over_tcp": pair,
                    "lost": lost,
                    "duplicates": dups,
                    "reached_target": best is not None and best >= TARGET,
                }
            )
        frames = measure.frame_sizes(measured)
        res.summary = {
            "points": summary,
            "target_tuples_s": TARGET,
            "frame_bytes": frames,
            **params,
        }
        res.tables.append(
            Table(
                f"{self.title}: tuples/s at the sink (median of the interleaved runs, and the "
                "best sdn run; sdn/tcp = median of each round's ratio)",
                [
                    "placement",
                    "form",
                    "sdn tuples/s",
                    "best sdn",
                    "tcp tuples/s",
                    "sdn/tcp",
                    "lost sdn / tcp",
                    "dup sdn / tcp",
                    "runs",
                ],
                rows,
                note=(
                    f"{self.TUPLE_BYTES}-byte payloads (a row: 8+8+8 bytes of src/seq/ts, the "
                    f"payload and its 4-byte offset in a block); batch {params['batch']}; "
                    f"{params['duration']:g} s a run, then drained; LOCAL = both workers on one "
                    "emulated host, REMOTE = on two. Frames: "
                    + ", ".join(f"{t} {b}" for t, b in frames.items())
                    + " bytes. "
                    f"Target: {TARGET:,} tuples/s at the sink (issue 33)."
                ),
            )
        )
        for placement in PLACEMENTS:
            rows_p, cols_p = Point(placement, False), Point(placement, True)
            if (rows_p, "sdn") in measured and (cols_p, "sdn") in measured:
                res.ratios.append(
                    Ratio(
                        f"{placement} sdn: columns / rows tuples/s (medians)",
                        (med[(cols_p, "sdn")] or 0) / (med[(rows_p, "sdn")] or 1),
                    )
                )
                res.ratios.append(
                    Ratio.against(
                        f"{placement} sdn columns, best run, tuples/s / 3M",
                        max(
                            (
                                v
                                for v in (measure.throughput(r) for r in measured[(cols_p, "sdn")])
                                if v is not None
                            ),
                            default=0.0,
                        )
                        / TARGET,  # fmt: skip
                        at_least=1.0,
                    )
                )
        res.plots.append(
            grouped_bars(
                bench.out_dir / "columnar.png",
                f"Columnar forwarding ({self.TUPLE_BYTES}-byte tuples), tuples/s at the sink",
                [f"{p.placement.upper()} {p.form}" for p in points],
                {t: [med[(p, t)] for p in points] for t in ("sdn", "tcp")},
                "tuples/s (median)",
                note=f"target {TARGET:,}/s",
            )
        )
