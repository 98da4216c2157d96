"""Scenario 5, autoscaling through an overload (paper §6.2 Fig. 11).

Wordcount on three emulated hosts with ``apps/autoscaler.py`` managing the
split node, as in ``tests/integration/test_autoscaler.py``: 2 split workers
that serve 125 sentences/s each (``split_words`` with a service time of
``SPLIT_COST_US``), 4 count workers.  The source starts at a rate the two
sustain, then INPUT_RATE raises it to one they do not (1.24x what 2 serve,
0.83x what 3 serve).  The autoscaler sees the split workers busy for its
``up_window`` and adds a third through a stable update.

Followed over time: the count workers' aggregate input (words/s, from their
METRIC_RESP counters polled off the coordinator, in one-second bins).
Measured per run: overload -> scale-up decision, -> the third worker
receiving; the count throughput and its coefficient of variation in the
overload before the decision and after the scale-up (from
``AFTER_S`` past the third worker's first tuples, when the backlog has
drained); sentences and words lost (the source drained at the end: what the
source sent minus what the split workers took in, and what the split workers
sent minus what the count workers took in).

There is no tcp side: the tcp transport has no controller and cannot change
a running topology, so its throughput through the same overload is what the
2 workers serve throughout ("before" here).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.app_runs import counter, run_app, wait_for
from benchmarks.plots import time_series
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_num, fmt_rate, fmt_ratio, median, ratio
from benchmarks.timeline import CounterLog, cv, mean_rate
from mininet_env.run import EmulatedCluster
from typhoon.report import read_worker_reports
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
METRICS_S = 0.5
BIN_S = 1.0
POLL_S = 0.1
AFTER_S = 5.0  # the "after" window starts this long after the third worker first received
SPLIT_COST_US = 8000  # 125 sentences/s per split worker
START_RATE, OVERLOAD_RATE = 150.0, 310.0  # sentences/s: 60% of 2 workers; 124% of 2, 83% of 3
WORDS = 8


SETTINGS = (
    f"metrics_interval = {METRICS_S}\n"
    "[autoscaler]\n"
    "nodes = split\n"
    "busy_high = 0.9\n"
    "busy_low = 0.3\n"
    "up_window = 3.0\n"
    "down_window = 30.0\n"
    "cooldown = 4.0\n"
    "min_parallelism = 2\n"
    "max_parallelism = 3\n"
)


@dataclass
class ScaleRun:
    """One run: the count throughput over time and the autoscaler's decision."""

    label: str
    ok: bool = False
    error: str = ""
    wall_s: float = 0.0
    overload: float = 0.0  # time.time() of the INPUT_RATE request
    decided_s: float | None = None  # overload -> scale-up decision
    receiving_s: float | None = None  # overload -> the third worker's first tuples seen
    done_s: float | None = None  # overload -> the update done
    reason: str = ""
    series: list[tuple[float, float]] = field(default_factory=list)  # (s from overload, words/s)
    before: float | None = None
    after: float | None = None
    cv_before: float | None = None
    cv_after: float | None = None
    sentences_lost: int | None = None
    words_lost: int | None = None

    def record(self) -> dict[str, Any]:
        """The run's entry in ``results.json``."""
        return {
            "transport": "sdn",
            "hosts": 3,
            "label": self.label,
            "ok": self.ok,
            "error": self.error,
            "wall_s": round(self.wall_s, 3),
            "overload_to_decision_s": self.decided_s,
            "overload_to_third_receiving_s": self.receiving_s,
            "overload_to_update_done_s": self.done_s,
            "reason": self.reason,
            "count_before_words_s": self.before,
            "count_after_words_s": self.after,
            "cv_before": self.cv_before,
            "cv_after": self.cv_after,
            "sentences_lost": self.sentences_lost,
            "words_lost": self.words_lost,
            "series": [[round(t, 2), round(r, 1)] for t, r in self.series],
        }


@register
class Autoscale(Scenario):
    name = "autoscale"
    title = "Autoscaling through an overload"
    figure = "Fig. 11"
    order = 5

    FULL = {"pre": 5.0, "post": 12.0}
    QUICK = {"pre": 3.0, "post": 4.0}

    def run(self, bench: Bench) -> ScenarioResult:
        p = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        runs: list[ScaleRun] = []
        cluster = bench.testbed.app_cluster("a", ["apps/autoscaler.py"], SETTINGS)
        try:
            for _ in range(bench.repeats):
                run = self.one_run(cluster, next(bench.testbed.names), p)
                runs.append(run)
                bench.records.append(run.record())
                if not run.ok:
                    bench.failures += 1
                status = "ok" if run.ok else f"FAILED: {run.error}"
                print(
                    f"  autoscale: {status} ({run.wall_s:.1f} s; overload -> third worker "
                    f"receiving {fmt_num(run.receiving_s, 2)} s, count words/s "
                    f"{fmt_rate(run.before)} -> {fmt_rate(run.after)}, lost "
                    f"{run.sentences_lost}/{run.words_lost})",
                    file=bench.out,
                    flush=True,
                )
        finally:
            cluster.close()
        self.describe(bench, res, runs, p)
        return res

    # ----- one run -------------------------------------------------------------------------

    def one_run(self, c: EmulatedCluster, n: int, p: dict[str, float]) -> ScaleRun:
        run = ScaleRun(f"wordcount, split overloaded {OVERLOAD_RATE:g}/{START_RATE:g} sentences/s")
        t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
        t.nodes["source"].args.update(count=10**9, words=WORDS, rate=START_RATE)
        t.nodes["split"].args["cost_us"] = SPLIT_COST_US
        t.name = f"bench{n:04d}-scale"  # unique per testbed: nothing carries over
        out = run_app(c, t, lambda name: self.measure(c, name, run, p))
        run.ok, run.error, run.wall_s = out.ok, out.error, out.wall_s
        return run

    def measure(self, c: EmulatedCluster, name: str, run: ScaleRun, p: dict[str, float]) -> None:
        physical = c.coordinator.get_physical(name)
        source = physical.active_of_node("source")[0].worker_id
        splits = {w.worker_id for w in physical.active_of_node("split")}
        counts = [w.worker_id for w in physical.active_of_node("count")]
        log = CounterLog()

        def poll() -> dict[int, dict[str, Any]]:
            metrics = c.coordinator.get_metrics(name)
            for wid in counts:
                m = metrics.get(wid)
                if m and "time" in m:
                    log.add(wid, m["time"], counter(m, "in"))
            return metrics

        def run_until(deadline: float, stop: Callable[[], Any] | None = None) -> Any:
            while time.time() < deadline:
                metrics = poll()
                if stop is not None and (got := stop(metrics)):
                    return got
                time.sleep(POLL_S)
            return None

        run_until(time.time() + 2.0 + p["pre"])  # warm-up, then the sustained rate
        wait_for(lambda: all(log.samples.get(w) for w in counts), 10, "the count workers' metrics")
        status, reply = c.rest(
            "POST", f"/apps/{name}/control",
            {"type": "INPUT_RATE", "body": {"rate": OVERLOAD_RATE}, "node": "source"},
        )  # fmt: skip
        run.overload = overload = time.time()
        if status != 202:
            raise RuntimeError(f"INPUT_RATE refused: {status} {reply}")

        def third_receiving(metrics: dict[int, dict[str, Any]]) -> float | None:
            now = c.coordinator.get_physical(name)
            added = {w.worker_id for w in now.active_of_node("split")} - splits
            return time.time() if any(counter(metrics.get(w, {}), "in") for w in added) else None

        received = run_until(overload + 40.0, third_receiving)
        if received is None:
            raise TimeoutError("no third split worker received tuples within 40 s")
        run.receiving_s = received - overload
        _, report = c.rest("GET", f"/apps/{name}/autoscaler")
        ups = [d for d in report["split"]["decisions"] if d["action"] == "scale up"]
        if not ups:
            raise RuntimeError(f"a third worker without a scale-up decision: {report}")
        run.decided_s, run.reason = ups[0]["time"] - overload, ups[0]["reason"]

        def update_done(_: Any) -> bool:
            return c.rest("GET", f"/apps/{name}/reconfig")[1].get("state") == "done"

        run_until(time.time() + 30.0, update_done)
        run.done_s = time.time() - overload
        start_after = received + AFTER_S
        run_until(start_after + p["post"] + BIN_S)

        start = overload - p["pre"]
        series = log.rates(start, log.last_time(counts), BIN_S)
        run.series = [(t - overload, r) for t, r in series]
        decided = overload + run.decided_s
        run.before = mean_rate(series, overload + 0.5, decided)
        run.cv_before = cv(series, overload + 0.5, decided)
        run.after = mean_rate(series, start_after, start_after + p["post"])
        run.cv_after = cv(series, start_after, start_after + p["post"])

        # every sentence and word accounted for: drain the source, let every worker finish
        c.drain(name)
        c.options.timeout = 60.0
        if not c.wait_finished(name):
            raise RuntimeError("the drained workers did not all finish cleanly")
        reports = read_worker_reports(c.report_dir(name))
        by_node: dict[str, list[dict[str, Any]]] = {}
        for r in reports:
            by_node.setdefault(r["node"], []).append(r)
        sent = sum(counter(r["metrics"], "out") for r in reports if r["worker"] == source)
        split_in = sum(counter(r["metrics"], "in") for r in by_node.get("split", []))
        split_out = sum(counter(r["metrics"], "out") for r in by_node.get("split", []))
        count_in = sum(counter(r["metrics"], "in") for r in by_node.get("count", []))
        run.sentences_lost = sent - split_in
        run.words_lost = split_out - count_in

    # ----- results -------------------------------------------------------------------------

    def describe(
        self, bench: Bench, res: ScenarioResult, runs: list[ScaleRun], p: dict[str, float]
    ) -> None:
        ok = [r for r in runs if r.ok]

        def med(f: Callable[[ScaleRun], float | None]) -> float | None:
            return median(f(r) for r in ok)

        before, after = med(lambda r: r.before), med(lambda r: r.after)
        cv_b, cv_a = med(lambda r: r.cv_before), med(lambda r: r.cv_after)
        receiving = med(lambda r: r.receiving_s)
        lost = [r.sentences_lost for r in ok] + [r.words_lost for r in ok]
        res.tables.append(
            Table(
                f"{self.title}: wordcount's split node, 2 -> 3 workers (medians over runs)",
                [
                    "overload -> decision s",
                    "overload -> third worker receiving s",
                    "overload -> update done s",
                    "count words/s before",
                    "count words/s after",
                    "after/before",
                    "CV before",
                    "CV after",
                    "sentences / words lost",
                    "runs ok",
                ],
                [
                    [
                        fmt_num(med(lambda r: r.decided_s), 2),
                        fmt_num(receiving, 2),
                        fmt_num(med(lambda r: r.done_s), 2),
                        fmt_rate(before),
                        fmt_rate(after),
                        fmt_ratio(ratio(after, before)),
                        fmt_num(cv_b, 3),
                        fmt_num(cv_a, 3),
                        " / ".join(
                            str(sum(v for v in vs if v is not None))
                            for vs in ([r.sentences_lost for r in ok], [r.words_lost for r in ok])
                        ),
                        f"{len(ok)}/{len(runs)}",
                    ]
                ],
                note=(
                    f"Source {START_RATE:g} -> {OVERLOAD_RATE:g} sentences/s of {WORDS} words; "
                    f"split workers serve {1e6 / SPLIT_COST_US:g} sentences/s each; autoscaler "
                    "busy_high 0.9, up_window 3 s, min 2, max 3 workers. Count throughput in "
                    f"{BIN_S:g} s bins of the 4 count workers' input (METRIC_RESP every "
                    f"{METRICS_S:g} s). 'Before': from 0.5 s after the overload to the decision; "
                    f"'after': {p['post']:g} s from {AFTER_S:g} s after the third worker's first "
                    "tuples. CV: stdev/mean of those bins. Lost: summed over runs, after the "
                    "source was drained (source out - split in; split out - count in). No tcp "
                    "side: the tcp transport cannot change a running topology, so it stays at "
                    "'before'."
                ),
            )
        )
        res.ratios += [
            Ratio.against(
                "autoscale: count throughput after / before the scale-up",
                ratio(after, before),
                at_least=1.1,
            ),
            Ratio(
                "autoscale: overload -> third split worker receiving (s; target <= 10)", receiving
            ),  # fmt: skip
            Ratio(
                "autoscale: count throughput CV after / before (steadier: < 1)", ratio(cv_a, cv_b)
            ),  # fmt: skip
        ]
        if ok:
            res.ratios.append(
                Ratio(
                    "autoscale: tuples lost across the scale-up (sentences + words)",
                    float(sum(v for v in lost if v is not None)),
                    target="= 0",
                    met=all(v == 0 for v in lost),
                )
            )
        series = {
            f"run {i + 1}": ([t for t, _ in r.series], [v for _, v in r.series])
            for i, r in enumerate(ok)
        }
        markers = [(0.0, "overload (INPUT_RATE)", "")]
        if ok:
            markers += [
                (med(lambda r: r.decided_s) or 0.0, "scale-up decided (median)", ""),
                (receiving or 0.0, "third worker receiving (median)", ""),
            ]
        if series:
            res.plots.append(
                time_series(
                    bench.out_dir / "fig11_autoscale.png",
                    "Fig. 11: count throughput through an overload and the scale-up",
                    series,
                    "count workers' input (words/s)",
                    markers,
                    xlabel="time from the overload (s)",
                )
            )
