"""Control traffic apart from data (issue 17 item 4; Pagliari's thesis, seed 004).

How long does a control tuple take while the data path is saturated?  The
controller sends METRIC_REQ to every worker every ``INTERVAL_S`` and the
control channel times each answer (``rtt_ms``, ``controller/control_channel.py``):
controller -> PacketOut -> the worker's port -> the worker -> PacketIn ->
controller.

Workload: 2 sources -> 2 relays -> sink (``benchmarks.topologies.relay_chain``),
``placement: spread`` on two emulated hosts (a node's workers alternate between
h1 and h2), so data crosses the fabric link in both directions and every grant
a receiver sends shares that link with data.  A relay takes ``RELAY_US`` per
tuple (it sleeps: the machine's two cores are not what is measured), so the
sources fill every credit window toward it and a relay always has windows of
64 KB frames queued: tens of thousands of tuples, a fraction of a second of
work.  The fabric link is shaped to ``BW_MBIT`` (Mininet's htb), so a queue
can also build on the link itself.

Three modes, run back to back in every round (order rotated):

* ``none``: ``sdn: {control_priority: false}``: control tuples are handed to
  the framework in arrival order, behind the queued data;
* ``worker``: urgent control tuples (``typhoon.wire.URGENT_CONTROL``) go ahead
  of queued data, served between 10 ms slices of work (the default);
* ``worker+switch``: as ``worker``, and the fabric interfaces carry a strict
  priority qdisc whose first band takes the receivers' credit frames
  (``typhoon/control_queue.py``, ``FabricPlan(control_queue=True)``).

Every run must be exact (the run report compares every link's two ends).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from benchmarks import measure
from benchmarks.plots import grouped_bars
from benchmarks.scenario import (
    Bench,
    Ratio,
    Scenario,
    ScenarioResult,
    Table,
    register,
)
from benchmarks.stats import (
    fmt_count,
    fmt_num,
    fmt_rate,
    median,
    ratio,
)
from benchmarks.testbed import RunResult
from benchmarks.topologies import relay_chain
from mininet_env.fabric import FabricPlan
from mininet_env.run import EmulatedCluster, SdnRunOptions, start_cluster
from typhoon.report import read_worker_reports
from typhoon.runtime import links as lk

MODES = ("none", "worker", "worker+switch")
ROLES = ("source", "relay", "sink")
REQUEST_BASE = 1 << 40  # our METRIC_REQ ids: far above the controller's own rounds


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``; None if there are none."""
    if not values:
        return None
    vs = sorted(values)
    return vs[min(len(vs) - 1, max(0, int(round(q * (len(vs) - 1)))))]


class Prober(threading.Thread):
    """METRIC_REQ to every worker of one application every ``interval`` seconds while it
    runs; collects each worker's round trip as the controller timed it.

    A request that some workers answered and others had not by the end of the run
    counts for those with the time it waited (a lower bound), so a control tuple
    stuck behind data is not lost from the tail; one that no worker answered is
    counted apart (``lost_requests``): that is the request, not a worker, failing."""

    def __init__(
        self, cluster: EmulatedCluster, name: str, interval: float, warmup: float, until: float
    ):
        super().__init__(daemon=True)
        self.cluster, self.name = cluster, name
        self.interval, self.warmup, self.until = interval, warmup, until
        self.stop = threading.Event()
        self.rtts: dict[int, list[float]] = {}  # worker -> ms
        self.unanswered: dict[int, int] = {}
        self.lost_requests = 0
        self.roles: dict[int, str] = {}
        self.next_id = REQUEST_BASE
        self.error = ""

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # the run goes on; the scenario reports what broke
            self.error = f"{type(e).__name__}: {e}"

    def _run(self) -> None:
        c, name = self.cluster, self.name
        while not self.stop.is_set():  # until the application is active
            status, body = c.rest("GET", f"/apps/{name}")
            if status == 200 and body.get("state", {}).get("active"):
                break
            time.sleep(0.05)
        physical = c.coordinator.get_physical(name)
        self.roles = {w.worker_id: w.node for w in physical.workers}
        active = time.monotonic()
        begin, end = active + self.warmup, active + self.until
        outstanding: dict[int, tuple[float, set[int]]] = {}
        while not self.stop.wait(self.interval):
            now = time.monotonic()
            if begin <= now < end:
                rid = self.next_id
                self.next_id += 1
                status, _ = c.rest(
                    "POST",
                    f"/apps/{name}/control",
                    {"type": "METRIC_REQ", "body": {"request_id": rid}},
                )
                if status == 202:
                    outstanding[rid] = (now, set(self.roles))
            self._collect(outstanding)
        self._collect(outstanding)
        now = time.monotonic()
        for sent, waiting in outstanding.values():
            if waiting == set(self.roles):
                self.lost_requests += 1
                continue
            for w in waiting:
                self.unanswered[w] = self.unanswered.get(w, 0) + 1
                self.rtts.setdefault(w, []).append((now - sent) * 1000.0)

    def _collect(self, outstanding: dict[int, tuple[float, set[int]]]) -> None:
        for rid in list(outstanding):
            status, got = self.cluster.rest("GET", f"/apps/{self.name}/responses/{rid}")
            if status != 200:
                continue
            sent, waiting = outstanding[rid]
            for w, m in got.items():
                w = int(w)
                if w in waiting and "rtt_ms" in m:
                    waiting.discard(w)
                    self.rtts.setdefault(w, []).append(float(m["rtt_ms"]))
            if not waiting:
                del outstanding[rid]

    def by_role(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {r: [] for r in ROLES}
        for w, vs in self.rtts.items():
            out.setdefault(self.roles.get(w, "?"), []).extend(vs)
        return out


@register
class ControlTraffic(Scenario):
    name = "control"
    title = "Control-tuple round trip under a saturated data path"
    figure = "issue 17 (seed 004)"
    order = 10

    TUPLE_BYTES = 100
    RELAY_US = 20.0
    BW_MBIT = 400
    INTERVAL_S = 0.1
    WARMUP_S = 1.0
    STOP_EARLY_S = 0.5
    FULL = {"duration": 8.0, "rounds": 3}
    QUICK = {"duration": 4.0, "rounds": 1}

    def run(self, bench: Bench) -> ScenarioResult:
        params = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        bench.testbed.close_sdn()  # an idle cluster's switches would take CPU from ours
        prefix = bench.testbed.sdn_prefix
        clusters: dict[bool, EmulatedCluster] = {}
        samples: dict[str, dict[str, list[float]]] = {m: {r: [] for r in ROLES} for m in MODES}
        runs: dict[str, list[RunResult]] = {m: [] for m in MODES}
        unanswered: dict[str, int] = dict.fromkeys(MODES, 0)
        lost_requests: dict[str, int] = dict.fromkeys(MODES, 0)
        try:
            for queue in (False, True):
                plan = FabricPlan(
                    hosts=2,
                    prefix=f"{prefix}{'q' if queue else 'p'}",
                    bw_mbit=self.BW_MBIT,
                    control_queue=queue,
                )
                clusters[queue] = start_cluster(
                    SdnRunOptions(
                        plan=plan,
                        live=False,
                        workdir=bench.testbed.workdir / f"control-{'q' if queue else 'p'}",
                    ),
                    bench.out,
                )
            for rnd in range(params["rounds"]):
                k = rnd % len(MODES)
                for mode in MODES[k:] + MODES[:k]:
                    cluster = clusters[mode == "worker+switch"]
                    result, prober = self._one(bench, cluster, mode, params["duration"])
                    runs[mode].append(result)
                    for role, vs in prober.by_role().items():
                        samples[mode].setdefault(role, []).extend(vs)
                    unanswered[mode] += sum(prober.unanswered.values())
                    lost_requests[mode] += prober.lost_requests
                    if prober.error:
                        res.notes.append(f"{mode} round {rnd}: prober: {prober.error}")
        finally:
            for c in clusters.values():
                c.close()
        self._describe(res, bench, params, samples, runs, unanswered, lost_requests)
        return res

    def _one(
        self, bench: Bench, cluster: EmulatedCluster, mode: str, duration: float
    ) -> tuple[RunResult, Prober]:
        topo = relay_chain(
            f"bench{next(bench.testbed.names):04d}-control",
            self.TUPLE_BYTES,
            self.RELAY_US,
            priority=mode != "none",
        )
        cluster.options.duration = duration
        cluster.options.timeout = duration + 120
        # requests stop STOP_EARLY_S before the drain: a worker that finishes and exits
        # cannot answer, which says nothing about priority; answers are collected to the end
        prober = Prober(
            cluster, topo.name, self.INTERVAL_S, self.WARMUP_S, duration - self.STOP_EARLY_S
        )
        prober.start()
        t0 = time.monotonic()
        try:
            report = cluster.run(topo)
            problems = report.get("problems") or []
            error = "" if report.get("ok") else ("; ".join(problems[:3]) or "run failed")
            result = RunResult(
                "sdn", 2, f"control {mode}", bool(report.get("ok")),
                time.monotonic() - t0, error, report,
                read_worker_reports(cluster.report_dir(topo.name)),
            )  # fmt: skip
        except Exception as e:  # one failed run must not end the scenario
            result = RunResult("sdn", 2, f"control {mode}", False, time.monotonic() - t0, str(e))
        finally:
            prober.stop.set()
            prober.join(30)
        bench.records.append(
            {
                **result.to_dict(),
                "mode": mode,
                "rtt_ms": prober.rtts,
                "lost_requests": prober.lost_requests,
            }
        )
        if not result.ok:
            bench.failures += 1
        status = "ok" if result.ok else f"FAILED: {result.error}"
        n = sum(len(v) for v in prober.rtts.values())
        print(f"  control {mode}: {status} ({result.wall_s:.1f} s, {n} round trips)",
              file=bench.out, flush=True)  # fmt: skip
        return result, prober

    def _describe(
        self,
        res: ScenarioResult,
        bench: Bench,
        params: dict[str, Any],
        samples: dict[str, dict[str, list[float]]],
        runs: dict[str, list[RunResult]],
        unanswered: dict[str, int],
        lost_requests: dict[str, int],
    ) -> None:
        rows, summary = [], {}
        for mode in MODES:
            entry: dict[str, Any] = {}
            row = [mode]
            for role in ROLES:
                vs = samples[mode].get(role, [])
                p50, p99 = quantile(vs, 0.5), quantile(vs, 0.99)
                entry[role] = {"n": len(vs), "p50_ms": p50, "p99_ms": p99, "max_ms": max(vs or [0])}
                row += [fmt_num(p50, 1), fmt_num(p99, 1)]
            rs = runs[mode]
            thr = median(measure.throughput(r) for r in rs)
            entry["sink_tuples_s"] = thr
            entry["unanswered"] = unanswered[mode]
            entry["lost_requests"] = lost_requests[mode]
            entry["lost"] = [measure.lost(r) for r in rs]
            entry["duplicates"] = [measure.duplicates(r) for r in rs]
            entry["retransmitted"] = [
                sum(w.get("metrics", {}).get("retransmitted", 0) for w in r.workers) for r in rs
            ]
            row += [
                fmt_rate(thr),
                f"{unanswered[mode]} / {lost_requests[mode]}",
                f"{fmt_count(entry['lost'])} / {fmt_count(entry['duplicates'])}",
                str(sum(entry["retransmitted"])),
                f"{sum(r.ok for r in rs)}/{len(rs)}",
            ]
            rows.append(row)
            summary[mode] = entry
        res.summary = {
            "relay_us": self.RELAY_US,
            "bw_mbit": self.BW_MBIT,
            "interval_s": self.INTERVAL_S,
            "duration_s": params["duration"],
            "modes": summary,
        }
        cols = ["priority"]
        for role in ROLES:
            cols += [f"{role} p50 ms", f"{role} p99 ms"]
        res.tables.append(
            Table(
                f"{self.title}: METRIC_REQ -> METRIC_RESP as the controller times it",
                [
                    *cols,
                    "sink tuples/s",
                    "late / no answer",
                    "lost / dup",
                    "resent frames",
                    "runs ok",
                ],
                rows,
                note=(
                    f"2 sources -> 2 relays ({self.RELAY_US:g} us/tuple, sleeping) -> sink, "
                    f"spread over 2 emulated hosts, fabric link shaped to {self.BW_MBIT} Mbit/s, "
                    f"{self.TUPLE_BYTES}-byte tuples, 64 KB frames, window {lk.DEFAULT_WINDOW}; "
                    "a METRIC_REQ to "
                    f"every worker every {self.INTERVAL_S * 1000:g} ms from {self.WARMUP_S:g} s "
                    f"after activation until {self.STOP_EARLY_S:g} s before the drain "
                    f"({params['duration']:g} s); "
                    f"{params['rounds']} round(s), modes rotated. Unanswered requests count "
                    "with the time they waited until the run ended (late); requests no worker "
                    "answered are counted apart (no answer), not as round trips."
                ),
            )
        )
        relay = {m: summary[m]["relay"] for m in MODES}
        for n in ("p50_ms", "p99_ms"):
            res.ratios.append(
                Ratio(
                    f"relay round trip {n[:-3]} none/worker (higher: the worker priority helps)",
                    ratio(relay["none"][n], relay["worker"][n]),
                )
            )
            res.ratios.append(
                Ratio(
                    f"relay round trip {n[:-3]} worker/worker+switch",
                    ratio(relay["worker"][n], relay["worker+switch"][n]),
                )
            )
        res.plots.append(
            grouped_bars(
                bench.out_dir / "control_rtt.png",
                "Control-tuple round trip under a saturated data path",
                [f"{role} {n}" for role in ROLES for n in ("p50", "p99")],
                {
                    m: [summary[m][role][f"{n}_ms"] for role in ROLES for n in ("p50", "p99")]
                    for m in MODES
                },
                "METRIC_REQ -> METRIC_RESP (ms)",
            )
        )
