"""A submitted job's run report: agents publish, the controller merges, stores and removes."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.job_end import finish_jobs
from controller.rules.view import ClusterView
from typhoon import job_report
from typhoon.cluster import Cluster, HostInfo
from typhoon.coordinator import SqliteCoordinator, WorkerStatus
from typhoon.job_report import publish_worker_report, read_job_report
from typhoon.manager import Manager
from typhoon.topology import load_topology_text

WORDCOUNT = """
name: wc
config: {placement: spread}
spouts:
  - {id: source, operator: sentence_source, args: {count: 10}}
bolts:
  - {id: count, operator: count_by_key, args: {key: sentence}, parallelism: 2}
streams:
  - {from: source, to: count, grouping: {type: fields, fields: [sentence]}}
"""


def worker_report(wid: int, node: str, index: int, host: str, result: Any) -> dict[str, Any]:
    metrics = {"in": {}, "out": {}, "drops": {}, "seq_gaps": 0, "serializations": 0,
               "frames_out": 0, "credit_stalls": 0}  # fmt: skip
    return {"worker": wid, "node": node, "index": index, "host": host, "port": 100 + wid,
            "finished": True, "error": None, "metrics": metrics, "links": None,
            "result": result}  # fmt: skip


@pytest.fixture
def coord(tmp_path: Path) -> Iterator[SqliteCoordinator]:
    c = SqliteCoordinator(tmp_path / "coord.db")
    c.put_cluster(Cluster({h: HostInfo(h, "br", i + 1) for i, h in enumerate(["h1", "h2"])}))
    yield c
    c.close()


def run_to_end(coord, tmp_path: Path, codes: dict[str, int] | None = None) -> Any:
    """Submit wc; each host's 'agent' writes the report files and publishes them."""
    physical = Manager(coord).submit(load_topology_text(WORDCOUNT))
    results = {0: {"counts": {"a": 2, "b": 1}}, 1: {"counts": {"c": 4}}}
    for w in physical.workers:
        code = (codes or {}).get(f"{w.node}[{w.index}]", 0)
        app_dir = tmp_path / w.host / "wc"
        (app_dir / "reports").mkdir(parents=True, exist_ok=True)
        result = results[w.index] if w.node == "count" else None
        if code == 0:
            report = worker_report(w.worker_id, w.node, w.index, w.host, result)
            (app_dir / "reports" / f"worker-{w.worker_id}.json").write_text(json.dumps(report))
        else:
            (app_dir / f"worker-{w.worker_id}.log").write_text(
                "Traceback (most recent call last):\n  File x\nValueError: bad word\n"
            )
        publish_worker_report(coord, "wc", w.worker_id, w.host, app_dir, code)
        coord.put_worker_status(
            "wc", WorkerStatus(w.worker_id, w.host, "exited", 1, w.port, exit_code=code)
        )
    return physical


def test_a_finished_job_merges_every_hosts_reports(coord, tmp_path):
    physical = run_to_end(coord, tmp_path)
    assert {w.host for w in physical.workers} == {"h1", "h2"}
    report = read_job_report(coord, "wc")
    assert report["finished"] and report["ok"], report["problems"]
    assert report["results"]["count"]["counts"] == {"a": 2, "b": 1, "c": 4}
    states = {
        (w["node"], w["index"]): (w["state"], w["exit_code"]) for w in report["worker_states"]
    }
    assert states == {("source", 0): ("exited", 0), ("count", 0): ("exited", 0),
                      ("count", 1): ("exited", 0)}  # fmt: skip


def test_a_running_job_is_not_ok_yet_and_says_how_far_it_is(coord, tmp_path):
    physical = Manager(coord).submit(load_topology_text(WORDCOUNT))
    w = physical.workers[0]
    coord.put_worker_status("wc", WorkerStatus(w.worker_id, w.host, "attached", 1, w.port))
    report = read_job_report(coord, "wc")
    assert not report["finished"] and not report["ok"]
    assert report["problems"] == ["not finished: 3 of 3 workers have not exited"]
    assert {x["state"] for x in report["worker_states"]} == {"attached", "not started"}


def test_a_failed_worker_brings_its_exit_code_and_traceback_from_its_host(coord, tmp_path):
    run_to_end(coord, tmp_path, codes={"count[1]": 1})
    report = read_job_report(coord, "wc")
    assert report["finished"] and not report["ok"]
    (failure,) = report["failures"]
    assert failure["exit_code"] == 1 and failure["error"] == "ValueError: bad word"
    assert failure["log"].startswith(f"{failure['host']}:") and failure["traceback"]
    assert any("worker" in p and "it wrote no report" in p for p in report["problems"])
    assert any("failed (exit code 1): ValueError: bad word" in p for p in report["problems"])


def test_a_report_too_large_for_the_coordinator_says_where_it_is(coord, tmp_path, monkeypatch):
    monkeypatch.setattr(job_report, "REPORT_LIMIT", 10)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "worker-7.json").write_text(json.dumps({"big": "x" * 100}))
    publish_worker_report(coord, "wc", 7, "h2", tmp_path, 0)
    doc = coord.worker_reports("wc")[7]
    assert doc["report"] is None
    assert (
        doc["error"].startswith("its report (") and f"on h2 at {tmp_path}/reports" in doc["error"]
    )


@pytest.mark.parametrize("remove", [False, True])
def test_the_controller_stores_the_report_marks_finished_and_removes_if_asked(
    coord, tmp_path, remove
):
    manager = Manager(coord)
    manager.submit = (lambda submit: lambda t: submit(t, remove))(manager.submit)
    physical = manager.submit(load_topology_text(WORDCOUNT))
    log = logging.getLogger("test")
    assert finish_jobs(ClusterView.read(coord), coord, manager, log) == []  # nothing ran yet
    assert coord.get_result("wc") is None
    for w in physical.workers:  # every worker exited cleanly, reports published
        report = worker_report(w.worker_id, w.node, w.index, w.host, {"counts": {"a": 1}}
                               if w.node == "count" else None)  # fmt: skip
        coord.put_worker_report("wc", w.worker_id, {"host": w.host, "report": report})
        coord.put_worker_status("wc", WorkerStatus(w.worker_id, w.host, "exited", exit_code=0))
    removed = finish_jobs(ClusterView.read(coord), coord, manager, log)
    stored = coord.get_result("wc")
    assert stored["ok"] and stored["results"]["count"]["counts"] == {"a": 2}
    if remove:
        assert removed == ["wc"] and coord.get_topology("wc") is None
        assert coord.get_result("wc") == stored  # the report outlives the job
    else:
        assert removed == [] and coord.get_app_state("wc")["finished"] is True
        # once marked, it is not stored again
        coord.put_result("wc", {"marker": 1})
        finish_jobs(ClusterView.read(coord), coord, manager, log)
        assert coord.get_result("wc") == {"marker": 1}
    # a new job of the same name starts without the old report
    if not remove:
        manager.kill("wc")
    manager.submit(load_topology_text(WORDCOUNT))
    assert coord.get_result("wc") is None and coord.worker_reports("wc") == {}


def test_reports_and_debugger_batches_do_not_make_the_core_reread_its_view():
    from controller.rules.view import rereads_view

    assert not any(map(rereads_view, ["report/wc/3", "result/wc", "debugrec/ab12/7"]))
    assert all(map(rereads_view, ["status/wc/3", "metrics/wc/3", "physical/wc", "cluster"]))


def test_a_worker_lost_with_its_agent_is_a_problem_not_a_silent_gap(coord, tmp_path):
    physical = Manager(coord).submit(load_topology_text(WORDCOUNT))
    for w in physical.workers:
        status = WorkerStatus(w.worker_id, w.host, "exited", exit_code=0)
        if w.node == "source":  # its agent restarted and found it gone
            status = WorkerStatus(w.worker_id, w.host, "exited", error="lost: its agent stopped")
        else:
            report = worker_report(w.worker_id, w.node, w.index, w.host, {"counts": {}})
            coord.put_worker_report("wc", w.worker_id, {"host": w.host, "report": report})
        coord.put_worker_status("wc", status)
    report = read_job_report(coord, "wc")
    source = next(w for w in physical.workers if w.node == "source")
    assert report["finished"] and not report["ok"]
    assert report["problems"] == [
        f"worker {source.worker_id} on {source.host} exited without its report "
        "(lost: its agent stopped)"
    ]


def test_a_merged_report_too_large_to_store_is_stored_without_results(coord, tmp_path, monkeypatch):
    monkeypatch.setattr(job_report, "RESULT_LIMIT", 200)
    run_to_end(coord, tmp_path)
    manager = Manager(coord)
    finish_jobs(ClusterView.read(coord), coord, manager, logging.getLogger("test"))
    stored = coord.get_result("wc")
    assert stored["results"] == {} and not stored["ok"] and stored["finished"]
    assert (
        stored["problems"][-1].startswith("the merged report (")
        and "left out" in (stored["problems"][-1])
    )
    assert coord.get_app_state("wc")["finished"] is True
