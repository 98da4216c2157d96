"""The report of a tcp run (:class:`typhoon.tcp_cluster.TcpCluster`): the workers' report
files merged with what the run coordinator saw, in the shape an sdn run reports
(:func:`typhoon.report.build_report`).

What the coordinator adds: exit codes and failures (with their log files, unless
the logs went with a temporary directory), workers relaunched and incidents under
a guarantee, the live rates, the engine services and their restarts, Spark
progress, refused connections and the rescales.  Links of workers a rescale took
away count only up to their leaving (``drop_left_links``).
"""

from __future__ import annotations

import time
from typing import Any

from typhoon.report import build_report, read_worker_reports, worker_failures
from typhoon.tcp_recovery import drop_left_links


def tcp_report(cluster: Any, clean: bool) -> dict[str, Any]:
    """The report of ``cluster`` (a ``TcpCluster``: not imported, it imports this) once
    its workers stopped (``clean``: every one exited 0)."""
    elapsed = time.monotonic() - cluster.started_at
    workers = read_worker_reports(cluster.report_dir)
    left = {w for r in cluster.rescaler.records for w in r.removed}
    drop_left_links(workers, left, cluster.generation)
    exit_codes = {k: p.returncode for k, p in cluster.procs.items()}
    failures = worker_failures(
        list(cluster.launched.values()),
        exit_codes,
        workers,
        lambda wid: cluster.workdir / f"worker-{wid}.log",
    )
    if cluster._tmp is not None:  # the logs go with the temp dir: the report keeps no path
        for f in failures:
            f.pop("log")
    for w in workers:  # events a worker had not forwarded yet when it stopped
        cluster._spark_events(w["metrics"])
    return build_report(
        cluster.topology,
        workers,
        transport="tcp",
        hosts=cluster.options.hosts,
        elapsed_s=round(elapsed, 3),
        ok=clean,
        exit_codes={str(k): code for k, code in exit_codes.items()},
        failures=failures,
        recovered=sorted(set(cluster.recovered)),
        incidents=cluster.incidents,
        rates=cluster.live.history,
        services={
            s.name: {
                "host": s.host,
                "nodes": s.nodes,
                "restarts": cluster.service_restarts.get(s.name, 0),
            }
            for s in cluster.services
        },
        spark_progress=cluster.spark_progress,
        rejected_connections=dict(cluster.rejected),
        reconfigurations=cluster.rescaler.report(),
        problems=cluster.rescaler.failed(),
    )
