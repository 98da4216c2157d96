"""Scenario 1, tuple forwarding (paper Fig. 8a, and Fig. 8b with Storm's acker).

A source emits 100-byte tuples as fast as it can, a sink checks their
sequence numbers; tuples/s at the sink for each I/O batch size, with both
workers on one emulated host (LOCAL) or on two (REMOTE), with and without
end-to-end acknowledgements (an acker worker that receives an init from the
source and an ack from the sink for every tuple; see
``benchmarks.operators``).  With the acker on three hosts, the acker gets a
host of its own, as Storm's round-robin placement would give it.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks import measure
from benchmarks.plots import grouped_bars
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_count, fmt_rate, fmt_ratio, geomean, median, paired_ratio, ratio
from benchmarks.testbed import RunResult, RunSpec
from benchmarks.topologies import forwarding

PLACEMENTS = {"local": 1, "remote": 3}  # emulated hosts the workers spread over


@dataclass(frozen=True)
class Point:
    placement: str
    batch: int
    ack: bool

    @property
    def label(self) -> str:
        return f"fwd {self.placement} b={self.batch}{' acked' if self.ack else ''}"


@register
class Forwarding(Scenario):
    name = "forwarding"
    title = "Tuple forwarding"
    figure = "Fig. 8a/b"
    order = 1

    TUPLE_BYTES = 100
    FULL = {"batches": (1, 10, 100, 1000), "duration": 1.5}
    QUICK = {"batches": (100,), "duration": 0.5}

    def run(self, bench: Bench) -> ScenarioResult:
        params = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        measured: dict[tuple[Point, str], list[RunResult]] = {}
        # one placement at a time: the sdn cluster is rebuilt when the host count changes
        for placement, hosts in PLACEMENTS.items():
            points = [Point(placement, b, ack) for ack in (False, True) for b in params["batches"]]

            def spec(p: Point, transport: str, hosts: int = hosts) -> RunSpec:
                return RunSpec(
                    transport,
                    hosts,
                    forwarding("fwd", size=self.TUPLE_BYTES, ack=p.ack),
                    batch_size=p.batch,
                    duration=params["duration"],
                    label=p.label,
                )

            measured.update(bench.interleaved(points, spec))
        self.describe(res, bench, measured, params["batches"])
        return res

    def describe(
        self,
        res: ScenarioResult,
        bench: Bench,
        measured: dict[tuple[Point, str], list[RunResult]],
        batches: tuple[int, ...],
    ) -> None:
        med: dict[tuple[Point, str], float | None] = {
            k: median(measure.throughput(r) for r in runs) for k, runs in measured.items()
        }
        pair = {
            p: paired_ratio(measured[(p, "sdn")], measured[(p, "tcp")], measure.throughput)
            for p, _ in measured
        }
        rows = []
        points = sorted({p for p, _ in measured}, key=lambda p: (p.ack, p.placement, p.batch))
        summary = []
        for p in points:
            sdn, tcp = med[(p, "sdn")], med[(p, "tcp")]
            lost = {t: [measure.lost(r) for r in measured[(p, t)]] for t in ("sdn", "tcp")}
            dups = {t: [measure.duplicates(r) for r in measured[(p, t)]] for t in ("sdn", "tcp")}
            runs = len(measured[(p, "sdn")])
            rows.append(
                [
                    p.placement.upper(),
                    "yes" if p.ack else "no",
                    str(p.batch),
                    fmt_rate(sdn),
                    fmt_rate(tcp),
                    fmt_ratio(pair[p]),
                    f"{fmt_count(lost['sdn'])} / {fmt_count(lost['tcp'])}",
                    f"{fmt_count(dups['sdn'])} / {fmt_count(dups['tcp'])}",
                    str(runs),
                ]
            )
            summary.append(
                {
                    "placement": p.placement,
                    "batch": p.batch,
                    "ack": p.ack,
                    "sdn_tuples_s": sdn,
                    "tcp_tuples_s": tcp,
                    "sdn_over_tcp": pair[p],
                    "sdn_runs_tuples_s": [measure.throughput(r) for r in measured[(p, "sdn")]],
                    "tcp_runs_tuples_s": [measure.throughput(r) for r in measured[(p, "tcp")]],
                    "lost": lost,
                    "duplicates": dups,
                }
            )
        res.summary = {"points": summary}
        res.tables.append(
            Table(
                f"{self.title}: tuples/s at the sink (median of the interleaved runs; "
                "sdn/tcp = median of the ratios of the two runs of each round)",
                [
                    "placement",
                    "acker",
                    "batch",
                    "sdn tuples/s",
                    "tcp tuples/s",
                    "sdn/tcp",
                    "lost sdn / tcp",
                    "dup sdn / tcp",
                    "runs",
                ],
                rows,
                note=(
                    f"{self.TUPLE_BYTES}-byte payloads; LOCAL = both workers on one emulated "
                    "host, REMOTE = on two (with the acker: three, one each). Lost = tuples the "
                    "sequence check never saw plus acker trees never completed, summed over runs."
                ),
            )
        )
        res.notes.append(
            "Setup: `sdn` workers sit on TAP ports of userspace OVS bridges (one per emulated "
            "host, full mesh, jumbo links) under the Typhoon controller; `tcp` workers run in "
            "Mininet hosts (network namespaces) attached to userspace OVS bridges of the same "
            "mesh with static per-MAC rules, so a REMOTE tuple crosses two userspace bridges "
            "in both systems; LOCAL `tcp` is loopback inside one host. Both use the same "
            "framework layer, batch size and 2 ms maximum batch delay. Frames: "
            + ", ".join(f"{t} {b}" for t, b in measure.frame_sizes(measured).items())
            + " bytes."
        )
        plain = [p for p in points if not p.ack]
        res.ratios.append(
            Ratio.against(
                "forwarding sdn/tcp throughput (geometric mean over placements and batch sizes)",
                geomean(pair[p] for p in plain),
                at_least=1.0,
            )
        )
        headline = 100 if 100 in batches else batches[-1]
        for p in plain:
            if p.batch == headline:
                res.ratios.append(
                    Ratio(
                        f"forwarding sdn/tcp, {p.placement}, batch {p.batch}",
                        pair[p],
                    )
                )
        for t in ("sdn", "tcp"):
            with_ack = [med[(p, t)] for p in points if p.ack and p.placement == "remote"]
            without = [med[(p, t)] for p in points if not p.ack and p.placement == "remote"]
            res.ratios.append(
                Ratio(
                    f"{t} remote throughput with acker / without (geometric mean over batch sizes)",
                    geomean(ratio(a, b) for a, b in zip(with_ack, without, strict=True)),
                )
            )
        for ack, fig, suffix in ((False, "8a", ""), (True, "8b", "_acked")):
            sel = [p for p in points if p.ack == ack]
            res.plots.append(
                grouped_bars(
                    bench.out_dir / f"fig{fig}_forwarding{suffix}.png",
                    f"Fig. {fig}: forwarding{' with acker' if ack else ''} "
                    f"({self.TUPLE_BYTES}-byte tuples)",
                    [f"{p.placement.upper()}-{p.batch}" for p in sel],
                    {t: [med[(p, t)] for p in sel] for t in ("sdn", "tcp")},
                    "tuples/s (median)",
                )
            )
