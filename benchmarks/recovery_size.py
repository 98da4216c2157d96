"""The recovery scenario's size axis: what one failure costs as the job grows.

A job of 1, 2 or 4 independent wordcount pipelines (``source_N -> split_N x2 ->
count_N x2``, as ``topologies/pipelines.yaml``) under ``exactly_once``; once the
job ran a few seconds, a split worker of pipeline 1 is SIGKILLed.  Two recovery
settings, interleaved per size on one cluster (the core's built-in recovery):

* **partial** (``partial_rollback: true``): the dead worker's replacement and its
  downstream closure (pipeline 1's count workers) roll back, the source resends
  from its output buffer;
* **global** (``failover: global``): every worker of the job rolls back and every
  source replays, as before failover regions (Flink's ``full`` strategy).

Measured per run, from the count workers' METRIC_RESP (polled from the
coordinator; the rule of ``typhoon/sink_rates.py``: 1 s windows, baseline the
median of the windows before the kill): the workers rolled back (the incident's
``region``, replacement included), the recovery time (kill -> first 1 s window of
pipeline 1's count workers at >= 80% of their rate before), the incident's own
``back_at_80_ms`` (controller side, from the detection), and the lowest 1 s
window of every untouched pipeline's count workers from the kill until pipeline 1
is back (at least until its rollback was confirmed), relative to that pipeline's
rate before.  Every pipeline's counts must then equal its reference exactly.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.app_runs import counter, run_app, wait_for
from benchmarks.scenario import Bench, Ratio, ScenarioResult, Table
from benchmarks.stats import fmt_num, fmt_ratio, median
from mininet_env.run import EmulatedCluster
from typhoon.operators.sources import generate_sentences
from typhoon.report import read_worker_reports
from typhoon.sink_rates import (
    WINDOW_S,
    Progress,
    back_at,
    baseline,
    data_in,
    horizon,
    lowest_ratio,
)
from typhoon.topology.loader import load_topology_text

SIZES = (1, 2, 4)
VARIANTS = ("partial", "global")
RATE = 400  # sentences/s per pipeline, 6 words each
WORDS = 6
CHECKPOINT_MS = 500
POLL_S = 0.1
UNTOUCHED_TARGET = 0.9  # untouched pipelines' lowest window / their rate before
FLAT_S = 0.5  # recovery time at 4 pipelines minus at 1, at most (flat as the job grows)
CONFIG = "metrics_interval = 0.25\n[fault_detector]\nheartbeat_timeout = 15.0\n"  # port events


def pipelines_yaml(
    n: int, name: str, variant: str, store: str, count: int = 10**9, rate: int = RATE
) -> str:
    """A job of ``n`` independent wordcount pipelines with ``variant``'s recovery (each
    source emits ``count`` sentences at ``rate`` per second)."""
    knob = "partial_rollback: true" if variant == "partial" else "failover: global"
    lines = [
        f"name: {name}",
        "config:",
        "  guarantee: exactly_once",
        f"  checkpoint_interval_ms: {CHECKPOINT_MS}",
        f"  checkpoint_store: {store}",
        f"  {knob}",
        "spouts:",
    ]
    for i in range(1, n + 1):
        lines += [
            f"  - id: source_{i}",
            "    operator: sentence_source",
            f"    args: {{count: {count}, rate: {rate}, seed: {i}, words: {WORDS}, "
            "vocabulary: 300}",
        ]
    lines.append("bolts:")
    for i in range(1, n + 1):
        lines += [f"  - id: split_{i}", "    operator: split_words", "    parallelism: 2"]
        lines += [
            f"  - id: count_{i}",
            "    operator: count_by_key",
            "    args: {key: word}",
            "    parallelism: 2",
            "    stateful: true",
        ]
    lines.append("streams:")
    for i in range(1, n + 1):
        lines.append(f"  - {{from: source_{i}, to: split_{i}, grouping: shuffle}}")
        lines.append(
            f"  - {{from: split_{i}, to: count_{i}, grouping: {{type: fields, fields: [word]}}}}"
        )
    return "\n".join(lines) + "\n"


@dataclass
class SizeRun:
    """One run: ``n`` pipelines, one recovery setting."""

    n: int
    variant: str
    ok: bool = False
    error: str = ""
    wall_s: float = 0.0
    workers: int = 0
    killed: float = 0.0
    incident: dict[str, Any] = field(default_factory=dict)
    recovery_s: float | None = None  # kill -> pipeline 1's count workers back at 80%
    p1_lowest: float | None = None  # pipeline 1's lowest window / before
    untouched_lowest: float | None = None  # min over the other pipelines
    untouched: dict[int, float | None] = field(default_factory=dict)  # pipeline -> ratio
    # the same for the new sentences the untouched sources emit (out minus replayed):
    # a rolled-back pipeline's count workers take in its replay at full rate, yet
    # nothing new reaches them while its source resends what it had already sent
    untouched_new_lowest: float | None = None
    series: dict[int, list[tuple[float, float]]] = field(default_factory=dict)

    @property
    def rolled_back(self) -> int | None:
        region = self.incident.get("region")
        return len(region) if region else None

    @property
    def detection_ms(self) -> float | None:
        d = self.incident.get("detected_wall")
        return None if d is None else (d - self.killed) * 1000

    @property
    def incident_back_s(self) -> float | None:
        """The controller's own figure, moved from the detection to the kill."""
        b, d = self.incident.get("back_at_80_ms"), self.detection_ms
        return None if b is None or d is None else (b + d) / 1000

    def record(self) -> dict[str, Any]:
        return {
            "transport": "sdn",
            "hosts": 3,
            "label": f"{self.n} pipelines, split_1 worker killed, {self.variant}",
            "variant": self.variant,
            "pipelines": self.n,
            "ok": self.ok,
            "error": self.error,
            "wall_s": round(self.wall_s, 3),
            "workers": self.workers,
            "workers_rolled_back": self.rolled_back,
            "recovery_s": self.recovery_s,
            "incident_back_at_80_s": self.incident_back_s,
            "detection_ms": self.detection_ms,
            "pipeline1_lowest_ratio": self.p1_lowest,
            "untouched_lowest_ratio": self.untouched_lowest,
            "untouched_new_sentences_lowest_ratio": self.untouched_new_lowest,
            "untouched": {str(k): v for k, v in self.untouched.items()},
            "incident": self.incident,
            "series": {
                str(k): [[round(t, 2), round(r, 1)] for t, r in v] for k, v in self.series.items()
            },
        }


class SizeAxis:
    """Runs the size axis and reports it (used by ``benchmarks/scenarios/recovery.py``)."""

    SIZE_QUICK = {"warm": 6.0, "post": 4.0, "max": 20.0}
    SIZE_FULL = {"warm": 8.0, "post": 6.0, "max": 30.0}

    def run_sizes(self, bench: Bench, res: ScenarioResult) -> None:
        p = self.SIZE_QUICK if bench.quick else self.SIZE_FULL
        runs: dict[tuple[int, str], list[SizeRun]] = {(n, v): [] for n in SIZES for v in VARIANTS}
        c = bench.testbed.app_cluster("z", [], CONFIG)
        try:
            for rnd in range(bench.repeats):
                for n in SIZES:
                    for v in VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]:
                        run = self.size_run(c, n, v, next(bench.testbed.names), p)
                        runs[(n, v)].append(run)
                        bench.record(run.record(), run.ok)
                        status = "ok" if run.ok else f"FAILED: {run.error}"
                        print(
                            f"  recovery size [{n} pipelines, {v}]: {status} ({run.wall_s:.1f} s;"
                            f" rolled back {run.rolled_back}, recovery {fmt_num(run.recovery_s, 1)}"
                            f" s, untouched lowest {fmt_ratio(run.untouched_lowest)}, new "
                            f"sentences {fmt_ratio(run.untouched_new_lowest)})",
                            file=bench.out,
                            flush=True,
                        )
        finally:
            c.close()
        self.describe_sizes(bench, res, runs)

    def size_run(self, c: EmulatedCluster, n: int, variant: str, k: int, p: dict) -> SizeRun:
        run = SizeRun(n, variant)
        name = f"bench{k:04d}-rs{n}{variant[0]}"
        store = c.workdir / "checkpoints"
        t = load_topology_text(pipelines_yaml(n, name, variant, str(store)))
        out = run_app(c, t, lambda name: self.measure_size(c, name, run, p))
        run.ok, run.error, run.wall_s = out.ok, out.error, out.wall_s
        return run

    def measure_size(self, c: EmulatedCluster, name: str, run: SizeRun, p: dict) -> None:
        physical = c.coordinator.get_physical(name)
        run.workers = len(physical.workers)
        logs: dict[int, dict[int, Progress]] = {i: {} for i in range(1, run.n + 1)}
        new: dict[int, dict[int, Progress]] = {i: {} for i in range(1, run.n + 1)}  # sources

        nodes = {w.worker_id: w.node for w in physical.workers}

        def poll() -> None:
            metrics = c.coordinator.get_metrics(name)
            if set(metrics) - set(nodes):  # a replacement
                nodes.update(
                    {w.worker_id: w.node for w in c.coordinator.get_physical(name).workers}
                )
            for wid, m in metrics.items():
                node = nodes.get(wid)
                if node is None or "time" not in m:
                    continue
                if node.startswith("source_"):
                    count = counter(m, "out") - sum(
                        n for n in (m.get("replayed") or {}).values() if type(n) is int
                    )
                    log = new[int(node.split("_")[1])].setdefault(wid, Progress())
                    if log.last is None or m["time"] > log.last:
                        log.add(m["time"], count)
                    continue
                if not node.startswith("count_"):
                    continue
                count = data_in(m)
                log = logs[int(node.split("_")[1])].setdefault(wid, Progress())
                if count is not None and (log.last is None or m["time"] > log.last):
                    log.add(m["time"], count)

        def follow(seconds: float, stop=None) -> Any:
            end = time.time() + seconds
            while time.time() < end:
                poll()
                if stop is not None and (got := stop()):
                    return got
                time.sleep(POLL_S)
            return None

        follow(p["warm"])
        victim = physical.active_of_node("split_1")[0].worker_id
        pid = c.coordinator.worker_statuses(name)[victim].pid
        if pid is None:
            raise RuntimeError(f"split worker {victim} has no pid")
        os.kill(pid, signal.SIGKILL)
        run.killed = killed = time.time()

        def incident() -> dict[str, Any] | None:
            status, body = c.rest("GET", "/faults")
            mine = [i for i in body if i["app"] == name and i["worker"] == victim]
            return mine[0] if status == 200 and mine else None

        def rolled() -> dict[str, Any] | None:
            i = incident()
            return i if i and i.get("rolled_back_ms") is not None else None

        i = follow(p["max"], rolled)
        if i is None:
            raise TimeoutError("pipeline 1 was not rolled back")
        rolled_at = i["detected_wall"] + i["rolled_back_ms"] / 1000

        def back() -> bool:
            if time.time() < max(rolled_at, killed + p["post"]):
                return False
            b = back_at(list(logs[1].values()), killed)
            return b is not None and b.after_s is not None

        follow(p["max"], back)
        poll()
        p1 = list(logs[1].values())
        b = back_at(p1, killed)
        if b is None:
            raise RuntimeError("no rate of pipeline 1 before the kill")
        run.recovery_s = b.after_s
        run.p1_lowest = b.lowest / b.before
        end = max(rolled_at, killed + (b.after_s if b.after_s is not None else p["max"]))
        end += WINDOW_S
        others = [w for j in range(2, run.n + 1) for w in logs[j].values()]
        end = min(end, horizon(others) or end)  # only windows every pipeline reported
        for j in range(2, run.n + 1):
            mine = list(logs[j].values())
            before = baseline(mine, killed)
            run.untouched[j] = None if before is None else lowest_ratio(mine, killed, end, before)
        ratios = [r for r in run.untouched.values() if r is not None]
        run.untouched_lowest = min(ratios) if ratios else None
        fresh = []
        for j in range(2, run.n + 1):
            mine = list(new[j].values())
            before = baseline(mine, killed)
            if before is not None and (r := lowest_ratio(mine, killed, end, before)) is not None:
                fresh.append(r)
        run.untouched_new_lowest = min(fresh) if fresh else None
        for j, ws in logs.items():
            mine = [w for w in ws.values() if w.first is not None]
            if not mine:
                continue
            t0 = min(w.first for w in mine)
            stop = max(w.last for w in mine)
            lo = killed - WINDOW_S * int((killed - t0) / WINDOW_S)
            pts = []
            while lo + WINDOW_S <= stop:
                pts.append((lo - killed, sum(w.at(lo + WINDOW_S) - w.at(lo) for w in mine)))
                lo += WINDOW_S / 2
            run.series[j] = pts
        self.exact_size(c, name, run, incident)

    def exact_size(self, c: EmulatedCluster, name: str, run: SizeRun, incident) -> None:
        """Drain every source, wait for the end, compare each pipeline with its reference."""
        try:  # the controller's own figure; its absence does not fail the run
            wait_for(lambda: (i := incident()) and i.get("back_at_80_ms") is not None, 10,
                     "the incident's back_at_80_ms")  # fmt: skip
        except TimeoutError:
            pass
        run.incident = incident() or {}
        for j in range(1, run.n + 1):
            c.drain(name, f"source_{j}")
        c.options.timeout = 90.0
        if not c.wait_finished(name):
            raise RuntimeError("the drained workers did not all finish cleanly")
        reports = read_worker_reports(c.report_dir(name))
        topology = c.coordinator.get_topology(name)
        for j in range(1, run.n + 1):
            args = topology.nodes[f"source_{j}"].args
            (src,) = [r for r in reports if r["node"] == f"source_{j}"]
            want: dict[str, int] = {}
            for s in generate_sentences(
                src["result"]["emitted"], args["seed"], args["words"], args["vocabulary"]
            ):
                for w in s.split():
                    want[w] = want.get(w, 0) + 1
            got: dict[str, int] = {}
            for r in reports:
                if r["node"] == f"count_{j}":
                    for w, v in r["result"]["counts"].items():
                        got[w] = got.get(w, 0) + v
            if got != want:
                wrong = sorted(w for w in set(got) | set(want) if got.get(w) != want.get(w))
                raise RuntimeError(f"pipeline {j}: {len(wrong)} words counted wrong")
        run.incident = incident() or run.incident

    def describe_sizes(
        self, bench: Bench, res: ScenarioResult, runs: dict[tuple[int, str], list[SizeRun]]
    ) -> None:
        ok = {k: [r for r in v if r.ok] for k, v in runs.items()}

        def med(k: tuple[int, str], f) -> float | None:
            return median(f(r) for r in ok[k])

        rows, summary = [], {}
        for n in SIZES:
            for v in VARIANTS:
                k = (n, v)
                row = {
                    "workers": med(k, lambda r: r.workers),
                    "rolled_back": med(k, lambda r: r.rolled_back),
                    "detection_ms": med(k, lambda r: r.detection_ms),
                    "rolled_back_ms": med(k, lambda r: r.incident.get("rolled_back_ms")),
                    "recovery_s": med(k, lambda r: r.recovery_s),
                    "incident_back_s": med(k, lambda r: r.incident_back_s),
                    "p1_lowest": med(k, lambda r: r.p1_lowest),
                    "untouched_lowest": med(k, lambda r: r.untouched_lowest),
                    "untouched_new_lowest": med(k, lambda r: r.untouched_new_lowest),
                }
                summary[f"{n} {v}"] = row
                rows.append(
                    [
                        str(n),
                        v,
                        fmt_num(row["workers"], 0),
                        fmt_num(row["rolled_back"], 0),
                        fmt_num(row["detection_ms"], 1),
                        fmt_num(row["rolled_back_ms"], 0),
                        fmt_num(row["recovery_s"], 1),
                        fmt_num(row["incident_back_s"], 1),
                        fmt_ratio(row["p1_lowest"]),
                        fmt_ratio(row["untouched_lowest"]) if n > 1 else "–",
                        fmt_ratio(row["untouched_new_lowest"]) if n > 1 else "–",
                        f"{len(ok[k])}/{len(runs[k])}",
                    ]
                )
        res.tables.append(
            Table(
                "Recovery as the job grows: a split worker of pipeline 1 SIGKILLed, partial "
                "versus global rollback (medians over runs)",
                [
                    "pipelines",
                    "rollback",
                    "workers",
                    "workers rolled back",
                    "kill -> detected ms",
                    "detected -> rollback confirmed ms",
                    "recovery s (kill -> pipeline 1 at 80%)",
                    "same, from the incident s",
                    "pipeline 1 lowest / before",
                    "untouched pipelines lowest / before",
                    "untouched sources' new sentences lowest / before",
                    "runs ok (exact)",
                ],
                rows,
                note=(
                    f"Each pipeline: 1 source at {RATE} sentences/s of {WORDS} words, 2 split, "
                    "2 count workers; exactly_once, checkpoints every "
                    f"{CHECKPOINT_MS} ms; 3 emulated hosts, the core's built-in recovery, "
                    "METRIC_RESP every 0.25 s. Rates are the count workers' input in 1 s "
                    "windows (typhoon/sink_rates.py); 'before' is the median of the 1 s "
                    "windows before the kill; recovery = start of the first window (sliding by "
                    "0.1 s) at >= 80% of before; 'untouched lowest' = lowest window of "
                    "pipelines 2..N from the kill until pipeline 1 is back (and at least until "
                    "its rollback was confirmed). 'new sentences' is the same rule on what the "
                    "untouched sources emit minus what they replay (METRIC_RESP out - "
                    "replayed): work that is not done again. 'from the incident' is the "
                    "controller's "
                    "back_at_80_ms plus kill -> detected. Every run's counts were checked "
                    "exact per pipeline."
                ),
            )
        )
        res.summary["sizes"] = summary
        for v in VARIANTS:
            for key, what in (
                ("untouched_lowest", "count workers' input"),
                ("untouched_new_lowest", "sources' new sentences"),
            ):
                worst = [summary[f"{n} {v}"][key] for n in SIZES if n > 1]
                worst = [x for x in worst if x is not None]
                res.ratios.append(
                    Ratio.against(
                        f"recovery size: untouched pipelines' lowest 1 s rate / before, {what},"
                        f" {v} (worst size)",
                        min(worst) if worst else None,
                        at_least=UNTOUCHED_TARGET,
                    )
                )
            one, four = summary[f"1 {v}"]["recovery_s"], summary[f"4 {v}"]["recovery_s"]
            growth = None if one is None or four is None else four - one
            res.ratios.append(
                Ratio(
                    f"recovery size: recovery time, 4 pipelines - 1 pipeline, {v} (s)",
                    growth,
                    f"<= {FLAT_S:g}",
                    None if growth is None else growth <= FLAT_S,
                )
            )
        self.plot_sizes(bench, res, ok)

    def plot_sizes(self, bench: Bench, res: ScenarioResult, ok) -> None:
        from benchmarks.plots import line_panels, time_series

        def col(key: str) -> dict[str, list[float | None]]:
            return {
                v: [median(getattr(r, key) for r in ok[(n, v)]) for n in SIZES] for v in VARIANTS
            }

        res.plots.append(
            line_panels(
                bench.out_dir / "recovery_size.png",
                "One split worker of pipeline 1 killed, partial versus global rollback",
                list(SIZES),
                "independent pipelines in the job",
                {
                    "recovery s (kill -> pipeline 1 at 80%)": col("recovery_s"),
                    "workers rolled back": col("rolled_back"),
                    "untouched pipelines' lowest 1 s rate / before": col("untouched_lowest"),
                    "untouched sources' new sentences, lowest / before": col(
                        "untouched_new_lowest"
                    ),
                },
            )
        )
        shown = {v: ok[(4, v)][0] for v in VARIANTS if ok[(4, v)]}
        series = {}
        for v, r in shown.items():
            for j in (1, 2):
                pts = r.series.get(j, [])
                series[f"pipeline {j}, {v}"] = ([t for t, _ in pts], [x for _, x in pts])
        if series:
            res.plots.append(
                time_series(
                    bench.out_dir / "recovery_size_timeline.png",
                    "4 pipelines: count workers' input of pipeline 1 (killed) and 2 (untouched)",
                    series,
                    "words/s (1 s windows, every 0.5 s)",
                    [(0.0, "split_1 worker killed", "")],
                    xlabel="seconds since the kill",
                    note="first run of each setting",
                )
            )
