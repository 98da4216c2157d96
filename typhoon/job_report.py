"""The run report of a submitted job, gathered from the hosts through the coordinator.

``typhoon run`` reads the workers' report files from one directory; a job
submitted to a cluster leaves them on several hosts.  So each host's agent
publishes an ended worker's report (and its exit code, and the tail of its
traceback when it failed) to ``report/NAME/WID`` before it marks the worker
``exited`` (:func:`publish_worker_report`), and :func:`job_report` merges what
was published with :func:`typhoon.report.build_report`, exactly as ``typhoon
run`` does.  Once every worker of the current physical topology has exited,
the job is *finished*: the controller stores the report under ``result/NAME``
(kept after the job is removed) and marks the application state ``finished``.

A report larger than ``REPORT_LIMIT`` (ZooKeeper takes values up to 1 MiB) is
not copied: the merged report then says where it lies instead of counting
wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typhoon.coordinator import Coordinator, WorkerStatus
from typhoon.report import build_report, log_traceback, worker_failures
from typhoon.topology.model import PhysicalTopology, Topology

REPORT_LIMIT = 768 * 1024  # bytes of one worker's report the coordinator is given
RESULT_LIMIT = 960 * 1024  # bytes of a finished job's merged report stored there


def publish_worker_report(
    c: Coordinator, app: str, worker_id: int, host: str, app_dir: Path, exit_code: int | None
) -> None:
    """The agent's part: copy ``APP_DIR/reports/worker-WID.json`` to ``report/APP/WID``."""
    path = Path(app_dir) / "reports" / f"worker-{worker_id}.json"
    log = Path(app_dir) / f"worker-{worker_id}.log"
    doc: dict[str, Any] = {"host": host, "exit_code": exit_code, "log": f"{host}:{log}"}
    report, error = None, ""
    try:
        text = path.read_text(encoding="utf-8")
        if len(text) > REPORT_LIMIT:
            error = (
                f"its report ({len(text)} bytes) is larger than the coordinator is given "
                f"({REPORT_LIMIT}): read it on {host} at {path}"
            )
        else:
            report = json.loads(text)
    except FileNotFoundError:
        error = "it wrote no report"
    except (OSError, ValueError) as e:
        error = f"its report {host}:{path} is unreadable: {e}"
    traceback: list[str] = []
    if exit_code and not (isinstance(report, dict) and report.get("traceback")):
        traceback = log_traceback(log)
    c.put_worker_report(app, worker_id, {**doc, "report": report, "error": error,
                                         "traceback": traceback})  # fmt: skip


def finished(physical: PhysicalTopology, statuses: dict[int, WorkerStatus]) -> bool:
    """Every worker of the current physical topology has exited."""
    current = [w.worker_id for w in physical.workers]
    return bool(current) and all(
        wid in statuses and statuses[wid].state == "exited" for wid in current
    )


def job_report(
    topology: Topology,
    physical: PhysicalTopology,
    statuses: dict[int, WorkerStatus],
    published: dict[int, dict[str, Any]],
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The merged report: every worker's state and exit code, the nodes' merged results,
    ``ok`` and ``problems`` (a job still running is not ok yet: it says how far it is)."""
    current = {w.worker_id for w in physical.workers}
    done = finished(physical, statuses)
    reports = [
        p["report"] for _, p in sorted(published.items()) if isinstance(p.get("report"), dict)
    ]
    exit_codes = {wid: s.exit_code for wid, s in statuses.items() if s.state == "exited"}
    failures = worker_failures(
        physical.workers,
        exit_codes,
        reports,
        lambda wid: published.get(wid, {}).get("log") or "",
        tracebacks={wid: p.get("traceback") or [] for wid, p in published.items()},
    )
    for f in failures:  # the agent's word on a worker that left no report
        f["error"] = f["error"] or (statuses[f["worker"]].error or None)
    problems = []
    if not done:
        running = len(current) - len([w for w in current if w in exit_codes])
        problems.append(f"not finished: {running} of {len(current)} workers have not exited")
    for wid, p in sorted(published.items()):
        if wid in current and p.get("error"):
            problems.append(f"worker {wid} on {p.get('host')}: {p['error']}")
    for wid in sorted(current & set(exit_codes) - set(published)):  # e.g. lost with its agent
        s = statuses[wid]
        why = f" ({s.error})" if s.error else ""
        problems.append(f"worker {wid} on {s.host} exited without its report{why}")
    workers = []
    for w in sorted(physical.workers, key=lambda w: w.worker_id):
        s = statuses.get(w.worker_id)
        workers.append({
            "worker": w.worker_id, "node": w.node, "index": w.index, "host": w.host,
            "state": s.state if s else "not started",
            "exit_code": s.exit_code if s else None,
            "error": (s.error if s else "") or "",
        })  # fmt: skip
    clean = done and all(exit_codes.get(wid) == 0 for wid in current)
    state = state or {}
    return build_report(
        topology,
        reports,
        transport="sdn",
        finished=done,
        ok=clean,
        app_id=physical.app_id,
        version=physical.version,
        hosts=sorted({w.host for w in physical.workers}),
        elapsed_s=_elapsed(state, statuses) if done else None,
        worker_states=workers,
        recovered=sorted(set(statuses) - current),
        failures=failures,
        problems=problems,
    )


def storable(report: dict[str, Any]) -> dict[str, Any]:
    """The report as stored under ``result/NAME``: whole when it fits ``RESULT_LIMIT``, else
    without the nodes' results, and saying so (not ok: the counts are not all there)."""
    size = len(json.dumps(report, default=str))
    if size <= RESULT_LIMIT:
        return report
    why = (
        f"the merged report ({size} bytes) is larger than the coordinator stores "
        f"({RESULT_LIMIT}): the nodes' results are left out; each worker's report is on its "
        "host (WORKDIR/NAME/reports)"
    )
    return {**report, "ok": False, "problems": [*report["problems"], why], "results": {}}


def _elapsed(state: dict[str, Any], statuses: dict[int, WorkerStatus]) -> float | None:
    """From activation to the last exit (both are wall-clock times written by the cluster)."""
    start = state.get("activated_at")
    end = max((s.updated for s in statuses.values()), default=0.0)
    return round(end - start, 3) if start and end >= start else None


def read_job_report(c: Coordinator, name: str) -> dict[str, Any] | None:
    """The report of ``name`` as it stands (None: no such application)."""
    topology, physical = c.get_topology(name), c.get_physical(name)
    if topology is None or physical is None:
        return None
    return job_report(
        topology, physical, c.worker_statuses(name), c.worker_reports(name), c.get_app_state(name)
    )
