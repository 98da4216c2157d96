"""How the CLI says a run or a request failed: tracebacks of failed workers in the report
and the output, ``--report -``, one sentence for a controller that is not there."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

import typhoon_cli
from typhoon.report import build_report, failure_problems, log_traceback, worker_failures
from typhoon.topology import load_topology_text
from typhoon.topology.model import WorkerAssignment

ROOT = Path(__file__).resolve().parents[2]

PIPE = """
name: pipe
spouts:
  - {id: source, operator: sequence_source, args: {count: 10}}
bolts:
  - {id: sink, operator: sequence_check}
streams:
  - {from: source, to: sink, grouping: shuffle}
"""

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "ops.py", line 3, in process',
    "    1 / 0",
    "ZeroDivisionError: division by zero",
]


def assignment(wid: int, node: str) -> WorkerAssignment:
    return WorkerAssignment(worker_id=wid, node=node, index=0, host="h2", port=0)


def test_traceback_from_the_worker_report_first():
    reports = [
        {"worker": 2, "error": "ZeroDivisionError: division by zero", "traceback": TRACEBACK}
    ]
    failures = worker_failures(
        [assignment(1, "source"), assignment(2, "sink")], {1: 0, 2: 1}, reports
    )
    assert [f["worker"] for f in failures] == [2]
    f = failures[0]
    assert (f["node"], f["host"], f["exit_code"], f["traceback"]) == ("sink", "h2", 1, TRACEBACK)
    assert failure_problems(failures) == [
        "worker 2 (sink[0]) on h2 failed (exit code 1): ZeroDivisionError: division by zero"
    ]


def test_traceback_from_the_log_when_the_worker_wrote_no_report(tmp_path):
    log = tmp_path / "worker-1.log"
    log.write_text("INFO starting\nTraceback (most recent call last):\n  old\nOldError\n"
                   "INFO again\n" + "\n".join(TRACEBACK) + "\n")  # fmt: skip
    assert log_traceback(log) == TRACEBACK  # the last one
    failures = worker_failures([assignment(1, "source")], {1: 1}, [], lambda wid: log)
    assert failures[0]["traceback"] == TRACEBACK
    assert failures[0]["error"] == "ZeroDivisionError: division by zero"
    assert failures[0]["log"] == str(log)
    assert log_traceback(tmp_path / "absent.log") == []


def test_the_worker_that_raised_comes_before_those_that_lost_it():
    reports = [
        {"worker": 1, "error": "connection lost: reset", "traceback": []},
        {"worker": 2, "error": "ZeroDivisionError: division by zero", "traceback": TRACEBACK},
    ]
    failures = worker_failures(
        [assignment(1, "source"), assignment(2, "sink")], {1: 1, 2: 1}, reports
    )
    assert [f["worker"] for f in failures] == [2, 1]


def test_failures_make_the_report_not_ok():
    topo = load_topology_text(PIPE)
    failure = {"worker": 2, "node": "sink", "index": 0, "host": "h1", "exit_code": 1,
               "error": "E", "traceback": TRACEBACK, "log": None}  # fmt: skip
    r = build_report(topo, [], failures=[failure])
    assert not r["ok"]
    assert r["problems"][0] == "worker 2 (sink[0]) on h1 failed (exit code 1): E"
    assert r["failures"] == [failure]
    assert "failures" not in build_report(topo, [])


def fake_report(ok: bool) -> dict:
    failure = {"worker": 2, "node": "sink", "index": 0, "host": "h1", "exit_code": 1,
               "error": "ZeroDivisionError: division by zero", "traceback": TRACEBACK,
               "log": "/w/pipe/worker-2.log"}  # fmt: skip
    report = build_report(load_topology_text(PIPE), [], failures=[] if ok else [failure])
    return {**report, "elapsed_s": 0.5}


@pytest.fixture
def pipe_file(tmp_path) -> Path:
    path = tmp_path / "pipe.yaml"
    path.write_text(PIPE)
    return path


def run_cli(monkeypatch, capsys, report: dict, *argv: str) -> tuple[int, str, str, dict]:
    import typhoon.tcp_cluster

    seen = {}

    def fake_run_tcp(topology, options):
        seen["options"] = options
        return report

    monkeypatch.setattr(typhoon.tcp_cluster, "run_tcp", fake_run_tcp)
    code = typhoon_cli.main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err, seen


def test_report_dash_is_stdout_and_the_summary_goes_to_stderr(
    monkeypatch, capsys, tmp_path, pipe_file
):
    monkeypatch.chdir(tmp_path)
    code, out, err, _ = run_cli(monkeypatch, capsys, fake_report(True), str(pipe_file),
                                "--report", "-", "-q")  # fmt: skip
    assert code == 0
    assert json.loads(out)["ok"] is True
    assert not (tmp_path / "-").exists()
    assert json.loads(err.splitlines()[0]) == {"ok": True, "elapsed_s": 0.5}


def test_a_failed_worker_shows_its_traceback(monkeypatch, capsys, pipe_file):
    code, out, err, _ = run_cli(monkeypatch, capsys, fake_report(False), str(pipe_file), "-q")
    assert code == 1
    lines = out.splitlines()
    assert json.loads(lines[0])["ok"] is False
    assert "  problem: worker 2 (sink[0]) on h1 failed (exit code 1): ZeroDivisionError: " \
        "division by zero" in lines  # fmt: skip
    assert "  worker 2 (sink[0]) on h1 (log: /w/pipe/worker-2.log):" in lines
    assert "    | ZeroDivisionError: division by zero" in lines


def test_tcp_run_takes_workdir(monkeypatch, capsys, tmp_path, pipe_file):
    _, _, _, seen = run_cli(monkeypatch, capsys, fake_report(True), str(pipe_file), "-q",
                            "--workdir", str(tmp_path / "wd"))  # fmt: skip
    assert seen["options"].workdir == tmp_path / "wd"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "argv", [["status", "wc"], ["list"], ["kill", "wc"], ["debug", "list", "wc"]]
)
def test_no_controller_is_one_sentence_and_exit_1(capsys, argv):
    url = f"http://127.0.0.1:{closed_port()}"
    code = typhoon_cli.main([*argv, "--controller", url])
    out, err = capsys.readouterr()
    assert code == 1
    assert err == (
        f"error: cannot reach the controller at {url}/typhoon (connection refused): is it "
        "running, and does its REST API listen there? It listens on wsapi_host:wsapi_port of "
        "the [controller] section of its controller.conf, 127.0.0.1:8080 by default, so from "
        "another host go through ssh -L 8080:127.0.0.1:8080 or a TLS proxy (docs/deploy.md "
        "section 6); set it with --controller URL, $TYPHOON_CONTROLLER or controller = in "
        "~/.config/typhoon/client.ini\n"
    )
    assert "Traceback" not in out + err


@pytest.mark.parametrize(
    ("file_config", "flags", "want"),
    [
        ("", {}, {}),  # nothing said: the runners' defaults
        ("config: {batch_size: 50, max_delay: 7}\n", {}, {"batch_size": 50, "max_delay": 7}),
        (
            "config: {batch_size: 50, max_delay: 7}\n",
            {"batch_size": 10, "max_delay_ms": 1.5},
            {"batch_size": 10, "max_delay_ms": 1.5},
        ),
        (
            "config: {batch_size: 50}\n",
            {"max_delay_ms": 0.0},
            {"batch_size": 50, "max_delay_ms": 0.0},
        ),
    ],
)
def test_command_line_over_file_over_default(file_config, flags, want):
    topo = load_topology_text(PIPE.replace("name: pipe\n", "name: pipe\n" + file_config), "pipe")
    typhoon_cli.apply_run_settings(topo, flags.get("batch_size"), flags.get("max_delay_ms"))
    assert {
        k: v for k, v in topo.config.items() if k in ("batch_size", "max_delay", "max_delay_ms")
    } == want
    # the runners read what the CLI left, with their defaults only where nothing is said
    from typhoon.topology.batching import Batching

    got = Batching.of(topo.config, Batching(99, 9.5))
    assert got.batch_size == want.get("batch_size", 99)
    assert got.max_delay_ms == want.get("max_delay_ms", want.get("max_delay", 9.5))


@pytest.mark.parametrize("flags", [{"batch_size": 0}, {"max_delay_ms": -1.0}])
def test_bad_run_settings_are_usage_errors(flags):
    topo = load_topology_text(PIPE, "pipe")
    with pytest.raises(typhoon_cli.UsageError):
        typhoon_cli.apply_run_settings(topo, flags.get("batch_size"), flags.get("max_delay_ms"))
