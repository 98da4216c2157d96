"""Many senders into one receiver, and a diamond of mixed groupings, across hosts (issue 11).

Not a figure of the paper: the topologies a new user tried first and that the
sdn data plane once lost tuples on.  Both run a fixed number of tuples on three
emulated hosts over both transports, side by side in each round; measured is
the run time (activation to the last worker's exit) and what the sinks got.

* ``fan_in``: 6 source workers (shuffle) -> 1 sink; the source workers on the
  other two hosts share the fabric links into the sink's host.
* ``diamond``: s1 -fields-> 3 -local_or_shuffle-> 2 -all-> 3 sinks and
  s2 -shuffle-> 2 -global-> 1 sink.

A run that misses or duplicates a tuple, or whose report names any problem
(a link whose counts differ, a switch drop rule that counted frames), is a
failed run: it is counted in the table and gives no time.
"""

from __future__ import annotations

from benchmarks import measure
from benchmarks.plots import grouped_bars
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_count, fmt_num, fmt_rate, fmt_ratio, median, paired_ratio
from benchmarks.testbed import RunResult, RunSpec
from benchmarks.topologies import diamond, fan_in

SHAPES = ("fan_in", "diamond")
SINKS = {"fan_in": ("sink",), "diamond": ("sink", "sink2")}


def run_time(run: RunResult) -> float | None:
    """Seconds from activation to the last worker's exit; None for a failed run."""
    return run.report.get("elapsed_s") if run.ok else None


def received(run: RunResult, shape: str) -> int | None:
    if not run.ok:
        return None
    return sum(int(run.node_result(n).get("received") or 0) for n in SINKS[shape])


def lost(run: RunResult, shape: str) -> int | None:
    vs = [measure.lost(run, n, acker="") for n in SINKS[shape]]
    return None if any(v is None for v in vs) else sum(vs)


def dups(run: RunResult, shape: str) -> int | None:
    vs = [measure.duplicates(run, n) for n in SINKS[shape]]
    return None if any(v is None for v in vs) else sum(vs)


def retransmitted(run: RunResult) -> int:
    return sum(int(w.get("retransmitted") or 0) for w in run.report.get("workers", []))


@register
class FanIn(Scenario):
    name = "fan_in"
    title = "Fan-in and diamond across hosts"
    figure = "issue 11"
    order = 8

    HOSTS = 3
    BATCH = 50
    SIZE = 64
    FULL = {"fan_in": 200_000, "diamond": 600_000}  # tuples per source
    QUICK = {"fan_in": 20_000, "diamond": 40_000}

    def run(self, bench: Bench) -> ScenarioResult:
        counts = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)

        def spec(shape: str, transport: str) -> RunSpec:
            make = fan_in if shape == "fan_in" else diamond
            return RunSpec(
                transport,
                self.HOSTS,
                make(shape, size=self.SIZE, count=counts[shape]),
                batch_size=self.BATCH,
                timeout=300.0,
                label=f"{shape} {counts[shape]:,}/source",
            )

        measured = bench.interleaved(SHAPES, spec)
        rows, summary, plot = [], [], {"sdn": [], "tcp": []}
        for shape in SHAPES:
            sdn, tcp = measured[(shape, "sdn")], measured[(shape, "tcp")]
            t = {
                name: median(run_time(r) for r in runs)
                for name, runs in (("sdn", sdn), ("tcp", tcp))
            }
            speed = paired_ratio(tcp, sdn, run_time)  # tcp time / sdn time, per round
            rate = {
                name: median(
                    (received(r, shape) or 0) / run_time(r) if run_time(r) else None for r in runs
                )
                for name, runs in (("sdn", sdn), ("tcp", tcp))
            }
            failed = {
                name: sum(not r.ok for r in runs) for name, runs in (("sdn", sdn), ("tcp", tcp))
            }
            rows.append(
                [
                    shape,
                    f"{counts[shape]:,}",
                    fmt_num(t["sdn"]),
                    fmt_num(t["tcp"]),
                    fmt_ratio(None if speed is None else 1 / speed),
                    fmt_rate(rate["sdn"]),
                    fmt_rate(rate["tcp"]),
                    f"{fmt_count(lost(r, shape) for r in sdn)} / "
                    f"{fmt_count(lost(r, shape) for r in tcp)}",
                    f"{fmt_count(dups(r, shape) for r in sdn)} / "
                    f"{fmt_count(dups(r, shape) for r in tcp)}",
                    fmt_count(retransmitted(r) for r in sdn),
                    f"{failed['sdn']} / {failed['tcp']}",
                    str(len(sdn)),
                ]
            )
            summary.append(
                {
                    "shape": shape,
                    "tuples_per_source": counts[shape],
                    "sdn_run_s": t["sdn"],
                    "tcp_run_s": t["tcp"],
                    "sdn_time_over_tcp": None if speed is None else 1 / speed,
                    "sdn_runs_s": [run_time(r) for r in sdn],
                    "tcp_runs_s": [run_time(r) for r in tcp],
                    "sdn_sink_tuples_s": rate["sdn"],
                    "tcp_sink_tuples_s": rate["tcp"],
                    "failed": failed,
                    "problems": [p for r in sdn + tcp for p in r.report.get("problems", [])],
                }
            )
            for name in ("sdn", "tcp"):
                plot[name].append(t[name])
            res.ratios.append(
                Ratio.against(
                    f"{shape} over {self.HOSTS} hosts: tcp run time / sdn run time "
                    "(>= 1: sdn as fast as tcp; the issue allows >= 0.67 at worst)",
                    speed,
                    at_least=0.67,
                )
            )
        res.summary = {"batch": self.BATCH, "size": self.SIZE, "points": summary}
        res.tables.append(
            Table(
                f"{self.title}: run time for a fixed number of tuples (medians of the "
                "interleaved runs; sdn/tcp = median of the per-round ratios)",
                [
                    "topology",
                    "tuples/source",
                    "sdn s",
                    "tcp s",
                    "sdn/tcp time",
                    "sdn sink tuples/s",
                    "tcp sink tuples/s",
                    "lost sdn / tcp",
                    "dup sdn / tcp",
                    "sdn frames retransmitted",
                    "failed runs sdn / tcp",
                    "runs",
                ],
                rows,
                note=(
                    f"{self.HOSTS} emulated hosts (mesh), batch {self.BATCH}, {self.SIZE}-byte "
                    "payloads; both transports on the same kind of emulated fabric "
                    "(userspace OVS bridges, 4 MiB port socket buffers). Sink tuples/s: "
                    "tuples received by all sinks / run time. A failed run (loss, duplicate, "
                    "any report problem) gives no time."
                ),
            )
        )
        res.plots.append(
            grouped_bars(
                bench.out_dir / "fan_in.png",
                f"Run time, {self.HOSTS} hosts (lower is better)",
                list(SHAPES),
                plot,
                "seconds",
            )
        )
        return res
