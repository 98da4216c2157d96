"""Scenario 2, per-tuple latency (paper Fig. 8c/d).

Source -> sink on two emulated hosts at a fixed offered load well below
saturation (2,000 tuples/s: the slowest configuration, ``sdn`` at batch size 1,
forwarded 5,000-30,000 tuples/s on this machine depending on its load), so
what is measured is the path, not a queue.  The sink takes each
tuple's latency from the timestamp the source put in it (both ends on one
machine, one clock) and keeps quantiles; the CDF plots the quantiles averaged
over runs.

Batching trades latency for throughput: a batch leaves when it is full or when
its oldest tuple has waited ``max_delay_ms``.  That bound is raised here to
100 ms (runs elsewhere use 2 ms), long enough that at this load a batch of 100
fills before the timer (50 ms) and a batch of 1000 does not, so the curves
show the trade-off the paper's do.  Both transports batch in the same
framework layer with the same settings.
"""

from __future__ import annotations

from benchmarks import measure
from benchmarks.plots import cdf_panels
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_count, fmt_num, fmt_rate, median, ratio
from benchmarks.testbed import RunResult, RunSpec
from benchmarks.topologies import forwarding

PERCENTILES = (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999))


def mean_quantiles(runs: list[RunResult]) -> list[float] | None:
    """Pointwise mean of the runs' quantile lists (a CDF averaged over runs)."""
    qs = [q for q in (measure.latency_quantiles(r) for r in runs) if q]
    if not qs:
        return None
    n = min(len(q) for q in qs)
    return [sum(q[i] for q in qs) / len(qs) for i in range(n)]


def ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


@register
class Latency(Scenario):
    name = "latency"
    title = "Per-tuple latency"
    figure = "Fig. 8c/d"
    order = 2

    TUPLE_BYTES = 100
    RATE = 2000  # tuples/s offered
    MAX_DELAY_MS = 100.0
    HOSTS = 3  # remote: source and sink on two emulated hosts
    FULL = {"batches": (1, 10, 100, 1000), "duration": 4.0, "repeats": 2}
    QUICK = {"batches": (1, 100), "duration": 2.0, "repeats": 1}

    def run(self, bench: Bench) -> ScenarioResult:
        params = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)

        def spec(batch: int, transport: str) -> RunSpec:
            return RunSpec(
                transport,
                self.HOSTS,
                forwarding("lat", size=self.TUPLE_BYTES, rate=self.RATE),
                batch_size=batch,
                max_delay_ms=self.MAX_DELAY_MS,
                duration=params["duration"],
                label=f"latency b={batch}",
            )

        batches = params["batches"]
        measured = bench.interleaved(batches, spec, repeats=params["repeats"])
        pct: dict[tuple[int, str, str], float | None] = {}
        rows, summary = [], []
        for b in batches:
            row = [str(b)]
            entry: dict = {"batch": b}
            for t in ("sdn", "tcp"):
                runs = measured[(b, t)]
                for name, p in PERCENTILES:
                    v = median(
                        ms(measure.percentile(measure.latency_quantiles(r), p)) for r in runs
                    )
                    pct[(b, t, name)] = v
                    entry[f"{t}_{name}_ms"] = v
                achieved = median(measure.throughput(r) for r in runs)
                entry[f"{t}_tuples_s"] = achieved
                entry[f"{t}_lost"] = [measure.lost(r) for r in runs]
                entry[f"{t}_duplicates"] = [measure.duplicates(r) for r in runs]
                row += [fmt_num(pct[(b, t, n)]) for n, _ in PERCENTILES] + [fmt_rate(achieved)]
            row += [
                f"{fmt_count(entry['sdn_lost'])} / {fmt_count(entry['tcp_lost'])}",
                f"{fmt_count(entry['sdn_duplicates'])} / {fmt_count(entry['tcp_duplicates'])}",
                str(len(measured[(b, "sdn")])),
            ]
            rows.append(row)
            entry["sdn_cdf_s"] = mean_quantiles(measured[(b, "sdn")])
            entry["tcp_cdf_s"] = mean_quantiles(measured[(b, "tcp")])
            summary.append(entry)
        res.summary = {
            "rate": self.RATE,
            "max_delay_ms": self.MAX_DELAY_MS,
            "batches": summary,
        }
        cols = ["batch"]
        for t in ("sdn", "tcp"):
            cols += [f"{t} {n} ms" for n, _ in PERCENTILES] + [f"{t} tuples/s"]
        res.tables.append(
            Table(
                f"{self.title} at {self.RATE:,} tuples/s offered (median of the interleaved runs)",
                [*cols, "lost sdn / tcp", "dup sdn / tcp", "runs"],
                rows,
                note=(
                    f"REMOTE (two emulated hosts), {self.TUPLE_BYTES}-byte payloads, "
                    f"max batch delay {self.MAX_DELAY_MS:g} ms. Latency = arrival at the sink "
                    "minus the timestamp the source wrote into the tuple."
                ),
            )
        )
        for b in (batches[0], 100 if 100 in batches else batches[-1]):
            for n in ("p50", "p99"):
                res.ratios.append(
                    Ratio(
                        f"latency {n} sdn/tcp, batch {b} (lower is better)",
                        ratio(pct[(b, "sdn", n)], pct[(b, "tcp", n)]),
                    )
                )
        res.plots.append(
            cdf_panels(
                bench.out_dir / "fig8cd_latency_cdf.png",
                f"Fig. 8c/d: latency CDF at {self.RATE:,} tuples/s, per batch size",
                {
                    t: {f"batch {e['batch']}": e[f"{t}_cdf_s"] for e in summary}
                    for t in ("sdn", "tcp")
                },
            )
        )
        return res
