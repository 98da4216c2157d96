"""What the web dashboard shows, as one JSON document (``GET /typhoon/dashboard``).

The page (``controller/dashboard_static/``) polls this once a second instead of
calling every app's REST resource, so one request gives a consistent picture:
hosts, every application's nodes, workers and streams with their current rates,
and the reports of the control-plane apps that are loaded.

:func:`snapshot` is pure (plain inputs, a dict out; ``tests/unit/test_dashboard.py``);
:func:`gather` collects those inputs from the running core and apps, duck-typed
as ``controller/metrics.py`` is, so neither needs Ryu.  Nothing here keeps state:
the throughput history the charts draw lives in the page.

Stream rates come from the receiving workers: each receiver's input rate (the
core's, from two successive METRIC_RESPs) is split over its input streams in
proportion to the tuples it has received on each, which is exact for a node with
one input stream.  Debug sessions carry no tuples: reading those needs the token
(``controller/debugging/debug_rest.py``), and the page asks for them with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from controller.rules.view import AppView, ClusterView

MAX_INCIDENTS = 50  # newest fault incidents shown
MAX_DECISIONS = 20  # newest autoscaler / load-balancer decisions per node
CONTROL_STREAM = "0"  # stream 0 of a worker's input counts is control traffic


@dataclass
class Reports:
    """The control-plane apps' reports; None for an app that is not loaded."""

    faults: list[dict[str, Any]] | None = None  # FaultDetector.report()
    autoscaler: dict[str, Any] | None = None  # Autoscaler.report()
    lb: dict[str, Any] | None = None  # LoadBalancer.report()
    debug: list[dict[str, Any]] | None = None  # every live-debugger session's to_dict()


@dataclass
class Inputs:
    """Everything :func:`snapshot` reads, copied out of the controller."""

    view: ClusterView
    rates: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    metrics: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    connected: set[str] = field(default_factory=set)  # hosts whose bridge is connected
    reconfigs: dict[str, dict[str, Any]] = field(default_factory=dict)  # app -> last update
    reports: Reports = field(default_factory=Reports)
    now: float = 0.0  # wall time of the snapshot


def _data_in(m: dict[str, Any]) -> dict[str, int]:
    """A worker's received tuples per stream id, without control traffic."""
    counts = m.get("in") or {}
    return {str(k): int(v) for k, v in counts.items() if str(k) != CONTROL_STREAM}


def _depths(app: AppView) -> dict[str, int]:
    """Each node's column in the drawing: the longest path from a spout to it."""
    topo = app.topology
    depth = {name: 0 for name in topo.nodes}
    for _ in range(len(topo.nodes)):  # a DAG settles within |nodes| rounds
        changed = False
        for s in topo.streams:
            if depth[s.dst] < depth[s.src] + 1:
                depth[s.dst] = depth[s.src] + 1
                changed = True
        if not changed:
            break
    return depth


def _app(name: str, app: AppView, inputs: Inputs) -> dict[str, Any]:
    rates = inputs.rates.get(name, {})
    metrics = inputs.metrics.get(name, {})
    workers = []
    for w in sorted(app.physical.workers, key=lambda w: (w.node, w.index)):
        r = rates.get(w.worker_id, {})
        m = metrics.get(w.worker_id, {})
        workers.append(
            {
                **app.worker_summary(w),
                "rate_in": float(r.get("in", 0.0)),
                "rate_out": float(r.get("out", 0.0)),
                "tuples_in": sum(_data_in(m).values()),
                "tuples_out": sum(int(v) for v in (m.get("out") or {}).values()),
                "queue": m.get("queue"),
            }
        )
    depth = _depths(app)
    nodes = []
    for n in app.topology.nodes.values():
        mine = [w for w in workers if w["node"] == n.name]
        nodes.append(
            {
                "name": n.name,
                "kind": n.kind,
                "operator": n.operator,
                "engine": n.engine,
                "parallelism": n.parallelism,
                "depth": depth[n.name],
                "workers": [w["worker"] for w in mine],
                "rate_in": round(sum(w["rate_in"] for w in mine), 1),
                "rate_out": round(sum(w["rate_out"] for w in mine), 1),
            }
        )
    streams = []
    for s in app.topology.streams:
        rate = 0.0
        for w in app.physical.of_node(s.dst):
            got = _data_in(metrics.get(w.worker_id, {}))
            total = sum(got.values())
            if total:
                rate += (
                    float(rates.get(w.worker_id, {}).get("in", 0.0)) * got.get(str(s.id), 0) / total
                )
        streams.append(
            {
                "id": s.id,
                "from": s.src,
                "to": s.dst,
                "name": s.name,
                "policy": s.grouping.type,
                "fields": list(s.grouping.fields),
                "rate": round(rate, 1),
            }
        )
    return {
        "name": name,
        "app_id": app.physical.app_id,
        "version": app.physical.version,
        "state": app.state,
        "problem": inputs.view.problems.get(name),
        "nodes": nodes,
        "workers": workers,
        "streams": streams,
        "reconfig": inputs.reconfigs.get(name),
    }


def _newest_decisions(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """An app report (application -> node -> entry) with each node's decisions trimmed."""
    if report is None:
        return None
    out: dict[str, Any] = {}
    for app, by_node in report.items():
        out[app] = {}
        for node, entry in by_node.items():
            entry = dict(entry)
            entry["decisions"] = list(entry.get("decisions") or [])[-MAX_DECISIONS:]
            out[app][node] = entry
    return out


def snapshot(inputs: Inputs) -> dict[str, Any]:
    """The dashboard's document: hosts, applications, and the apps' reports."""
    cluster = inputs.view.cluster
    reports = inputs.reports
    faults = None
    if reports.faults is not None:
        faults = sorted(reports.faults, key=lambda i: i.get("detected_wall") or 0.0)
        faults = faults[-MAX_INCIDENTS:]
    return {
        "time": inputs.now,
        "hosts": [{"name": h, "connected": h in inputs.connected} for h in sorted(cluster.hosts)],
        "links": sorted({tuple(sorted((link.a, link.b))) for link in cluster.links}),
        "apps": [_app(name, a, inputs) for name, a in sorted(inputs.view.apps.items())],
        "faults": faults,
        "autoscaler": _newest_decisions(reports.autoscaler),
        "lb": _newest_decisions(reports.lb),
        "debug": reports.debug,
    }


def _report(app: Any, what: Callable[[Any], Any]) -> Any:
    return None if app is None else what(app)


def _sessions(debugger: Any) -> list[dict[str, Any]]:
    found: Iterable[Any] = getattr(getattr(debugger, "sessions", None), "sessions", {}).values()
    return [s.to_dict() for s in found]


def gather(core: Any, lookup: Callable[[str], Any], now: float) -> Inputs:
    """Read the running controller (``core``) and the apps ``lookup(name)`` finds."""
    view: ClusterView = core.view
    host_of = {info.dpid: name for name, info in view.cluster.hosts.items()}
    connected = {host_of[d] for d in getattr(core, "datapaths", {}) if d in host_of}
    reconfigs = {}
    for name in view.apps:
        record = core.reconfigs.get(name)
        if record is not None:
            reconfigs[name] = record.to_dict()
    return Inputs(
        view=view,
        rates=getattr(core, "rates", {}),
        metrics=getattr(core, "worker_metrics", {}),
        connected=connected,
        reconfigs=reconfigs,
        reports=Reports(
            faults=_report(
                lookup("FaultDetector") or getattr(core, "recovery", None), lambda a: a.report()
            ),
            autoscaler=_report(lookup("Autoscaler"), lambda a: a.report()),
            lb=_report(lookup("LoadBalancer"), lambda a: a.report()),
            debug=_report(lookup("LiveDebugger"), _sessions),
        ),
        now=now,
    )
