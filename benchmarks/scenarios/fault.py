"""Scenario 4, fault detection and failover (paper §6.2 Fig. 10).

Wordcount as in the paper and ``tests/integration/test_fault_detector.py``: 1
source (rate-limited, endless), 2 split, 4 count workers on three emulated
hosts, the controller running ``apps/fault_detector.py``.  After a steady
phase one split worker's process is SIGKILLed.  The count workers' aggregate
input rate is followed over time from their METRIC_RESP counters (the
coordinator holds each worker's latest; this process polls them and
interpolates to half-second bins).

Three variants, interleaved over the rounds (a cluster per controller setting:
it is read when the controller starts):

* **port events** (the design): the switch reports the dead worker's port,
  and the app writes the source's ROUTING without it at once;
* **heartbeat only**: the same app with ``port_events = false``, so the death
  is noticed only when the worker's METRIC_RESP has been missing for
  ``heartbeat_timeout`` seconds, as a Storm-like system notices a dead worker
  by its missing heartbeats.  Meanwhile the source keeps sending half its
  sentences to the dead port;
* **exactly once**: port events, and the topology asks for
  ``guarantee: exactly_once`` (checkpoints every second, docs/guarantees.md):
  the replacement starts from the last global checkpoint and every worker
  rolls back to it, so no sentence is lost.  Its "lost" is measured on the
  result: the words the source's sentences hold minus the words counted, and
  the run fails unless every word's count equals the reference;
* **at least once**: the same with ``guarantee: at_least_once`` (no alignment:
  a replay may count words twice); the run fails if any word is short.

Measured per run: kill -> detection, detection -> ROUTING written and
acknowledged, the count input rate before and after, the seconds spent below
80% of the pre-fault rate, the words short of the pre-fault rate after the
kill, and the sentences lost (the source drained, then its output minus what
the split workers took in, the dead one's last report included).

There is no tcp side: the tcp transport has no controller and no failover (a
dead worker's connections just close, and its sender stalls or fails), so
the comparison is port events versus heartbeats, both on sdn.
"""

from __future__ import annotations

import copy
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.app_runs import counter, run_app, wait_for
from benchmarks.plots import time_series
from benchmarks.scenario import (
    Bench,
    Ratio,
    Scenario,
    ScenarioResult,
    Table,
    fmt_num,
    fmt_rate,
    fmt_ratio,
    median,
    ratio,
    register,
)
from benchmarks.timeline import CounterLog, dip, mean_rate
from mininet_env.run import EmulatedCluster
from typhoon.operators.sources import generate_sentences
from typhoon.report import read_worker_reports
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("port events", "heartbeat only", "exactly once", "at least once")
GUARANTEED = {"exactly once": "exactly_once", "at least once": "at_least_once"}
CHECKPOINT_MS = 1000
METRICS_S = 0.25
BIN_S = 0.5
POLL_S = 0.1
RECOVERED_S = 2.0  # the rate counts as recovered once this long at >= 80% of before
MAX_AFTER_S = 15.0  # longest a run follows an unrecovered rate after its usual window
Medians = dict[str, float | None]  # variant -> median over its runs


@dataclass
class FaultRun:
    """One run of one variant: the timeline and what the fault detector reported."""

    variant: str
    label: str
    ok: bool = False
    error: str = ""
    wall_s: float = 0.0
    killed: float = 0.0  # time.time() of the SIGKILL
    victim: int = 0
    incident: dict[str, Any] = field(default_factory=dict)
    series: list[tuple[float, float]] = field(default_factory=list)  # (s from kill, words/s)
    before: float | None = None  # count words/s in the pre-fault window
    after: float | None = None  # ... in the last seconds of the run (recovered)
    below_s: float | None = None
    deficit: float | None = None
    recovered_s: float | None = None
    sent: int | None = None  # sentences the source emitted
    received: int | None = None  # ... the split workers took in
    replacement_in: int = 0

    @property
    def detection_ms(self) -> float | None:
        if not self.incident:
            return None
        return (self.incident["detected_wall"] - self.killed) * 1000

    @property
    def kill_to_reroute_ms(self) -> float | None:
        d, r = self.detection_ms, self.incident.get("reroute_ms")
        return None if d is None or r is None else d + r

    @property
    def kill_to_acked_ms(self) -> float | None:
        d, r = self.detection_ms, self.incident.get("reroute_acked_ms")
        return None if d is None or r is None else d + r

    @property
    def lost(self) -> int | None:
        return None if self.sent is None or self.received is None else self.sent - self.received

    def record(self) -> dict[str, Any]:
        """The run's entry in ``results.json``."""
        return {
            "transport": "sdn",
            "hosts": 3,
            "label": self.label,
            "variant": self.variant,
            "ok": self.ok,
            "error": self.error,
            "wall_s": round(self.wall_s, 3),
            "victim": self.victim,
            "incident": self.incident,
            "detection_ms": self.detection_ms,
            "kill_to_reroute_ms": self.kill_to_reroute_ms,
            "kill_to_acked_ms": self.kill_to_acked_ms,
            "count_before_words_s": self.before,
            "count_after_words_s": self.after,
            "below_80pct_s": self.below_s,
            "deficit_words": self.deficit,
            "recovered_s": self.recovered_s,
            "sentences_sent": self.sent,
            "sentences_received": self.received,
            "sentences_lost": self.lost,
            "replacement_in": self.replacement_in,
            "series": [[round(t, 2), round(r, 1)] for t, r in self.series],
        }


@register
class Fault(Scenario):
    name = "fault"
    title = "Fault detection: port events versus heartbeats"
    figure = "Fig. 10"
    order = 4

    RATE = 2000  # sentences/s: 16,000 words/s into the count workers
    WORDS = 8
    # The fault detector's default heartbeat_timeout.  A sender blocked on the dead
    # worker's credit is silent too, but the app spares a sender whose receiver is
    # silent, and the reroute ends its credit wait, so nothing else is declared dead.
    HEARTBEAT_S = 5.0
    variants: tuple[str, ...] = VARIANTS
    plot_file = "fig10_fault.png"
    plot_title = "Fig. 10: count workers' input around a killed split worker"
    comparison = (
        "No tcp side: the tcp transport has no controller and no failover, so this "
        "compares port-event against heartbeat detection, both on sdn."
    )
    FULL = {"warm": 3.0, "pre": 5.0, "post": 6.0}
    QUICK = {"warm": 1.0, "pre": 2.0, "post": 4.0}

    def run(self, bench: Bench) -> ScenarioResult:
        p = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        clusters: dict[str, EmulatedCluster] = {}
        runs: dict[str, list[FaultRun]] = {v: [] for v in self.variants}
        try:
            by_settings: dict[str, EmulatedCluster] = {}
            for variant in self.variants:
                conf = self.settings(variant, self.HEARTBEAT_S)
                if conf not in by_settings:  # the guarantees run on the port-events cluster
                    by_settings[conf] = bench.testbed.app_cluster(
                        variant[0], ["apps/fault_detector.py"], conf
                    )
                clusters[variant] = by_settings[conf]
            for rnd in range(bench.repeats):
                order = self.variants if rnd % 2 == 0 else self.variants[::-1]
                for variant in order:
                    n = next(bench.testbed.names)
                    run = self.one_run(clusters[variant], variant, n, p)
                    runs[variant].append(run)
                    bench.records.append(run.record())
                    if not run.ok:
                        bench.failures += 1
                    status = "ok" if run.ok else f"FAILED: {run.error}"
                    print(
                        f"  {self.name} [{variant}]: {status} ({run.wall_s:.1f} s; kill -> reroute "
                        f"{fmt_num(run.kill_to_reroute_ms, 1)} ms, below 80% "
                        f"{fmt_num(run.below_s, 1)} s, lost {run.lost})",
                        file=bench.out,
                        flush=True,
                    )
        finally:
            for c in {id(c): c for c in clusters.values()}.values():
                c.close()
        self.describe(bench, res, runs, p)
        return res

    @staticmethod
    def settings(variant: str, heartbeat: float) -> str:
        events = "false" if variant == "heartbeat only" else "true"
        return (
            f"metrics_interval = {METRICS_S}\n[fault_detector]\n"
            f"heartbeat_timeout = {heartbeat}\nport_events = {events}\n"
        )

    # ----- one run -------------------------------------------------------------------------

    def one_run(self, c: EmulatedCluster, variant: str, n: int, p: dict[str, float]) -> FaultRun:
        run = FaultRun(variant, f"wordcount split worker killed, {variant}")
        t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
        tag = {"heartbeat only": "h", "at least once": "a", "exactly once": "e"}.get(variant, "p")
        t.name = f"bench{n:04d}-fault{tag}"  # unique per testbed: nothing carries over
        t.nodes["source"].args.update(count=10**9, rate=self.RATE, words=self.WORDS)
        if variant in GUARANTEED:
            store = c.workdir / "checkpoints"
            t.config.update(
                guarantee=GUARANTEED[variant],
                checkpoint_interval_ms=CHECKPOINT_MS,
                checkpoint_store=str(store),
            )
        out = run_app(c, t, lambda name: self.measure(c, name, run, p))
        run.ok, run.error, run.wall_s = out.ok, out.error, out.wall_s
        return run

    def measure(self, c: EmulatedCluster, name: str, run: FaultRun, p: dict[str, float]) -> None:
        physical = c.coordinator.get_physical(name)
        source = physical.active_of_node("source")[0].worker_id
        splits = [w.worker_id for w in physical.active_of_node("split")]
        counts = [w.worker_id for w in physical.active_of_node("count")]
        log = CounterLog()
        latest: dict[int, dict[str, Any]] = {}

        def poll() -> None:
            for wid, m in c.coordinator.get_metrics(name).items():
                latest[wid] = m
                if wid in counts and "time" in m:
                    log.add(wid, m["time"], counter(m, "in"))

        def run_until(deadline: float, stop: Callable[[], Any] | None = None) -> Any:
            while time.time() < deadline:
                poll()
                if stop is not None and (got := stop()):
                    return got
                time.sleep(POLL_S)
            return None

        run_until(time.time() + p["warm"] + p["pre"])
        wait_for(lambda: all(log.samples.get(w) for w in counts), 10, "the count workers' metrics")
        run.victim = victim = splits[0]
        pid = c.coordinator.worker_statuses(name)[victim].pid
        if pid is None:
            raise RuntimeError(f"split worker {victim} has no pid")
        os.kill(pid, signal.SIGKILL)
        run.killed = killed = time.time()

        def incident() -> dict[str, Any] | None:
            status, body = c.rest("GET", "/faults")
            if status != 200:
                return None
            mine = [i for i in body if i["app"] == name and i["worker"] == victim]
            return mine[0] if mine and mine[0].get("reroute_acked_ms") is not None else None

        limit = killed + self.HEARTBEAT_S + 15.0
        checked = [0.0]

        def rerouted() -> dict[str, Any] | None:
            if time.monotonic() - checked[0] < 0.2:  # the REST call costs more than a poll
                return None
            checked[0] = time.monotonic()
            return incident()

        if run_until(limit, rerouted) is None:
            raise TimeoutError("the fault detector did not reroute around the dead worker")
        # a few seconds past the detection (the replacement rejoins meanwhile), longer if
        # the rate has not recovered by then
        least = time.time() + p["post"]

        def recovered() -> bool:
            if time.time() < least or not log.samples:
                return False
            end = log.last_time(counts)
            pre = log.rates(killed - p["pre"], killed, BIN_S)
            before = mean_rate(pre, killed - p["pre"], killed)
            recent = log.rates(end - RECOVERED_S, end, BIN_S)
            return bool(before) and all(r >= 0.8 * before for _, r in recent)

        run_until(least + MAX_AFTER_S, recovered)
        poll()
        end = log.last_time(counts)
        first = log.first_time(counts)
        start = killed - BIN_S * int((killed - first) / BIN_S)  # bins meet at the kill
        series = log.rates(start, end, BIN_S)
        run.series = [(t - killed, r) for t, r in series]
        run.before = mean_rate(series, killed - p["pre"], killed)
        run.after = mean_rate(series, end - RECOVERED_S, end)
        if run.before:
            d = dip(series, killed, run.before, BIN_S)
            run.below_s, run.deficit, run.recovered_s = d.below_s, d.deficit, d.recovered_s
        dead_in = counter(latest.get(victim, {}), "in")  # its last METRIC_RESP

        # every sentence accounted for: drain the source, let every worker finish
        c.drain(name)
        run.incident = wait_for(incident, 10, "the incident")
        c.options.timeout = 60.0
        if not c.wait_finished(name):
            raise RuntimeError("the drained workers did not all finish cleanly")
        reports = {r["worker"]: r for r in read_worker_reports(c.report_dir(name))}
        if run.variant in GUARANTEED:
            self.exact_counts(c, name, run, reports)
            return
        run.sent = counter(reports[source]["metrics"], "out")
        live_splits = [r for r in reports.values() if r["node"] == "split"]
        run.received = dead_in + sum(counter(r["metrics"], "in") for r in live_splits)
        new = run.incident.get("replacement")
        if new in reports:
            run.replacement_in = counter(reports[new]["metrics"], "in")
        run.incident = incident() or run.incident

    def exact_counts(
        self, c: EmulatedCluster, name: str, run: FaultRun, reports: dict[int, dict]
    ) -> None:
        """The count workers' merged counts against the words of every sentence the
        source emitted (its offset survives the rollback): equal (exactly once), none
        short (at least once; what is counted twice is not lost)."""
        topology = c.coordinator.get_topology(name)
        args = topology.nodes["source"].args
        emitted = sum(r["result"]["emitted"] for r in reports.values() if r["node"] == "source")
        counts: dict[str, int] = {}
        for r in reports.values():
            if r["node"] == "count":
                for k, v in r["result"]["counts"].items():
                    counts[k] = counts.get(k, 0) + v
        want: dict[str, int] = {}
        for sentence in generate_sentences(
            emitted, args["seed"], args["words"], args["vocabulary"]
        ):
            for w in sentence.split():
                want[w] = want.get(w, 0) + 1
        run.sent = emitted
        short = sum(max(0, n - counts.get(w, 0)) for w, n in want.items())
        run.received = emitted - -(-short // self.WORDS)  # sentences' worth of words short
        if run.variant == "exactly once":
            wrong = {w: (counts.get(w, 0), n) for w, n in want.items() if counts.get(w, 0) != n}
            wrong.update({w: (n, 0) for w, n in counts.items() if w not in want})
        else:
            wrong = {w: (counts.get(w, 0), n) for w, n in want.items() if counts.get(w, 0) < n}
        new = run.incident.get("replacement")
        if new in reports:
            run.replacement_in = counter(reports[new]["metrics"], "in")
        run.incident = self.final_incident(c, name, run.victim) or run.incident
        if wrong:
            raise RuntimeError(
                f"{run.variant}: {len(wrong)} words counted wrong, e.g. "
                f"{sorted(wrong.items())[:3]} (counted, expected)"
            )

    @staticmethod
    def final_incident(c: EmulatedCluster, name: str, victim: int) -> dict[str, Any] | None:
        status, body = c.rest("GET", "/faults")
        mine = [i for i in body if i["app"] == name and i["worker"] == victim]
        return mine[0] if status == 200 and mine else None

    # ----- results -------------------------------------------------------------------------

    def describe(
        self,
        bench: Bench,
        res: ScenarioResult,
        runs: dict[str, list[FaultRun]],
        p: dict[str, float],
    ) -> None:
        variants = self.variants
        ok = {v: [r for r in runs[v] if r.ok] for v in variants}

        def med(v: str, f: Callable[[FaultRun], float | None]) -> float | None:
            return median(f(r) for r in ok[v])

        detect = {v: med(v, lambda r: r.detection_ms) for v in variants}
        reroute = {v: med(v, lambda r: r.incident.get("reroute_ms")) for v in variants}
        acked = {v: med(v, lambda r: r.kill_to_acked_ms) for v in variants}
        k2r = {v: med(v, lambda r: r.kill_to_reroute_ms) for v in variants}
        before = {v: med(v, lambda r: r.before) for v in variants}
        after = {v: med(v, lambda r: r.after) for v in variants}
        below = {v: med(v, lambda r: r.below_s) for v in variants}
        deficit = {v: med(v, lambda r: r.deficit) for v in variants}
        lost = {v: med(v, lambda r: r.lost) for v in variants}
        rejoin = {v: med(v, lambda r: r.incident.get("rejoined_ms")) for v in variants}
        back = {v: med(v, lambda r: r.recovered_s) for v in variants}
        rows = []
        for v in variants:
            rows.append(
                [
                    v,
                    fmt_num(detect[v], 1),
                    fmt_num(reroute[v], 2),
                    fmt_num(acked[v], 1),
                    fmt_num(k2r[v], 1),
                    fmt_num(rejoin[v], 0),
                    fmt_rate(before[v]),
                    fmt_rate(after[v]),
                    fmt_ratio(ratio(after[v], before[v])),
                    fmt_num(below[v], 1),
                    fmt_num(back[v], 1),
                    fmt_rate(deficit[v]),
                    fmt_rate(lost[v]),
                    f"{len(ok[v])}/{len(runs[v])}",
                ]
            )
        hb = self.HEARTBEAT_S
        res.tables.append(
            Table(
                f"{self.title}: a split worker of wordcount SIGKILLed (medians over runs)",
                [
                    "detection",
                    "kill -> detected ms",
                    "detected -> ROUTING written ms",
                    "kill -> ROUTING acked ms",
                    "kill -> rerouted ms",
                    "detected -> replacement routed ms",
                    "count words/s before",
                    "count words/s after",
                    "after/before",
                    "s below 80%",
                    "kill -> 80% again s",
                    "words short of pre-fault rate",
                    "sentences lost",
                    "runs ok",
                ],
                rows,
                note=(
                    f"1 source at {self.RATE:,} sentences/s of {self.WORDS} words, 2 split, 4 "
                    f"count workers on 3 emulated hosts; METRIC_RESP every {METRICS_S:g} s, "
                    f"heartbeat_timeout {hb:g} s; throughput in {BIN_S:g} s bins of the count "
                    f"workers' input. 'after' is the last {RECOVERED_S:g} s of the run; a run "
                    f"follows the rate until {p['post']:g} s after the reroute, longer "
                    f"(up to {MAX_AFTER_S:g} s more) until it has recovered. "
                    "'words short' integrates pre-fault rate minus rate from the kill to the "
                    "end (lost and late words). " + self.comparison
                ),
            )
        )
        res.ratios += self.headline(lost, back, k2r, detect, after, before, below)
        res.summary = {
            "rate_sentences_s": self.RATE,
            "heartbeat_timeout_s": hb,
            "bin_s": BIN_S,
            "variants": {
                v: {
                    "kill_to_detection_ms": detect[v],
                    "detection_to_reroute_ms": reroute[v],
                    "kill_to_acked_ms": acked[v],
                    "kill_to_reroute_ms": k2r[v],
                    "detection_to_rejoined_ms": rejoin[v],
                    "count_before_words_s": before[v],
                    "count_after_words_s": after[v],
                    "below_80pct_s": below[v],
                    "deficit_words": deficit[v],
                    "sentences_lost": lost[v],
                    "kill_to_80pct_again_s": back[v],
                }
                for v in variants
            },
        }
        shown = {v: ok[v][0] for v in variants if ok[v]}
        if shown:
            markers = [(0.0, "split worker killed", "")]
            for v, r in shown.items():
                if r.kill_to_reroute_ms is not None:
                    markers.append((r.kill_to_reroute_ms / 1000, f"rerouted ({v})", v))
                rj = r.incident.get("rejoined_ms")
                if rj is not None and r.detection_ms is not None:
                    markers.append(((r.detection_ms + rj) / 1000, f"replacement in ({v})", v))
            res.plots.append(
                time_series(
                    bench.out_dir / self.plot_file,
                    self.plot_title,
                    {
                        v: ([t for t, _ in r.series], [x for _, x in r.series])
                        for v, r in shown.items()
                    },
                    "words/s into the count workers",
                    markers,
                    xlabel="seconds since the kill",
                    note=f"first run of each variant; {BIN_S:g} s bins; heartbeat_timeout {hb:g} s",
                )
            )

    def headline(
        self,
        lost: Medians,
        back: Medians,
        k2r: Medians,
        detect: Medians,
        after: Medians,
        before: Medians,
        below: Medians,
    ) -> list[Ratio]:
        """The ratios of results.md's headline table (medians per variant)."""
        pe, ho, eo, al = VARIANTS
        hb = self.HEARTBEAT_S
        return [
            Ratio(
                "fault: sentences lost, exactly once",
                lost[eo],
                "0",
                None if lost[eo] is None else lost[eo] == 0,
            ),
            Ratio("fault: kill -> count rate back at 80%, exactly once (s)", back[eo]),
            Ratio(
                "fault: sentences lost, at least once",
                lost[al],
                "0",
                None if lost[al] is None else lost[al] == 0,
            ),
            Ratio(
                "fault: kill -> ROUTING written around the dead worker, port events (ms)",
                k2r[pe],
                "<= 100",
                None if k2r[pe] is None else k2r[pe] <= 100,
            ),
            Ratio(
                f"fault: kill -> detection, heartbeat only ({hb:g} s timeout) (s)", _s(detect[ho])
            ),
            Ratio(
                "fault: kill -> reroute time, heartbeat only / port events",
                ratio(k2r[ho], k2r[pe]),
            ),
            Ratio.against(
                "fault: count throughput after / before the kill, port events",
                ratio(after[pe], before[pe]),
                at_least=0.8,
            ),
            Ratio(f"fault: seconds below 80% of the pre-fault rate, {pe}", below[pe]),
            Ratio(f"fault: seconds below 80% of the pre-fault rate, {ho}", below[ho]),
        ]


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000
