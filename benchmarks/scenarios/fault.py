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
from pathlib import Path
from typing import Any

from benchmarks.app_runs import counter, run_app, wait_for
from benchmarks.fault_results import (
    BIN_S,
    MAX_AFTER_S,
    METRICS_S,
    RECOVERED_S,
    VARIANTS,
    FaultResults,
    FaultRun,
)
from benchmarks.scenario import Bench, Scenario, ScenarioResult, register
from benchmarks.stats import fmt_num
from benchmarks.timeline import CounterLog, dip, mean_rate
from mininet_env.run import EmulatedCluster
from typhoon.operators.sources import generate_sentences
from typhoon.report import read_worker_reports
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
GUARANTEED = {"exactly once": "exactly_once", "at least once": "at_least_once"}
CHECKPOINT_MS = 1000
POLL_S = 0.1


@register
class Fault(FaultResults, Scenario):
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
