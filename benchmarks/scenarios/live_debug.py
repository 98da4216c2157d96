"""Scenario 6, live debugging overhead (paper Fig. 12, Table 5).

A source sends 100-byte tuples as fast as it can to a sequence-checking sink
on the emulated sdn cluster (three hosts; source and sink on two of them).
From second 18 (quick mode: 4) until a second before the end, someone
watches every tuple the source sends, in one of two ways, interleaved over
the rounds in one run of the suite:

* ``mirror``: the live debugger, attached as ``typhoon debug attach NAME
  source`` does it (``POST /typhoon/apps/NAME/debug`` of ``apps/live_debugger.py``
  with the CLI's own client, wait until the session is live, read its records
  as the CLI does, ``DELETE`` at the end).  The controller starts a debug
  worker on the source's host and adds one output to the source's rules; the
  switch copies the frames, the source does nothing extra.  The switch samples:
  the session's meter lets the default rate of frames per second through to the
  debug port (``controller/meters.py``), the rest are never copied.  The debug
  worker reads every copy, decodes the 1 % that sampling keeps (no filter) and
  ships them to the controller's ring buffer.
* ``app copy``: Storm's event logger.  The same source
  (:class:`benchmarks.operators.EventLoggingSource`) in a topology that also
  has an event-logger bolt on a second stream, provisioned at deployment as
  Storm's is; a SIGNAL control tuple through the controller's REST switches
  the copy on at the same second (and a second SIGNAL off), from when on the
  source serializes and sends every tuple twice.  The event logger receives
  and deserializes every copy and keeps the last 1000.

Measured per run: the sink's tuples per second (from its arrival timeline,
one-second bins since activation), the median before the attach against the
median while attached; the source process's own CPU per 1000 tuples in both
stretches (the worker reads its CPU clock every 0.5 s); the framework's
serialization counter per tuple (polled from the controller's metrics); what
the debug consumer saw and the CPU it used; lost and duplicated tuples at the
sink; and every process's CPU in both stretches (``benchmarks/cpu_sampler.py``).
On this two-core machine source, sink and ovs-vswitchd switch between a fast
and a slow schedule on their own (one-second rates of ~1.3M and ~1.0M
tuples/s with nothing changed), so source and sink are pinned to a core each
(``PINNED`` in ``benchmarks/debug_schedule.py``) and everything else floats;
the source's CPU per tuple and the CPU table say what watching costs, the
throughput ratio is the paper's.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import yaml

from benchmarks import measure
from benchmarks.cpu_sampler import CpuSampler
from benchmarks.debug_schedule import FULL, QUICK, SAMPLE_PERCENT, Timeline, Timing
from benchmarks.operators import EVENT_LOG_STREAM
from benchmarks.plots import time_series
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_count, fmt_num, fmt_rate, median
from benchmarks.testbed import RunResult, ovs_cpu_seconds
from benchmarks.timeline import (
    cpu_ms_per_1000,
    phase_median,
    serializations_per_tuple,
    tick_rates,
)
from controller.mirror import DEFAULT_RATE
from mininet_env.run import EmulatedCluster
from typhoon.client import Client, resolve
from typhoon.report import read_worker_reports
from typhoon.topology import Topology, load_topology_text
from typhoon.topology.batching import DEFAULTS

SOURCE = "benchmarks.operators:EventLoggingSource"
SINK = "benchmarks.operators:BenchSink"
LOGGER = "benchmarks.operators:EventLogger"
VARIANTS = ("mirror", "app copy")
TUPLE_BYTES = 100
HOSTS = 3


def topology(name: str, app_copy: bool, count: int | None = None) -> Topology:
    """source -> sink; with ``app_copy`` also source -(eventlog)-> an event-logger bolt.

    The sink is listed first, so with one worker per host the source and the
    sink get the same two hosts in both variants (the scheduler's order).
    """
    args: dict[str, Any] = {"size": TUPLE_BYTES}
    if count is not None:
        args["count"] = count
    doc: dict[str, Any] = {
        "name": name,
        "spouts": [{"id": "source", "operator": SOURCE, "args": args}],
        "bolts": [{"id": "sink", "operator": SINK}],
        "streams": [{"from": "source", "to": "sink", "grouping": "shuffle"}],
    }
    if app_copy:
        doc["bolts"].append({"id": "eventlog", "operator": LOGGER})
        doc["streams"].append(
            {"from": "source", "to": "eventlog", "stream": EVENT_LOG_STREAM, "grouping": "shuffle"}
        )
    return load_topology_text(yaml.safe_dump(doc, sort_keys=False), f"<{name}>")


# ----- one run -------------------------------------------------------------------------------


def run_once(bench: Bench, cluster: EmulatedCluster, variant: str, timing: Timing) -> RunResult:
    """One run of ``variant``; its record goes to ``results.json`` like any run's."""
    name = f"bench{next(bench.testbed.names):04d}-livedebug-{variant.replace(' ', '')}"
    topo = topology(name, app_copy=variant == "app copy")
    DEFAULTS.write(topo.config)
    cluster.options.duration = timing.duration
    cluster.options.timeout = timing.duration + 60
    cluster.options.live_every = 0.5
    api = Client(resolve(config=str(cluster.workdir / "client.ini")))
    hook = Timeline(cluster, name, variant, timing, api)
    label = f"live debug {variant}"
    cpu0, t0 = ovs_cpu_seconds(), time.monotonic()
    sampler = CpuSampler().start()
    try:
        report = cluster.run(topo, hook)
        workers = read_worker_reports(cluster.report_dir(name))
        if hook.watcher is not None:
            hook.watcher.stats = hook.watcher.final_stats()
        error = hook.error or (hook.watcher.error if hook.watcher else "")
        if not hook.detach_requested:
            error = error or "the run ended before the debugger was detached"
        if not report.get("ok"):
            error = error or "a worker failed or the run timed out"
        result = RunResult("sdn", HOSTS, label, not error, time.monotonic() - t0, error)
        result.report, result.workers = report, workers
    except Exception as e:  # one failed run must not end the benchmark
        if name in cluster.manager.list():
            try:
                cluster.kill(name)
            except Exception:
                pass
        detail = traceback.format_exception_only(e)[-1].strip()
        result = RunResult("sdn", HOSTS, label, False, time.monotonic() - t0, detail)
    sampler.stop()
    cpu1 = ovs_cpu_seconds()
    if cpu0 is not None and cpu1 is not None:
        result.ovs_cpu_s = round(cpu1 - cpu0, 3)
    result.report["live_debug"] = describe_run(result, hook, timing, sampler)
    record = result.to_dict()
    record["live_debug"] = result.report["live_debug"]
    bench.records.append(record)
    if not result.ok:
        bench.failures += 1
    status = "ok" if result.ok else f"FAILED: {result.error}"
    print(f"  {label} [sdn]: {status} ({result.wall_s:.1f} s)", file=bench.out, flush=True)
    return result


def describe_run(
    run: RunResult, hook: Timeline, timing: Timing, sampler: CpuSampler
) -> dict[str, Any]:
    """This run's timelines and per-stretch numbers (seconds since activation)."""
    out: dict[str, Any] = {"variant": hook.variant}
    if not run.report or not hook.t0:
        return out
    t0 = hook.t0
    sink = run.node_result("sink")
    series = []
    if sink.get("timeline"):
        bins = tick_rates(sink["timeline"], sink["tick_s"], t0, t0 + timing.duration, 1.0)
        series = [(round(t - t0, 3), r) for t, r in bins]
    src = next((w["result"] for w in run.node_workers("source") if w.get("result")), {})
    marks = src.get("marks", [])
    switches = src.get("switches", [])
    if hook.watcher is not None:
        began = hook.watcher.live
        ended = hook.detach_requested
    else:  # the source's own record of the SIGNALs (the first two; the third is end of stream)
        began = switches[0][0] if switches and switches[0][1] == 1 else 0.0
        ended = switches[1][0] if len(switches) > 1 else hook.detach_requested
    attach = hook.attach_requested or t0 + timing.attach_at
    before = (max(t0 + timing.warmup, attach - timing.window), attach)
    attached = (began + timing.settle, ended) if began else None
    rate_before = phase_median(series, before[0] - t0, before[1] - t0)
    # the same ratio between the two stretches before it, where nothing changed: how far
    # the rate moves on its own on this machine (None when the warmup leaves no room)
    earlier = (before[0] - timing.window, before[0])
    rate_earlier = (
        phase_median(series, earlier[0] - t0, earlier[1] - t0)
        if earlier[0] >= t0 + timing.warmup - 1e-6
        else None
    )
    rate_attached = phase_median(series, attached[0] - t0, attached[1] - t0) if attached else None
    out.update(
        {
            "series": series,
            "attach_requested_s": round(hook.attach_requested - t0, 3)
            if hook.attach_requested
            else None,
            "copy_began_s": round(began - t0, 3) if began else None,
            "attach_latency_s": round(began - hook.attach_requested, 3) if began else None,
            "detach_requested_s": round(ended - t0, 3) if ended else None,
            "tuples_s_before": rate_before,
            "placebo_ratio": rate_before / rate_earlier if rate_before and rate_earlier else None,
            "tuples_s_attached": rate_attached,
            "attached_over_before": rate_attached / rate_before
            if rate_attached and rate_before
            else None,
            "source_cpu_ms_per_1000_before": cpu_ms_per_1000(marks, *before),
            "source_cpu_ms_per_1000_attached": cpu_ms_per_1000(marks, *attached)
            if attached
            else None,
            "serializations_per_tuple_before": serializations_per_tuple(hook.polled, *before),
            "serializations_per_tuple_attached": serializations_per_tuple(hook.polled, *attached)
            if attached
            else None,
            "lost": measure.lost(run, acker=""),
            "duplicates": measure.duplicates(run),
            "pinned": sorted(hook.pinned),  # the nodes that got a core of their own
            # every process's CPU over the two stretches: what watching costs elsewhere
            "cpu_cores_before": sampler.cores(*before),
            "cpu_cores_attached": sampler.cores(*attached) if attached else None,
        }
    )
    if hook.watcher is not None:
        stats = hook.watcher.stats
        out["consumer"] = {
            "kind": "debug worker (mirror copies)",
            "copies_seen": stats.get("tuples"),
            "frames": stats.get("frames"),
            "lost_copies": stats.get("seq_gaps"),
            # sampling in the switch (controller/meters.py) and the debug worker's ring
            "switch_copied": stats.get("switch_copied"),
            "switch_sampled": stats.get("switch_sampled"),
            "switch_dropped": stats.get("switch_dropped"),
            "ring_dropped": stats.get("ring_dropped"),
            "cpu_s": stats.get("cpu_s"),
            "records_read": hook.watcher.records,
            "mirrored_rules": hook.watcher.session.get("mirrored_rules"),
        }
    else:
        logger = next((w for w in run.node_workers("eventlog") if w.get("result")), None)
        out["consumer"] = {
            "kind": "event-logger bolt (second copies)",
            "copies_sent": src.get("copies"),
            "copies_seen": logger["result"]["received"] if logger else None,
            "cpu_s": logger.get("cpu_s") if logger else None,
        }
    return out


# ----- the scenario --------------------------------------------------------------------------


@register
class LiveDebug(Scenario):
    name = "live_debug"
    title = "Live debugging overhead"
    figure = "Fig. 12"
    order = 6

    APPS = ["apps/live_debugger.py"]
    CONTROLLER_CONFIG = "metrics_interval = 0.5\n"

    def run(self, bench: Bench) -> ScenarioResult:
        timing = QUICK if bench.quick else FULL
        res = self.result(bench)
        runs: dict[str, list[RunResult]] = {v: [] for v in VARIANTS}
        cluster = bench.testbed.app_cluster("d", self.APPS, self.CONTROLLER_CONFIG)
        try:
            for rnd in range(bench.repeats):
                for variant in VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]:
                    runs[variant].append(run_once(bench, cluster, variant, timing))
        finally:
            cluster.close()
        self.describe(res, bench, runs, timing)
        return res

    def describe(
        self, res: ScenarioResult, bench: Bench, runs: dict[str, list[RunResult]], timing: Timing
    ) -> None:
        per = {v: [r.report.get("live_debug", {}) for r in rs] for v, rs in runs.items()}

        def med(variant: str, key: str) -> float | None:
            return median(d.get(key) for d in per[variant])

        def consumer(variant: str, key: str) -> float | None:
            return median((d.get("consumer") or {}).get(key) for d in per[variant])

        rows, summary = [], {}
        for v in VARIANTS:
            lost = [d.get("lost") for d in per[v]]
            dups = [d.get("duplicates") for d in per[v]]
            seen, cpu = consumer(v, "copies_seen"), consumer(v, "cpu_s")
            rows.append(
                [
                    v,
                    fmt_rate(med(v, "tuples_s_before")),
                    fmt_rate(med(v, "tuples_s_attached")),
                    fmt_num(med(v, "attached_over_before"))
                    + f" ({', '.join(fmt_num(d.get('attached_over_before')) for d in per[v])})",
                    fmt_num(med(v, "placebo_ratio")),
                    fmt_num(med(v, "source_cpu_ms_per_1000_before")),
                    fmt_num(med(v, "source_cpu_ms_per_1000_attached")),
                    fmt_num(med(v, "serializations_per_tuple_before")),
                    fmt_num(med(v, "serializations_per_tuple_attached")),
                    f"{fmt_count(lost)} / {fmt_count(dups)}",
                    f"{fmt_rate(seen)} / {fmt_num(cpu, 1)}",
                    fmt_num(med(v, "attach_latency_s")),
                    str(sum(r.ok for r in runs[v])),
                ]
            )
            summary[v] = {
                key: med(v, key)
                for key in (
                    "tuples_s_before",
                    "tuples_s_attached",
                    "attached_over_before",
                    "placebo_ratio",
                    "source_cpu_ms_per_1000_before",
                    "source_cpu_ms_per_1000_attached",
                    "serializations_per_tuple_before",
                    "serializations_per_tuple_attached",
                    "attach_latency_s",
                )
            } | {"runs": [{k: x for k, x in d.items() if k != "series"} for d in per[v]]}
        res.summary = summary
        res.tables.append(
            Table(
                f"{self.title}: source -> sink, {TUPLE_BYTES}-byte tuples, watched from second "
                f"{timing.attach_at:g} to {timing.detach_at:g} of {timing.duration:g} "
                "(medians over the runs)",
                [
                    "variant",
                    "tuples/s before",
                    "tuples/s attached",
                    "attached/before (runs)",
                    "same, nothing attached",
                    "source CPU ms/1000 before",
                    "attached",
                    "serializations/tuple before",
                    "attached",
                    "lost / dup",
                    "consumer copies / CPU s",
                    "attach -> copying (s)",
                    "runs ok",
                ],
                rows,
                note=(
                    "Throughput at the sink: median of one-second bins in the "
                    f"{timing.window:g} s before the attach request (from second "
                    f"{timing.warmup:g} at the earliest), and from {timing.settle:g} s after "
                    "the copying began to the detach. 'Same, nothing attached': the ratio of "
                    f"that before-stretch to the {timing.window:g} s before it, where nothing "
                    "changed: how far the rate moves on its own here. Source CPU: "
                    "the source process's own CPU clock per tuple it emitted over the same "
                    "stretches. Serializations: the framework's counter. Consumer: the debug "
                    "worker (mirror; CPU over its life) or the event-logger bolt (app copy; "
                    "CPU over the whole run). Lost / dup: the sink's sequence check, summed."
                ),
            )
        )
        res.tables.append(cpu_table(per))
        mirror_ser = med("mirror", "serializations_per_tuple_attached")
        copy_ser = med("app copy", "serializations_per_tuple_attached")
        res.tables.append(
            Table(
                "Table 5: Storm-style event logger vs Typhoon live debugger (as measured here)",
                ["property", "app copy (Storm's event logger)", "mirror (Typhoon)"],
                [
                    [
                        "debugging granularity",
                        "the whole source node (a stream provisioned in the topology)",
                        "one worker, one direction, with a filter",
                    ],
                    [
                        "resources",
                        "event-logger worker and its connections for the whole run",
                        "a debug worker started on attach, stopped on detach",
                    ],
                    [
                        "dynamic provisioning",
                        "no (in the topology at deployment; switched on by SIGNAL)",
                        f"yes: attach to live in {fmt_num(med('mirror', 'attach_latency_s'))} s",
                    ],
                    [
                        "serializations per tuple while watched",
                        fmt_num(copy_ser),
                        fmt_num(mirror_ser),
                    ],
                ],
            )
        )
        res.ratios.append(
            Ratio.against(
                "live debug mirror: throughput attached / detached",
                med("mirror", "attached_over_before"),
                at_least=0.95,
            )
        )
        res.ratios.append(
            Ratio(
                "live debug app copy: throughput attached / detached",
                med("app copy", "attached_over_before"),
            )
        )
        for v in VARIANTS:
            b = med(v, "source_cpu_ms_per_1000_before")
            a = med(v, "source_cpu_ms_per_1000_attached")
            res.ratios.append(
                Ratio(
                    f"live debug {v}: source CPU per tuple attached / detached",
                    a / b if a and b else None,
                )
            )
        res.plots.append(self.plot(bench, per, timing))
        res.notes.append(
            f"Setup: {HOSTS} emulated hosts (userspace OVS bridges, full mesh) under the "
            "Typhoon controller with `apps/live_debugger.py`; source on h1, sink on h2, the "
            "mirror's debug worker on h1 (the observed worker's host), the event logger on h3. "
            "The switch copies at most the session's rate (its meter; default "
            f"{DEFAULT_RATE} frames/s); the debug worker reads every copy, decodes the "
            f"{SAMPLE_PERCENT:g} % sampling keeps and ships them to the "
            "controller, which a client thread reads as `typhoon debug attach` does. Variants "
            "alternate order every round."
        )

    def plot(self, bench: Bench, per: dict[str, list[dict[str, Any]]], timing: Timing) -> str:
        """Fig. 12: per-second sink throughput, median over the runs, attach marked."""
        series = {}
        for v in VARIANTS:
            by_t: dict[float, list[float]] = {}
            for d in per[v]:
                for t, r in d.get("series", []):
                    by_t.setdefault(round(t), []).append(r)
            ts = sorted(by_t)
            series[v] = (ts, [median(by_t[t]) or 0.0 for t in ts])
        live = med_of(per["mirror"], "copy_began_s")
        markers = [(timing.attach_at, "debugger attached", "")]
        if live is not None:
            markers.append((live, "mirror live", "mirror"))
        markers.append((timing.detach_at, "detached", ""))
        return time_series(
            bench.out_dir / "fig12_live_debug.png",
            f"Fig. 12: live debugging overhead ({TUPLE_BYTES}-byte tuples, sink throughput)",
            series,
            "tuples/s (median of runs)",
            markers,
            xlabel="seconds since the topology became active",
        )


def total(cores: dict[str, float]) -> float:
    """Busy cores: every group but what the hypervisor took."""
    return sum(c for g, c in cores.items() if g != "stolen by the hypervisor")


def cpu_table(per: dict[str, list[dict[str, Any]]]) -> Table:
    """Cores each process group used before and while attached (medians over the runs)."""
    groups = sorted(
        {g for v in VARIANTS for d in per[v] for k in ("cpu_cores_before", "cpu_cores_attached")
         for g in (d.get(k) or {})}
    )  # fmt: skip
    rows = []
    for g in [*groups, "total"]:
        row = [g]
        for v in VARIANTS:
            vals = []
            for key in ("cpu_cores_before", "cpu_cores_attached"):
                cores = [d.get(key) for d in per[v] if d.get(key)]
                vals.append(median(total(c) if g == "total" else c.get(g, 0.0) for c in cores))
            b, a = vals
            row += [
                fmt_num(b),
                fmt_num(a),
                fmt_num(a - b if a is not None and b is not None else None),
            ]
        rows.append(row)
    return Table(
        "CPU by process, cores (median over the runs): before the attach and while attached",
        ["process", *(f"{v} {c}" for v in VARIANTS for c in ("before", "attached", "added"))],
        rows,
        note=(
            "Sampled from /proc every 0.5 s (`benchmarks/cpu_sampler.py`) over the same "
            "stretches as the throughput; a process started inside a stretch (the debug "
            "worker) is charged from its start. The machine has 2 cores: what watching adds "
            "anywhere comes out of what source, sink and switch get."
        ),
    )


def med_of(rows: list[dict[str, Any]], key: str) -> float | None:
    return median(d.get(key) for d in rows)
