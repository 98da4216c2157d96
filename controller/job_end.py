"""Finished jobs: store the merged report, mark the application, remove it if asked.

The core calls :func:`finish_jobs` after every coordinator poll.  A job whose
every current worker has exited (``typhoon/job_report.py``) gets its report
stored under ``result/NAME`` and ``finished`` in its state (what ``typhoon
list`` and ``status`` show); a job submitted with ``--remove-when-done`` is
then removed, and ``typhoon report NAME`` still reads the stored report.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from typhoon.job_report import finished, read_job_report, storable


def finish_jobs(view: Any, coordinator: Any, manager: Any, logger: logging.Logger) -> list[str]:
    """Store the reports of the view's newly finished jobs; the names of those removed."""
    removed = []
    for name, app in list(view.apps.items()):
        if app.state.get("finished") or not finished(app.physical, app.statuses):
            continue
        try:
            report = read_job_report(coordinator, name)
        except Exception as e:  # a report that cannot be merged still ends the job
            logger.exception("app %s: cannot merge its workers' reports", name)
            report = {"topology": name, "ok": False, "finished": True,
                      "problems": [f"the workers' reports could not be merged: {e!r}"],
                      "workers": [], "nodes": {}, "results": {}}  # fmt: skip
        if report is None:  # removed meanwhile
            continue
        report = storable(report)
        coordinator.put_result(name, report)
        fresh = coordinator.get_app_state(name)
        coordinator.put_app_state(
            name, {**fresh, "finished": True, "finished_at": time.time(), "ok": report["ok"]}
        )
        verdict = "ok" if report["ok"] else f"not ok: {'; '.join(report['problems'][:3])}"
        logger.info("app %s: finished, %s (typhoon report %s)", name, verdict, name)
        if fresh.get("remove_when_done"):
            manager.kill(name)
            removed.append(name)
            logger.info("app %s: removed once done, as submitted", name)
    return removed
