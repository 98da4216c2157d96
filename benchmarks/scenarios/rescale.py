"""Scenario: rescaling a keyed node mid-run, live migration against the SIGNAL flush (issue 27).

A keyed, non-additive pipeline on sdn over 3 emulated hosts
(``benchmarks/keyed_ops.py``): one source sends ``[key, seq, ts]`` round-robin
over ``KEYS`` keys at ``RATE`` tuples/s; ``count`` (4 workers, 64 key groups)
keeps per key its running count and ``pad`` bytes of padding, so the keyed
state has a chosen size, and emits the running count on every tuple; one sink
keeps each key's largest count and, per wall-clock second, the tuples that
arrived and their latency (source timestamp to sink, one clock).

Once every key has state, ``count`` is scaled 4 -> 8 and later 8 -> 4 through
the REST ``scale`` request, the same as ``typhoon scale``.  Two ways, run
side by side at each state size:

* **live migration, stepwise** (``running``): keyed state; the moving key
  groups move in rounds of ``migration_step`` groups (the default,
  ``typhoon.reconfig.steps``): per round their tuples are held, their state
  goes through the checkpoint store, the held tuples are released
  (docs/keyed_state.md).  Exact when every sink maximum equals the key's count;
* **live migration, all at once** (``once``): the same with ``migration_step:
  0``, every moving group in one round (the way before stepwise migration);
* **SIGNAL flush** (``flush``): the paper's stable update, ``stateful: true``
  and a plain cache flushed downstream (padding included) before and after
  the remap; new owners start from zero, so the maxima are wrong by design and
  the exact check is the sum of the flushed partials.

Measured per run: sink tuples/s and p99 per second; per migration the pause of
each key group moved (first held tuple -> release, the worker's own
timestamps), bytes moved and MB/s (first old owner packing -> last new owner
loaded); the update's seconds; lost tuples (source emitted - sink per-tuple
arrivals, after a drain) and keys whose result differs from the reference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.app_runs import counter, run_app, wait_for
from benchmarks.keyed_ops import expected_count
from benchmarks.plots import rate_latency_panels
from benchmarks.rescale_stats import (
    Assessment,
    MigrationFigures,
    Second,
    assess,
    migration_figures,
)
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_num, fmt_rate, median
from mininet_env.run import EmulatedCluster
from typhoon.reconfig.steps import DEFAULT_MIGRATION_STEP
from typhoon.report import read_worker_reports
from typhoon.topology import load_topology_text

KEYS = 4000
RATE = 2000.0  # tuples/s offered by the one source worker
GROUPS = 64
SETTINGS = "metrics_interval = 0.5\nreconfig_step_timeout = 120\n"
AFTER_DONE_S = 1.0  # a migration's window ends this long after its update is done
VARIANTS = ("running", "once", "flush")
LABELS = {
    "running": f"live migration, stepwise ({DEFAULT_MIGRATION_STEP} groups/round)",
    "once": "live migration, all at once",
    "flush": "SIGNAL flush",
}
LIVE = ("running", "once")
OPS = "benchmarks.keyed_ops"

TOPOLOGY = """
name: {name}
spouts:
  - id: source
    operator: {ops}:KeyedSource
    args: {{keys: {keys}, rate: {rate}}}
bolts:
  - id: count
    operator: {ops}:{count_op}
    parallelism: 4
    stateful: {stateful}
    args: {{pad: {pad}}}
    config: {{max_parallelism: {groups}{step}}}
  - id: sink
    operator: {ops}:RescaleSink
    parallelism: 1
streams:
  - {{from: source, to: count, grouping: {{type: fields, fields: [key]}}}}
  - {{from: count, to: sink, grouping: shuffle}}
"""


@dataclass
class RescaleRun:
    """One run: a variant at one state size, scaled 4 -> 8 -> 4."""

    variant: str
    size: str
    pad: int
    ok: bool = False
    error: str = ""
    wall_s: float = 0.0
    t0: float = 0.0  # the 4 -> 8 request (wall clock): x = 0 of the plot
    windows: list[tuple[float, float]] = field(default_factory=list)  # request -> done + 1 s
    update_s: list[float] = field(default_factory=list)  # each update's own seconds
    signal_s: list[float] = field(default_factory=list)  # SIGNAL steps' seconds (flush)
    series: list[Second] = field(default_factory=list)
    assessment: Assessment = field(default_factory=Assessment)
    migrations: list[MigrationFigures] = field(default_factory=list)
    state_bytes: int | None = None  # serialized keyed state at the end (all keys)
    flushed_bytes: int = 0
    emitted: int = 0
    arrived: int = 0
    wrong_max: int | None = None  # keys whose sink maximum is not their count
    wrong_sum: int | None = None  # keys whose flushed partials do not add up to it
    initial: set[int] = field(default_factory=set)  # the count workers before any scale

    @property
    def lost(self) -> int:
        return self.emitted - self.arrived

    @property
    def exact(self) -> bool:
        check = self.wrong_max if self.variant in LIVE else self.wrong_sum
        return self.ok and self.lost == 0 and check == 0

    def record(self) -> dict[str, Any]:
        a = self.assessment
        return {
            "transport": "sdn",
            "hosts": 3,
            "label": f"rescale {self.variant} {self.size}",
            "ok": self.ok,
            "error": self.error,
            "wall_s": round(self.wall_s, 3),
            "pad": self.pad,
            "state_bytes": self.state_bytes,
            "flushed_bytes": self.flushed_bytes,
            "update_s": self.update_s,
            "signal_s": self.signal_s,
            "windows_from_t0": [
                [round(s - self.t0, 3), round(e - self.t0, 3)] for s, e in self.windows
            ],
            "emitted": self.emitted,
            "lost": self.lost,
            "wrong_max": self.wrong_max,
            "wrong_sum": self.wrong_sum,
            "pre_rate": a.pre_rate,
            "min_rate_during": a.min_rate,
            "p99_before_s": a.p99_before,
            "p99_during_s": a.p99_during,
            "p99_before_max_s": a.p99_before_max,
            "seconds_below_half": a.below_half,
            "migrations": [
                {
                    "id": m.id,
                    "rounds": m.rounds,
                    "groups": m.groups,
                    "keys": m.keys,
                    "bytes": m.bytes,
                    "ship_ms": m.ship_ms,
                    "transfer_s": m.transfer_s,
                    "mb_s": m.mb_s,
                    "pauses_ms": m.pauses_ms,
                    "waits_ms": m.waits_ms,
                }
                for m in self.migrations
            ],
            "series": [[s - int(self.t0), n, p50, p99] for s, n, p50, p99 in self.series],
        }


@register
class Rescale(Scenario):
    name = "rescale"
    title = "Rescaling keyed state: live migration against the SIGNAL flush"
    figure = "issue 27"
    order = 11

    SIZES = {"10 MB": 10_000_000, "200 MB": 200_000_000}
    QUICK_SIZES = {"10 MB": 10_000_000}  # CI: the small state only
    FULL = {"pre": 5.0, "mid": 6.0, "post": 4.0}
    QUICK = {"pre": 3.0, "mid": 4.0, "post": 3.0}

    def run(self, bench: Bench) -> ScenarioResult:
        p = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        runs: list[RescaleRun] = []
        cluster = bench.testbed.app_cluster("r", [], SETTINGS)
        try:
            for rnd in range(bench.repeats):
                for size, total in (self.QUICK_SIZES if bench.quick else self.SIZES).items():
                    order = VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]
                    for variant in order:
                        run = RescaleRun(variant, size, max(0, total // KEYS))
                        self.one_run(cluster, next(bench.testbed.names), run, p)
                        runs.append(run)
                        bench.records.append(run.record())
                        if not run.ok:
                            bench.failures += 1
                        print("  " + self.progress(run), file=bench.out, flush=True)
        finally:
            cluster.close()
        self.describe(bench, res, runs)
        return res

    # ----- one run -------------------------------------------------------------------------

    def one_run(self, c: EmulatedCluster, n: int, run: RescaleRun, p: dict[str, float]) -> None:
        text = TOPOLOGY.format(
            name=f"bench{n:04d}-rsc",
            ops=OPS,
            keys=KEYS,
            rate=RATE,
            groups=GROUPS,
            pad=run.pad,
            count_op="PaddedRunningCount" if run.variant in LIVE else "PaddedFlushCount",
            stateful="false" if run.variant in LIVE else "true",
            step=", migration_step: 0" if run.variant == "once" else "",
        )
        t = load_topology_text(text, "rescale.yaml")
        out = run_app(c, t, lambda name: self.measure(c, name, run, p))
        run.ok, run.error, run.wall_s = out.ok, out.error, out.wall_s

    def measure(self, c: EmulatedCluster, name: str, run: RescaleRun, p: dict[str, float]) -> None:
        physical = c.coordinator.get_physical(name)
        sink = physical.of_node("sink")[0].worker_id
        run.initial = {w.worker_id for w in physical.of_node("count")}

        def arrived() -> int:
            return counter(c.coordinator.get_metrics(name).get(sink, {}), "in")

        # every key has its state (each key seen twice), then the steady pre-scale seconds
        wait_for(lambda: arrived() >= 2 * KEYS, 60, f"{2 * KEYS} tuples at the sink")
        time.sleep(p["pre"])  # a measured interval, not a synchronisation
        run.t0 = time.time()
        self.scale(c, name, 8, run)
        time.sleep(p["mid"])
        self.scale(c, name, 4, run)
        time.sleep(p["post"])
        c.drain(name)
        c.options.timeout = 120.0
        if not c.wait_finished(name):
            raise RuntimeError("the drained workers did not all finish cleanly")
        self.read_reports(c, name, run, p)

    def scale(self, c: EmulatedCluster, name: str, to: int, run: RescaleRun) -> None:
        start = time.time()
        status, reply = c.rest("POST", f"/apps/{name}/scale", {"node": "count", "parallelism": to})
        if status != 202:
            raise RuntimeError(f"scale to {to} refused: {status} {reply}")

        def finished() -> dict[str, Any] | None:
            record = c.rest("GET", f"/apps/{name}/reconfig")[1]
            return record if record.get("state") != "running" else None

        record = wait_for(finished, 300, f"the scale of count to {to}", 0.05)
        if record.get("state") != "done":
            raise RuntimeError(f"scale to {to}: {record.get('state')}: {record.get('error', '')}")
        run.windows.append((start, time.time() + AFTER_DONE_S))
        run.update_s.append(float(record.get("seconds", time.time() - start)))
        steps = record.get("steps", [])
        run.signal_s += [s["seconds"] for s in steps if s["what"].startswith("SIGNAL")]
        moved = [s for s in steps if s["what"].startswith("KEYGROUPS")]
        states = [s["state"] for s in moved]
        if run.variant in LIVE and (len(states) < 2 or set(states) != {"done"}):
            raise RuntimeError(f"scale to {to}: no key-group migration in {steps}")

    def read_reports(self, c: EmulatedCluster, name: str, run: RescaleRun, p: dict) -> None:
        reports = read_worker_reports(c.report_dir(name))
        by_node: dict[str, list[dict[str, Any]]] = {}
        for r in reports:
            by_node.setdefault(r["node"], []).append(r)
        (src,) = by_node["source"]
        (sink,) = by_node["sink"]
        run.emitted = int(src["result"]["emitted"])
        got = sink["result"]
        run.arrived = int(got["tuples"])
        run.flushed_bytes = int(got["flushed_bytes"])
        ref = {str(k): expected_count(k, run.emitted, KEYS) for k in range(KEYS)}
        run.wrong_max = sum(1 for k, v in ref.items() if got["max"].get(k, 0) != v)
        if run.variant == "flush":
            run.wrong_sum = sum(1 for k, v in ref.items() if got["totals"].get(k, 0) != v)
        counts = by_node["count"]
        if run.variant in LIVE:
            run.state_bytes = sum(int(r["result"]["state_bytes"]) for r in counts)
            logs = [r.get("metrics", {}).get("keyed", {}).get("migrations", {}) for r in counts]
            run.migrations = migration_figures(logs)
        else:
            # the whole cache: what the 4 first workers flushed at the first SIGNAL
            first = [r for r in counts if r["worker"] in run.initial]
            run.state_bytes = sum(int(r["result"]["first_bytes"]) for r in first) or None
        run.series = [tuple(s) for s in got["seconds"]]  # type: ignore[misc]
        run.assessment = assess(run.series, (run.t0 - p["pre"], run.t0), run.windows)

    @staticmethod
    def progress(run: RescaleRun) -> str:
        a = run.assessment
        status = "ok" if run.ok else f"FAILED: {run.error}"
        mig = "; ".join(
            f"migration {m.id}: {m.rounds} rounds {m.groups} groups {m.bytes / 1e6:.1f} MB "
            f"{fmt_num(m.mb_s, 1)} MB/s pack+write {m.ship_ms:.0f} ms "
            f"pause med {fmt_num(m.pause_median_ms, 1)} "
            f"max {fmt_num(m.pause_max_ms, 1)} ms"
            for m in run.migrations
        )
        return (
            f"rescale {run.variant} {run.size}: {status} ({run.wall_s:.1f} s; state "
            f"{fmt_num((run.state_bytes or 0) / 1e6, 1)} MB; updates {run.update_s} s; "
            f"sink {fmt_rate(a.pre_rate)}/s before, slowest second {fmt_rate(a.min_rate)}; "
            f"p99 {fmt_num(_ms(a.p99_before), 1)} -> {fmt_num(_ms(a.p99_during), 1)} ms; "
            f"lost {run.lost}, wrong max {run.wrong_max}, wrong sum {run.wrong_sum}) {mig}"
        )

    # ----- results -------------------------------------------------------------------------

    def describe(self, bench: Bench, res: ScenarioResult, runs: list[RescaleRun]) -> None:
        rows = []
        groups: dict[tuple[str, str], list[RescaleRun]] = {}
        for run in runs:
            groups.setdefault((run.size, run.variant), []).append(run)
        for (size, variant), all_runs in groups.items():
            ok = [r for r in all_runs if r.ok]
            a = [r.assessment for r in ok]
            pauses = [x for r in ok for m in r.migrations for x in m.pauses_ms]
            waits = [x for r in ok for m in r.migrations for x in m.waits_ms]
            mb_s, ship = _up_down(ok, "mb_s"), _up_down(ok, "ship_ms")
            moved = median((sum(m.bytes for m in r.migrations) or r.flushed_bytes) for r in ok)
            up, down = (median(r.update_s[i] for r in ok if len(r.update_s) > i) for i in (0, 1))
            lost = sum(r.lost for r in ok)
            wrong = sum((r.wrong_max if variant in LIVE else r.wrong_sum) or 0 for r in ok)
            exact = bool(ok) and all(r.exact for r in ok)
            check = f"{'yes' if exact else '**no**'}: lost {lost}, " + (
                f"wrong maxima {wrong}"
                if variant in LIVE
                else f"wrong sums {wrong} (maxima wrong: {sum(r.wrong_max or 0 for r in ok)})"
            )
            min_ratio = median(x.min_ratio for x in a)
            p99_ratio = median(x.p99_ratio for x in a)
            signal = median(sum(r.signal_s) for r in ok)
            rows.append(
                [
                    LABELS[variant],
                    size,
                    fmt_num(median((r.state_bytes or 0) / 1e6 for r in ok), 1),
                    f"{fmt_num(up)} / {fmt_num(down)}",
                    fmt_rate(median(x.pre_rate for x in a)),
                    fmt_rate(median(x.min_rate for x in a)),
                    _met(min_ratio, lambda v: v >= 0.5, 2),
                    f"{fmt_num(_ms(median(x.p99_before for x in a)), 1)} → "
                    f"{fmt_num(_ms(median(x.p99_during for x in a)), 1)}",
                    fmt_num(_ms(median(x.p99_before_max for x in a)), 1),
                    " / ".join(fmt_num(v, 0) for v in _up_down(ok, "rounds")) if pauses else "–",
                    _met(p99_ratio, lambda v: v <= 2.0, 1),
                    (
                        f"{fmt_num(median(pauses), 1)} / {fmt_num(max(pauses), 1)}"
                        if pauses
                        else f"– (SIGNAL steps {fmt_num(signal)} s)"
                    ),
                    fmt_num(max(waits), 0) if waits else "–",
                    " / ".join(fmt_num(v, 0) for v in ship) if any(ship) else "–",
                    fmt_num(None if moved is None else moved / 1e6, 1),
                    " / ".join(fmt_num(v, 0) for v in mb_s) if any(mb_s) else "–",
                    check,
                    f"{len(ok)}/{len(all_runs)}",
                ]
            )
            tag = f"rescale {variant} {size}"
            res.ratios += [
                Ratio(
                    f"{tag}: slowest second / pre-scale rate",
                    min_ratio,
                    ">= 0.5",
                    None if min_ratio is None else min_ratio >= 0.5,
                ),
                Ratio(
                    f"{tag}: p99 during / before",
                    p99_ratio,
                    "<= 2",
                    None if p99_ratio is None else p99_ratio <= 2.0,
                ),
                Ratio(f"{tag}: tuples lost", float(lost), "= 0", bool(ok) and lost == 0),
            ]
        res.tables.append(
            Table(
                f"{self.title}: count 4 → 8 → 4 mid-run (medians over runs)",
                [
                    "way",
                    "keyed state",
                    "measured MB",
                    "update s (up / down)",
                    "sink tuples/s before",
                    "slowest second",
                    "slowest / before (≥ 0.5)",
                    "p99 ms before → during",
                    "p99 ms worst second before",
                    "rounds up / down",
                    "p99 during / before (≤ 2)",
                    "group pause ms median / max",
                    "state wait ms max",
                    "pack + write ms up / down",
                    "MB moved",
                    "MB/s up / down",
                    "exact (0 lost)",
                    "runs ok",
                ],
                rows,
                note=(
                    f"sdn over 3 emulated hosts; source → count (4 → 8 → 4 workers, {GROUPS} key "
                    f"groups) → 1 sink; {KEYS:,} keys round-robin at {RATE:,.0f} tuples/s; state "
                    "per key = running count + padding (`pad` = size / keys). 'measured MB': the "
                    "keyed state serialized (msgpack, as it moves) at the end of the run, or, for "
                    "the flush, the first SIGNAL's flush of the 4 first workers (MB moved: "
                    "every flush the sink received). 'before': the whole seconds "
                    "before the first scale request; 'during': each second overlapping a request "
                    f"→ {AFTER_DONE_S:g} s after its update was done. p99 before: median of the "
                    "seconds' p99; during: the largest; worst second before: the largest "
                    "pre-scale second's p99 (the steady noise). Rounds: migrations per update "
                    "(stepwise: migration_step key groups each). Group pause: per key group "
                    "moved, its first held tuple → its release (the new owner's timestamps; 0 "
                    "when no tuple of the group arrived while its state travelled). State "
                    "wait: per new owner and round, KEYGROUPS prepare → its state loaded. "
                    "Pack + write: the slowest old owner's in a round. MB/s: bytes shipped / "
                    "(first old owner packing → last new owner loaded). Exact: sink "
                    "per-tuple arrivals = source emitted after a drain, and per key the sink's "
                    "maximum (live migration) or sum of flushed partials (flush) = its count "
                    "from the source's own numbering."
                ),
            )
        )
        res.summary = {"keys": KEYS, "rate": RATE, "groups": GROUPS, "sizes": self.SIZES}
        self.plot(bench, res, runs)

    def plot(self, bench: Bench, res: ScenarioResult, runs: list[RescaleRun]) -> None:
        columns: dict[str, dict[str, Any]] = {}
        spans: dict[str, dict[str, list[tuple[float, float]]]] = {}
        seen: set[tuple[str, str]] = set()
        for run in runs:  # the first ok run of each (size, variant)
            if not run.ok or not run.series or (run.size, run.variant) in seen:
                continue
            seen.add((run.size, run.variant))
            label = LABELS[run.variant]
            xs = [s[0] - run.t0 for s in run.series]
            columns.setdefault(f"keyed state {run.size}", {})[label] = (
                xs,
                [s[1] for s in run.series],
                [_ms(s[3]) for s in run.series],
            )
            spans.setdefault(f"keyed state {run.size}", {})[label] = [
                (a - run.t0, b - run.t0) for a, b in run.windows
            ]
        if columns:
            res.plots.append(
                rate_latency_panels(
                    Path(bench.out_dir) / "rescale.png",
                    "count 4 → 8 → 4 mid-run: sink rate and p99 per second (shaded: updates)",
                    columns,
                    spans,
                )
            )


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _up_down(runs: list[RescaleRun], attr: str) -> list[float | None]:
    """Median over the runs of a figure of the scale-up's and the scale-down's migration."""
    return [
        median(getattr(r.migrations[i], attr) for r in runs if len(r.migrations) > i)
        for i in (0, 1)
    ]


def _met(v: float | None, ok: Any, digits: int) -> str:
    if v is None:
        return "–"
    return f"{v:.{digits}f} ({'met' if ok(v) else '**not met**'})"
