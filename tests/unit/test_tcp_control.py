"""The control endpoint of a tcp run (typhoon/tcp_control.py) and how the CLI finds it
(typhoon/tcp_jobs.py, typhoon_cli/ctl_verb.py): request validation, the token, what tcp
refuses, and ``typhoon unchain``/``insert`` through the real HTTP server and the CLI entry
point against the real executor (typhoon/tcp_reconfig.py) on a fake tcp cluster whose
workers ack every control tuple (the real processes: tests/runtime/test_unchain_tcp.py)."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_tcp_reconfig import FakeCluster
from test_tcp_unchain import chained

import typhoon_cli
from typhoon.private_files import SecretFileError, write_private
from typhoon.reconfig import Scale
from typhoon.tcp_control import ControlApi, parse_endpoint, serving
from typhoon.tcp_jobs import ENV, JobNameTaken, TcpJob, entry_path, lookup, register
from typhoon.tcp_options import RunOptions
from typhoon.tcp_reconfig import Rescaler

TOKEN = "s3cret-token"
AUTH = {"X-Typhoon-Token": TOKEN}


@pytest.fixture(autouse=True)
def jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Entries in a directory of the test's own; no controller where the CLI would look."""
    monkeypatch.setenv(ENV, str(tmp_path / "jobs"))
    for var in ("TYPHOON_CONTROLLER", "TYPHOON_TOKEN", "TYPHOON_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/typhoon/client.ini
    return tmp_path / "jobs"


class Loop:
    """The run loop's part: turns the rescaler until stopped (TcpCluster.wait does)."""

    def __init__(self, rescaler: Rescaler) -> None:
        self.rescaler = rescaler
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.01):
            self.rescaler.turn(0.0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


@pytest.fixture
def api() -> Iterator[tuple[ControlApi, FakeCluster]]:
    c = FakeCluster(chained())
    rescaler = Rescaler(c)
    loop = Loop(rescaler)
    try:
        yield ControlApi("ch", TOKEN, rescaler, settle_s=5.0), c
    finally:
        loop.close()


def post(api: ControlApi, what: str, body: Any, headers: dict | None = None) -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return api.handle("POST", f"/typhoon/apps/ch/{what}", AUTH if headers is None else headers, raw)


# ----- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers, status, reason",
    [
        ({}, 401, "missing_token"),
        ({"X-Typhoon-Token": "nope"}, 403, "wrong_token"),
        ({"Authorization": "Bearer nope"}, 403, "wrong_token"),
        ({"Authorization": "Basic " + TOKEN}, 401, "missing_token"),
    ],
)
def test_every_request_needs_the_runs_token(api, headers, status, reason):
    a, c = api
    for method, path in (("POST", "/typhoon/apps/ch/unchain"), ("GET", "/nothing")):
        got, doc = a.handle(method, path, headers, b'{"node": "upper"}')
        assert got == status and doc["error"]
    assert a.rejected == {reason: 2} and a.accepted == 0 and not a.rescaler.records


def test_the_bearer_form_of_the_token_is_accepted_too(api):
    a, c = api
    status, doc = post(a, "unchain", {"node": "upper"}, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 202 and doc["request"] == "unchain upper", doc


@pytest.mark.parametrize(
    "what, body, status, words",
    [
        ("unchain", b"{not json", 400, "not valid JSON"),
        ("unchain", b"\xff\xfe", 400, "not valid JSON"),
        ("unchain", [1, 2], 400, "JSON object"),
        ("unchain", {"node": "upper", "wrker": 3}, 400, "unknown field(s) wrker"),
        ("unchain", {"node": "upper", "worker": "3"}, 400, "'worker'"),
        ("unchain", {"node": "upper", "worker": 0}, 400, "1 or more"),
        ("unchain", {}, 400, "'node'"),
        ("scale", {"node": "count", "parallelism": 0}, 400, "parallelism"),
        ("scale", {"node": "count", "parallelism": True}, 400, "parallelism"),
    ],
)
def test_a_malformed_body_is_a_400_with_one_sentence_and_nothing_queued(
    api, what, body, status, words
):
    a, c = api
    got, doc = post(a, what, body)
    assert got == status and words in doc["error"], doc
    assert not a.rescaler.records and sum(a.rejected.values()) == 1


@pytest.mark.parametrize(
    "what, body, status, words",
    [
        ("unchain", {"node": "nosuch"}, 404, "has no node 'nosuch'"),
        ("unchain", {"node": "upper", "worker": 99}, 404, "worker 99 is not a worker of 'upper'"),
        ("unchain", {"node": "count"}, 409, "runs in no chain process"),
        ("chain", {"node": "upper"}, 409, "chained edges of 'upper' are"),
        (
            "insert",
            {"node": "x", "operator": "identity", "from": "split", "to": "upper"},
            409,
            "needs --transport sdn",
        ),  # fmt: skip
        ("remove", {"node": "upper"}, 409, "needs --transport sdn"),
        ("move", {"worker": 3, "host": "h1"}, 409, "needs --transport sdn"),
        ("route", {"stream": "upper->count", "policy": "shuffle"}, 409, "needs --transport sdn"),
        ("swap", {"node": "count", "operator": "identity"}, 409, "needs --transport sdn"),
    ],
)
def test_what_the_run_cannot_do_is_refused_by_the_run_loop_in_one_sentence(
    api, what, body, status, words
):
    a, c = api
    got, doc = post(a, what, body)
    assert got == status and words in doc["error"], doc
    assert "\n" not in doc["error"]
    (rec,) = a.rescaler.records
    assert rec.state == "refused" and a.rejected == {"refused": 1}
    assert c.physical.unchained == []  # nothing changed


@pytest.mark.parametrize(
    "method, path, status, words",
    [
        ("GET", "/typhoon/apps/ch", 404, "needs --transport sdn"),
        ("DELETE", "/typhoon/apps/ch", 404, "needs --transport sdn"),
        ("POST", "/typhoon/apps/ch/control", 404, "'control' needs --transport sdn"),
        ("GET", "/typhoon/apps", 404, "needs --transport sdn"),
        ("GET", "/etc/passwd", 404, "needs --transport sdn"),
        ("GET", "/typhoon/apps/other/reconfig", 404, "no application named 'other'"),
        ("POST", "/typhoon/apps/../unchain", 404, "no application named '..'"),
        ("GET", "/typhoon/apps/ch/unchain", 405, "use POST"),
        ("POST", "/typhoon/apps/ch/reconfig", 405, "use GET"),
        ("GET", "/typhoon/apps/ch/reconfig", 404, "has not been reconfigured"),
    ],
)
def test_unknown_paths_apps_and_methods_are_4xx(api, method, path, status, words):
    a, c = api
    got, doc = a.handle(method, path, AUTH, b"")
    assert got == status and words in doc["error"], doc
    assert sum(a.rejected.values()) == 1 and not a.rescaler.records


def test_one_update_runs_at_a_time_as_on_sdn():
    rescaler = Rescaler(FakeCluster(chained()))  # no run loop turns it: the scale stays queued
    a = ControlApi("ch", TOKEN, rescaler, settle_s=0.1)
    rescaler.request(Scale("count", 3))
    status, doc = post(a, "unchain", {"node": "upper"})
    assert status == 409 and "reconfiguration 1 (scale count to 3)" in doc["error"], doc
    assert a.rejected == {"busy": 1} and len(rescaler.records) == 1


def test_a_request_the_run_loop_has_not_reached_yet_is_202_running():
    rescaler = Rescaler(FakeCluster(chained()))
    a = ControlApi("ch", TOKEN, rescaler, settle_s=0.1)
    status, doc = post(a, "unchain", {"node": "upper"})
    assert status == 202 and doc["state"] == "running" and doc["steps"] == [], doc
    status, doc = a.handle("GET", "/typhoon/apps/ch/reconfig", AUTH, b"")
    assert status == 200 and doc["state"] == "running" and doc["id"] == 1
    ended = ControlApi("ch", TOKEN, Rescaler(FakeCluster(chained())), settle_s=5.0)
    ended.closing.set()  # the run ended: a request waiting for the loop is told so at once
    status, doc = post(ended, "unchain", {"node": "upper"})
    assert status == 409 and "ended before it ran unchain upper" in doc["error"], doc


def test_an_accepted_update_reads_back_as_on_sdn(api):
    a, c = api
    first = c.physical.of_node("upper")[0].worker_id
    status, doc = post(a, "unchain", {"node": "upper", "worker": first})
    assert status == 202, doc
    assert {"id", "app", "request", "state", "error", "seconds", "added", "removed", "steps",
            "rollback", "version"} <= set(doc)  # fmt: skip
    assert doc["app"] == "ch" and doc["state"] in ("running", "done")
    for _ in range(500):
        status, doc = a.handle("GET", "/typhoon/apps/ch/reconfig", AUTH, b"")
        if doc["state"] != "running":
            break
        threading.Event().wait(0.01)
    assert status == 200 and doc["state"] == "done", doc
    assert [s["state"] for s in doc["steps"]] == ["done"] * len(doc["steps"]) and doc["steps"]
    assert c.physical.unchained == [first]
    assert a.accepted == 2 and a.rejected == {}


# ----- the registry --------------------------------------------------------------------------


def test_an_entry_is_private_and_found_by_name_and_a_stale_one_is_dropped(jobs):
    job = TcpJob("wc", "http://127.0.0.1:1234", "t", os.getpid())
    path = register(job)
    assert path == entry_path("wc") and oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(jobs.stat().st_mode & 0o777) == "0o700"
    assert lookup("wc") == job and lookup("other") is None
    with pytest.raises(JobNameTaken, match="already running"):
        register(TcpJob("wc", "http://127.0.0.1:99", "u", 1))  # pid 1 is alive, not ours
    dead = TcpJob("gone", "http://127.0.0.1:1", "t", 2**22 + 12345)
    write_private(jobs / "gone.json", json.dumps(dead.__dict__))
    assert lookup("gone") is None and not (jobs / "gone.json").exists()
    for bad in ("../x", "a/b", "..", "", "x" * 101):
        assert entry_path(bad) is None and lookup(bad) is None


def test_an_entry_others_may_read_is_refused(jobs):
    register(TcpJob("wc", "http://127.0.0.1:1234", "t", os.getpid()))
    os.chmod(jobs / "wc.json", 0o644)
    with pytest.raises(SecretFileError, match="readable by others"):
        lookup("wc")


def test_control_is_an_option_of_tcp_runs_only(capsys):
    forward = str(Path(__file__).resolve().parents[2] / "topologies" / "forward.yaml")
    code = typhoon_cli.main(["run", forward, "--transport", "sdn", "--control", "127.0.0.1:0"])
    assert code == 2 and "--control is for tcp runs" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["127.0.0.1", ":80", "h:-1", "h:70000", "::1:80", "h:x"])
def test_a_malformed_control_address_says_its_form(text):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_endpoint(text)
    with pytest.raises(typhoon_cli.UsageError, match="HOST:PORT"):
        typhoon_cli.control_endpoint(text)
    assert typhoon_cli.control_endpoint("off") is None
    assert typhoon_cli.control_endpoint(None) == "127.0.0.1:0"


# ----- over HTTP and through the CLI ---------------------------------------------------------


class Run:
    """What ``serving`` needs of a TcpCluster: a fake one whose rescaler a loop turns."""

    def __init__(self) -> None:
        self.c = FakeCluster(chained())
        self.topology = self.c.topology
        self.options = RunOptions(live=False)
        self.rescaler = Rescaler(self.c)


@pytest.fixture
def served() -> Iterator[tuple[Run, Any]]:
    run = Run()
    loop = Loop(run.rescaler)
    out = io.StringIO()
    try:
        with serving(run, "127.0.0.1:0", out) as endpoint:
            assert endpoint is not None and endpoint.url.startswith("http://127.0.0.1:")
            yield run, endpoint
    finally:
        loop.close()
    assert lookup("ch") is None  # unregistered when the run ends


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = typhoon_cli.main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def test_typhoon_unchain_and_chain_reach_the_tcp_run_by_its_name(served, capsys):
    run, endpoint = served
    upper = [w.worker_id for w in run.c.physical.of_node("upper")]
    code, out, err = cli(capsys, "unchain", "ch", "upper")
    assert code == 0, err
    assert "reconfiguration 1 of ch: unchain upper" in out and "done in" in out
    assert run.c.physical.unchained == upper
    code, out, err = cli(capsys, "chain", "ch", "upper", "--worker", str(upper[1]), "--json")
    assert code == 0, err
    doc = json.loads(out)["result"]
    assert doc["state"] == "done" and doc["request"] == f"chain again upper at {upper[1]}"
    assert run.c.physical.unchained == [upper[0]]
    code, out, err = cli(capsys, "reconfig", "ch")
    assert code == 0 and "reconfiguration 2 of ch" in out, err
    assert endpoint.api.summary() == {"accepted": 3, "rejected": {}}


def test_what_tcp_cannot_do_exits_2_with_one_line_naming_the_sdn_transport(served, capsys):
    run, endpoint = served
    code, out, err = cli(
        capsys, "insert", "ch", "x", "identity", "--from", "split", "--to", "upper"
    )
    assert code == 2 and err.count("\n") == 1 and "needs --transport sdn" in err, err
    code, out, err = cli(capsys, "unchain", "ch", "nosuch")
    assert code == 2 and "has no node 'nosuch'" in err, err
    code, out, err = cli(capsys, "status", "ch")
    assert code == 2 and "needs --transport sdn" in err, err
    assert endpoint.api.rejected == {"refused": 2, "not_found": 1}


def test_the_endpoint_counts_bad_http_and_goes_on(served, capsys):
    run, endpoint = served
    host, port = endpoint.server.server_address[:2]
    for raw in (
        b"GARBAGE\r\n\r\n",
        b"POST /typhoon/apps/ch/unchain HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n",
        b"POST /typhoon/apps/ch/unchain HTTP/1.1\r\nContent-Length: -4\r\n\r\n",
    ):
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(raw)
            answer = b"".join(iter(lambda s=s: s.recv(4096), b""))
            # a request line http.server cannot read gets a bare (HTTP/0.9) answer
            assert b'{"error": ' in answer and b"Traceback" not in answer, answer
    req = urllib.request.Request(f"{endpoint.url}/typhoon/apps/ch/reconfig")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 401
    assert endpoint.api.rejected == {"malformed": 2, "too_large": 1, "missing_token": 1}
    code, out, err = cli(capsys, "unchain", "ch", "upper")  # still serving
    assert code == 0, err


def test_a_second_run_of_a_name_gets_no_endpoint_and_says_why(served):
    other = Run()
    out = io.StringIO()
    with serving(other, "127.0.0.1:0", out) as endpoint:
        assert endpoint is None
    assert "already running" in out.getvalue() and lookup("ch") is not None


def test_without_a_tcp_run_or_a_controller_the_error_says_both(capsys, monkeypatch):
    monkeypatch.setenv("TYPHOON_CONTROLLER", "http://127.0.0.1:1")  # nothing listens there
    code, out, err = cli(capsys, "unchain", "ch", "upper")
    assert code == 1 and "no tcp run named 'ch' is running for this user" in err, err
    assert err.count("\n") == 1


def test_an_endpoint_beyond_loopback_warns_and_one_that_cannot_bind_leaves_none():
    out = io.StringIO()
    with serving(Run(), "0.0.0.0:0", out) as endpoint:
        assert endpoint is not None and not endpoint.loopback
        assert endpoint.url.startswith("http://127.0.0.1:")  # where the CLI reaches it
    assert "plain HTTP beyond this host" in out.getvalue()
    out = io.StringIO()
    with serving(Run(), "256.0.0.1:0", out) as endpoint:
        assert endpoint is None
    assert "no control endpoint for 'ch' at 256.0.0.1:0" in out.getvalue()
    assert lookup("ch") is None
