"""Scenario 6, live debugging overhead (paper Fig. 12, Table 5).

A source sends 100-byte tuples as fast as it can to a sequence-checking sink
on the emulated sdn cluster (three hosts; source and sink on two of them).
From second 18 (quick mode: 4) until a second before the end, someone
watches the source's output in one of three ways; every round of the suite
runs all three (each first in turn), so they are paired per round:

* ``mirror every tuple``: the live debugger, attached as ``typhoon debug
  attach NAME source --rate all`` does it (``POST /typhoon/apps/NAME/debug`` of
  ``apps/live_debugger.py`` with the CLI's own client, wait until the session
  is live, read its records as the CLI does, ``DELETE`` at the end).  The
  controller starts a debug worker on the source's host and adds one output to
  the source's rules, with no meter: the switch copies every frame (the paper's
  Fig. 12), the source does nothing extra.  What the debug port cannot take the
  switch drops and counts (``tx_dropped``).
* ``mirror sampled``: the same with the debugger's default ``--rate`` (200
  frames/s): the session's meter (``controller/rules/meters.py``) lets that many
  frames per second through to the debug port, the rest are never copied.
* ``app copy``: Storm's event logger.  The same source
  (:class:`benchmarks.operators.EventLoggingSource`) in a topology that also
  has an event-logger bolt on a second stream, provisioned at deployment as
  Storm's is; a SIGNAL control tuple through the controller's REST switches
  the copy on at the same second (and a second SIGNAL off), from when on the
  source serializes and sends every tuple twice.  The event logger receives
  and deserializes every copy and keeps the last 1000.

In both mirror variants the debug worker reads every copy it gets, counts its
tuples, decodes the 1 % it samples (no filter) and ships them to the
controller's ring buffer.

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
from benchmarks.live_debug_report import (
    APP,
    MIRROR_RATES,
    SAMPLED,
    VARIANTS,
    copies,
    copies_table,
    cpu_table,
    emitted_between,
    round_orders,
    rounds_table,
    table5,
)
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
from controller.rules.mirror import DEFAULT_RATE
from mininet_env.run import EmulatedCluster
from typhoon.client import Client, resolve
from typhoon.report import read_worker_reports
from typhoon.topology import Topology, load_topology_text
from typhoon.topology.batching import DEFAULTS

SOURCE = "benchmarks.operators:EventLoggingSource"
SINK = "benchmarks.operators:BenchSink"
LOGGER = "benchmarks.operators:EventLogger"
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
    topo = topology(name, app_copy=variant == APP)
    DEFAULTS.write(topo.config)
    cluster.options.duration = timing.duration
    cluster.options.timeout = timing.duration + 60
    cluster.options.live_every = 0.5
    api = Client(resolve(config=str(cluster.workdir / "client.ini")))
    hook = Timeline(cluster, name, variant, timing, api)
    hook.mirror, hook.rate = variant in MIRROR_RATES, MIRROR_RATES.get(variant)
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
            # sampling in the switch (controller/rules/meters.py) and the debug worker's ring
            "switch_copied": stats.get("switch_copied"),
            "switch_sampled": stats.get("switch_sampled"),
            "switch_dropped": stats.get("switch_dropped"),
            "ring_dropped": stats.get("ring_dropped"),
            "cpu_s": stats.get("cpu_s"),
            "records_read": hook.watcher.records,
            "rate": hook.watcher.session.get("rate"),
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
    out["consumer_cpu_s"] = out["consumer"].get("cpu_s")
    watched = emitted_between(marks, began, ended) if began and ended else None
    out["copies"] = copies(out["consumer"], watched)
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
        orders = round_orders(bench.repeats)
        cluster = bench.testbed.app_cluster("d", self.APPS, self.CONTROLLER_CONFIG)
        try:
            for order in orders:
                for variant in order:
                    runs[variant].append(run_once(bench, cluster, variant, timing))
        finally:
            cluster.close()
        self.describe(res, bench, runs, timing, orders)
        return res

    def describe(
        self,
        res: ScenarioResult,
        bench: Bench,
        runs: dict[str, list[RunResult]],
        timing: Timing,
        orders: list[tuple[str, ...]],
    ) -> None:
        per = {v: [r.report.get("live_debug", {}) for r in rs] for v, rs in runs.items()}

        def med(variant: str, key: str) -> float | None:
            return median(d.get(key) for d in per[variant])

        rows, summary = [], {}
        for v in VARIANTS:
            lost = [d.get("lost") for d in per[v]]
            dups = [d.get("duplicates") for d in per[v]]
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
                    "consumer_cpu_s",
                )
            } | {"runs": [{k: x for k, x in d.items() if k != "series"} for d in per[v]]}
        summary["orders"] = [list(o) for o in orders]
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
                    "stretches. Serializations: the framework's counter. Lost / dup: the "
                    "sink's sequence check, summed."
                ),
            )
        )
        res.tables.append(rounds_table(per, orders))
        res.tables.append(copies_table(per))
        res.tables.append(cpu_table(per))
        res.tables.append(table5(per))
        targets = {VARIANTS[0]: 0.9, SAMPLED: 0.95, APP: None}
        for v in VARIANTS:
            res.ratios.append(
                Ratio.against(
                    f"live debug {v}: throughput attached / detached",
                    med(v, "attached_over_before"),
                    at_least=targets[v],
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
            f"'{VARIANTS[0]}': `--rate all`, no meter, the switch copies every frame (Fig. 12's "
            f"setup). '{SAMPLED}': the default meter, at most {DEFAULT_RATE} frames/s copied. "
            f"The debug worker reads every copy, decodes the {SAMPLE_PERCENT:g} % it samples "
            "and ships them to the controller, which a client thread reads as `typhoon debug "
            "attach` does. Every round runs the three variants, each first in turn."
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
        live = median(d.get("copy_began_s") for d in per[VARIANTS[0]])
        markers = [(timing.attach_at, "debugger attached", "")]
        if live is not None:
            markers.append((live, "mirror live", VARIANTS[0]))
        markers.append((timing.detach_at, "detached", ""))
        return time_series(
            bench.out_dir / "fig12_live_debug.png",
            f"Fig. 12: live debugging overhead ({TUPLE_BYTES}-byte tuples, sink throughput)",
            series,
            "tuples/s (median of runs)",
            markers,
            xlabel="seconds since the topology became active",
        )
