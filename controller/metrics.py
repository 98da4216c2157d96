"""Prometheus metrics of the controller: ``GET /metrics`` (text exposition format).

:func:`registry` builds a ``CollectorRegistry`` holding one :class:`TyphoonCollector`,
which reads the controller's current state at scrape time (no thread, no copy kept
between scrapes): the last METRIC_RESP of every worker, the switches' installed
rules and groups, the controller's own drop counters, and the state of the
control-plane apps that are loaded (fault detector, autoscaler, live debugger, load
balancer).  Names follow Prometheus' conventions: ``typhoon_`` prefix, base units
(seconds, bytes), ``_total`` for counters.

Worker series carry the labels ``app``, ``node``, ``worker`` and ``host``; they are
the worker's own counters, so a replaced worker's series stop and its replacement's
start from zero (``rate()`` copes).  The collector is duck-typed over the core and
the apps, so that it is tested with plain objects (``tests/unit/test_metrics.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import exposition as _exposition
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest

# the text format 0.0.4, which every Prometheus 2.x reads (newer clients default to 1.0.0)
CONTENT_TYPE = getattr(_exposition, "CONTENT_TYPE_PLAIN_0_0_4", _exposition.CONTENT_TYPE_LATEST)

__all__ = ["CONTENT_TYPE", "SparkTotals", "TyphoonCollector", "exposition", "registry"]

WORKER_LABELS = ["app", "node", "worker", "host"]
# reroute_ms of fault incidents, in seconds
REROUTE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SPARK_BATCH_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# (metric suffix, METRIC_RESP key, help, scale): counters of a worker since it started
WORKER_COUNTERS = [
    ("frames_in", "frames_in", "Frames the worker received.", 1.0),
    ("frames_out", "frames_out", "Frames the worker sent.", 1.0),
    ("received_bytes", "bytes_in", "Bytes the worker received.", 1.0),
    ("sent_bytes", "bytes_out", "Bytes the worker sent.", 1.0),
    ("serializations", "serializations", "Tuples serialized (once per destination).", 1.0),
    ("unrouted_tuples", "unrouted", "Tuples emitted with no route to send them on.", 1.0),
    ("seq_gaps", "seq_gaps", "Gaps in link sequence numbers (frames NACKed).", 1.0),
    ("retransmitted_frames", "retransmitted", "Frames sent again after a NACK.", 1.0),
    ("credit_stalls", "credit_stalls", "Times a sender waited for flow-control credit.", 1.0),
    ("window_late_tuples", "window_late", "Tuples too late for every window (stream late).", 1.0),
    ("window_bad_time_tuples", "window_bad_time", "Tuples dropped: time not a number.", 1.0),
]
# (metric suffix, METRIC_RESP key, help, scale): gauges of a worker
WORKER_GAUGES = [
    ("queue_tuples", "queue", "Tuples taken or read and not processed yet (estimate).", 1.0),
    ("queue_bytes", "queue_bytes", "Bytes taken or read and not processed yet.", 1.0),
    ("tuple_process_seconds", "proc_us", "Mean operator time per tuple.", 1e-6),
    ("input_rate_limit", "rate", "Source input rate limit in tuples/s (0: none).", 1.0),
    ("batch_size", "batch_size", "Tuples per batch.", 1.0),
    ("active", "active", "1 once a source was activated.", 1.0),
    ("done", "done", "1 once the worker finished its input.", 1.0),
    ("last_report_timestamp_seconds", "time", "Wall time of the last METRIC_RESP.", 1.0),
    # docs/windows.md: in the time field's unit (milliseconds by convention)
    ("watermark", "watermark", "Event-time watermark (time field units, ms).", 1.0),
    ("watermark_closed", "watermark_closed", "1 once every input finished (+inf).", 1.0),
    ("watermark_idle", "watermark_idle", "1 while every input of the worker is idle.", 1.0),
]


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _first(d: dict[str, Any], *keys: str) -> Any:
    """The bridge's compact progress names first, Spark's own second."""
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return None


@dataclass
class _SparkNode:
    batches: int = 0
    rows: float = 0.0
    durations: list[float] = field(default_factory=list)  # seconds, one per batch


class SparkTotals:
    """Spark progress events (EventSparkMetrics) summed per (app, node), for the collector.

    The core feeds it every event it raises; keeping the per-batch durations of a
    node is bounded by ``keep`` (the histogram's buckets come from the kept ones,
    its count and sum from all)."""

    def __init__(self, keep: int = 10_000) -> None:
        self.keep = keep
        self.nodes: dict[tuple[str, str], _SparkNode] = {}
        self.duration_sum: dict[tuple[str, str], float] = {}
        self.duration_count: dict[tuple[str, str], int] = {}
        self.buckets: dict[tuple[str, str], list[int]] = {}

    def add(self, app: str, node: str, progress: dict[str, Any]) -> None:
        key = (app, node)
        n = self.nodes.setdefault(key, _SparkNode())
        n.batches += 1
        n.rows += _num(_first(progress, "input_rows", "numInputRows")) or 0.0
        ms = _num(_first(progress, "batch_ms", "batchDuration"))
        if ms is None:
            ms = _num((progress.get("durationMs") or {}).get("triggerExecution"))
        if ms is None:
            return
        s = ms / 1000.0
        self.duration_sum[key] = self.duration_sum.get(key, 0.0) + s
        self.duration_count[key] = self.duration_count.get(key, 0) + 1
        counts = self.buckets.setdefault(key, [0] * len(SPARK_BATCH_BUCKETS))
        for i, bound in enumerate(SPARK_BATCH_BUCKETS):
            if s <= bound:
                counts[i] += 1


class TyphoonCollector:
    """Reads ``core`` (the TyphoonController, or anything shaped like it) and the apps
    ``lookup(name)`` finds (None when not loaded) at every scrape."""

    def __init__(self, core: Any, lookup: Callable[[str], Any] | None = None) -> None:
        self.core = core
        self.lookup = lookup or (lambda name: None)

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: the series depend on what runs

    def collect(self) -> Iterator[Metric]:
        yield from self._workers()
        yield from self._switches()
        # the app's incidents, else the core's built-in recovery's (controller/core_recovery.py)
        yield from self._fault_detector(
            self.lookup("FaultDetector") or getattr(self.core, "recovery", None)
        )
        yield from self._autoscaler(self.lookup("Autoscaler"))
        yield from self._debugger(self.lookup("LiveDebugger"))
        yield from self._load_balancer(self.lookup("LoadBalancer"))
        yield from self._spark(getattr(self.core, "spark_totals", None))

    # ----- workers -----------------------------------------------------------------------

    def _worker_rows(self) -> Iterable[tuple[list[str], dict[str, Any]]]:
        view = self.core.view
        for app, by_worker in sorted(getattr(self.core, "worker_metrics", {}).items()):
            a = view.apps.get(app)
            if a is None:
                continue  # killed: its series end
            hosts = {w.worker_id: w.host for w in a.physical.workers}
            for wid, m in sorted(by_worker.items()):
                node = str(m.get("node", ""))
                yield [app, node, str(wid), hosts.get(wid, "")], m

    def _workers(self) -> Iterator[Metric]:
        t_in = CounterMetricFamily(
            "typhoon_worker_tuples_in", "Data tuples the worker received.", labels=WORKER_LABELS
        )
        t_out = CounterMetricFamily(
            "typhoon_worker_tuples_out", "Tuples the worker emitted.", labels=WORKER_LABELS
        )
        busy = CounterMetricFamily(
            "typhoon_worker_busy_seconds",
            "Time the operator spent processing tuples.",
            labels=WORKER_LABELS,
        )
        drops = CounterMetricFamily(
            "typhoon_worker_dropped_frames",
            "Frames the worker's transport dropped, by reason.",
            labels=[*WORKER_LABELS, "reason"],
        )
        counters = {
            key: (
                CounterMetricFamily(f"typhoon_worker_{name}", text, labels=WORKER_LABELS),
                scale,
            )
            for name, key, text, scale in WORKER_COUNTERS
        }
        gauges = {
            key: (GaugeMetricFamily(f"typhoon_worker_{name}", text, labels=WORKER_LABELS), scale)
            for name, key, text, scale in WORKER_GAUGES
        }
        for labels, m in self._worker_rows():
            # stream 0 is control traffic from the controller, not data (as the core's rates)
            t_in.add_metric(labels, sum(v for k, v in (m.get("in") or {}).items() if k != "0"))
            t_out.add_metric(labels, sum((m.get("out") or {}).values()))
            proc_s = _num(m.get("proc_s"))
            if proc_s is None:  # older workers: the mean per tuple times the tuples
                proc_s = (_num(m.get("proc_us")) or 0.0) * sum((m.get("in") or {}).values()) / 1e6
            busy.add_metric(labels, proc_s)
            for reason, n in sorted((m.get("drops") or {}).items()):
                drops.add_metric([*labels, str(reason)], n)
            for key, (family, scale) in counters.items():
                value = _num(m.get(key))
                if value is not None:
                    family.add_metric(labels, value * scale)
            for key, (family, scale) in gauges.items():
                value = _num(m.get(key))
                if value is not None:
                    family.add_metric(labels, value * scale)
        yield t_in
        yield t_out
        yield busy
        yield drops
        for family, _ in counters.values():
            yield family
        for family, _ in gauges.values():
            yield family

    # ----- switches and the controller ---------------------------------------------------

    def _switches(self) -> Iterator[Metric]:
        core = self.core
        host_of = {info.dpid: name for name, info in core.view.cluster.hosts.items()}
        connected = GaugeMetricFamily(
            "typhoon_switch_connected", "1 while the host's bridge is connected.", labels=["host"]
        )
        flows = GaugeMetricFamily(
            "typhoon_switch_flows", "Rules the controller installed on the bridge.", labels=["host"]
        )
        groups = GaugeMetricFamily(
            "typhoon_switch_groups",
            "Groups the controller installed on the bridge.",
            labels=["host"],
        )
        datapaths = getattr(core, "datapaths", {})
        for dpid, host in sorted(host_of.items(), key=lambda kv: kv[1]):
            connected.add_metric([host], 1.0 if dpid in datapaths else 0.0)
            flows.add_metric([host], len(getattr(core, "installed", {}).get(dpid, ())))
            groups.add_metric([host], len(getattr(core, "installed_groups", {}).get(dpid, ())))
        yield connected
        yield flows
        yield groups
        dropped = CounterMetricFamily(
            "typhoon_controller_dropped_messages",
            "PacketIns and control tuples the controller dropped, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(getattr(core, "drops", {}).items()):
            dropped.add_metric([reason], n)
        yield dropped
        apps = GaugeMetricFamily(
            "typhoon_app_workers", "Workers of the application's physical topology.", labels=["app"]
        )
        for name, a in sorted(core.view.apps.items()):
            apps.add_metric([name], len(a.physical.workers))
        yield apps

    # ----- control-plane apps ------------------------------------------------------------

    @staticmethod
    def _fault_detector(fd: Any) -> Iterator[Metric]:
        if fd is None:
            return
        incidents = list(getattr(fd, "incidents", []))
        total = CounterMetricFamily(
            "typhoon_fault_incidents",
            "Dead workers the fault detector handled.",
            labels=["app", "node"],
        )
        by_state = GaugeMetricFamily(
            "typhoon_fault_incidents_by_state",
            "Fault incidents by their current state (rerouting, replacing, rejoined, ...).",
            labels=["state"],
        )
        counts: dict[tuple[str, str], int] = {}
        states: dict[str, int] = {}
        reroutes: list[float] = []
        for i in incidents:
            counts[(i.app, i.node)] = counts.get((i.app, i.node), 0) + 1
            states[i.state] = states.get(i.state, 0) + 1
            if i.reroute_ms is not None:
                reroutes.append(i.reroute_ms / 1000.0)
        for (app, node), n in sorted(counts.items()):
            total.add_metric([app, node], n)
        for state, n in sorted(states.items()):
            by_state.add_metric([state], n)
        yield total
        yield by_state
        yield _histogram(
            "typhoon_fault_reroute_seconds",
            "From a worker's death to the ROUTING around it written to every sender.",
            reroutes,
            REROUTE_BUCKETS,
        )

    @staticmethod
    def _autoscaler(scaler: Any) -> Iterator[Metric]:
        if scaler is None:
            return
        family = CounterMetricFamily(
            "typhoon_autoscaler_decisions",
            "Autoscaler decisions (scale up/down, recommend, keep).",
            labels=["app", "node", "action"],
        )
        for (app, node, action), n in sorted(getattr(scaler, "decision_counts", {}).items()):
            family.add_metric([app, node, action], n)
        yield family
        target = GaugeMetricFamily(
            "typhoon_autoscaler_parallelism",
            "Parallelism of each managed node, as the autoscaler last saw it.",
            labels=["app", "node"],
        )
        for (app, node), n in sorted(getattr(scaler, "shape", {}).items()):
            target.add_metric([app, node], n)
        yield target

    @staticmethod
    def _debugger(dbg: Any) -> Iterator[Metric]:
        if dbg is None:
            return
        sessions = getattr(getattr(dbg, "sessions", None), "sessions", {})
        states = GaugeMetricFamily(
            "typhoon_debug_sessions",
            "Live-debugger sessions by state.",
            labels=["app", "state"],
        )
        records = CounterMetricFamily(
            "typhoon_debug_records",
            "Tuple records a live-debugger session received.",
            labels=["app", "session"],
        )
        counts: dict[tuple[str, str], int] = {}
        for s in sessions.values():
            app = s.spec.app
            counts[(app, s.state)] = counts.get((app, s.state), 0) + 1
            records.add_metric([app, s.id], s.received)
        for (app, state), n in sorted(counts.items()):
            states.add_metric([app, state], n)
        yield states
        yield records

    @staticmethod
    def _load_balancer(lb: Any) -> Iterator[Metric]:
        if lb is None:
            return
        share = GaugeMetricFamily(
            "typhoon_lb_share",
            "Share of a balanced node's frames the switch's select group sends to a worker.",
            labels=["app", "node", "worker"],
        )
        for (app, node), nb in sorted(getattr(lb, "nodes", {}).items()):
            for wid, w in sorted(nb.installed.items()):
                share.add_metric([app, node, str(wid)], w)
        yield share

    @staticmethod
    def _spark(totals: SparkTotals | None) -> Iterator[Metric]:
        if totals is None or not totals.nodes:
            return
        batches = CounterMetricFamily(
            "typhoon_spark_batches", "Spark micro-batches run.", labels=["app", "node"]
        )
        rows = CounterMetricFamily(
            "typhoon_spark_input_rows", "Rows Spark micro-batches read.", labels=["app", "node"]
        )
        hist = HistogramMetricFamily(
            "typhoon_spark_batch_duration_seconds",
            "Duration of Spark micro-batches.",
            labels=["app", "node"],
        )
        for key, n in sorted(totals.nodes.items()):
            batches.add_metric(list(key), n.batches)
            rows.add_metric(list(key), n.rows)
            if key in totals.duration_count:
                counts = totals.buckets[key]
                buckets = [(_le(b), c) for b, c in zip(SPARK_BATCH_BUCKETS, counts, strict=True)]
                buckets.append(("+Inf", totals.duration_count[key]))
                hist.add_metric(list(key), buckets, totals.duration_sum[key])
        yield batches
        yield rows
        yield hist


def _le(bound: float) -> str:
    return repr(float(bound))


def _histogram(
    name: str, text: str, values: list[float], bounds: tuple[float, ...]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, text)
    buckets = [(_le(b), sum(1 for v in values if v <= b)) for b in bounds]
    buckets.append(("+Inf", len(values)))
    family.add_metric([], buckets, sum(values))
    return family


def registry(core: Any, lookup: Callable[[str], Any] | None = None) -> CollectorRegistry:
    """A registry with the controller's collector (and nothing else: no process metrics
    of the test runner or of Ryu's own modules)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(TyphoonCollector(core, lookup))
    return reg


def exposition(reg: CollectorRegistry) -> bytes:
    """The text exposition format (``Content-Type: CONTENT_TYPE``)."""
    return generate_latest(reg)
