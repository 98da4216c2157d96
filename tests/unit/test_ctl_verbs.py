"""CLI verbs beyond the reconfiguration ones: the apps' reports, ``--json`` on every
verb (errors included), ``status --watch``, the REST client's retries, ``--version``
and the JSON log format.  The controller is a small WSGI stand-in that answers like
the apps' REST routes; tests/unit/test_controller_rest.py drives the real routes."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

import typhoon_cli as cli
from typhoon import logs
from typhoon.client import ApiCallError, Client, Endpoint
from typhoon_cli import ctl

INCIDENT = {
    "app": "wc",
    "worker": 4,
    "node": "count",
    "reason": "port link_down",
    "state": "rejoined",
    "reroute_ms": 0.8,
    "rejoined_ms": 412.5,
    "replacement": 9,
    "rollback": "region",
    "restore_epoch": 3,
    "rolled_back": [1, 2],
    "replayed": {"1": 120},
    "sinks": ["count"],
    "sink_rate_before": 16000.0,
    "sink_rate_lowest": 4100.5,
    "back_at_80_ms": 1800.0,
}
STATUS = {
    "name": "wc",
    "app_id": 7,
    "version": 2,
    "nodes": {"count": {"operator": "count_by_key", "args": {}, "parallelism": 1}},
    "streams": [],
    "workers": [
        {"worker": 9, "node": "count", "host": "h1", "port": 100, "state": "running",
         "role": "active", "rate": {"in": 10.0, "out": 0.0}},
    ],
}  # fmt: skip


class Controller:
    """Answers GETs from ``docs``; ``fail`` status codes are served first, one each."""

    def __init__(self) -> None:
        self.docs = {
            "/typhoon/faults": [INCIDENT],
            "/typhoon/apps/wc/faults": [INCIDENT],
            "/typhoon/lb": {"wc": {"stream 1": {"configured": [1, 1], "achieved": [0.5, 0.5]}}},
            "/typhoon/apps/wc": STATUS,
        }
        self.fail: list[int] = []
        self.seen: list[tuple[str, str]] = []

    def __call__(self, environ, start_response) -> Iterator[bytes]:
        method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
        self.seen.append((method, path))
        if self.fail:
            code = self.fail.pop(0)
            start_response(f"{code} Unavailable", [("Content-Type", "application/json")])
            return [json.dumps({"error": "starting up"}).encode()]
        doc = self.docs.get(path if method == "GET" else f"{method} {path}")
        if doc is not None:
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps(doc() if callable(doc) else doc).encode()]
        start_response("404 Not Found", [("Content-Type", "application/json")])
        return [json.dumps({"error": f"no route {path}"}).encode()]


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def controller(monkeypatch, tmp_path):
    c = Controller()
    httpd = make_server("127.0.0.1", 0, c, handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    for var in ("TYPHOON_CONTROLLER", "TYPHOON_TOKEN", "TYPHOON_CONFIG", logs.ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    c.url = f"http://127.0.0.1:{httpd.server_port}"
    yield c
    httpd.shutdown()


def typhoon(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_faults_verb_prints_incidents_for_all_or_one_app(controller, capsys):
    code, out, err = typhoon(capsys, "faults", "--controller", controller.url)
    assert code == 0 and err == ""
    assert "count" in out and "rejoined" in out and "port link_down" in out
    assert "rerouted 0.8 ms, rejoined 412.5 ms" in out and "replaced by worker 9" in out
    assert "region rollback of workers [1, 2] to checkpoint 3, 120 tuples replayed" in out
    assert "sinks count: back at 80% after 1800 ms (16000/s before, lowest 4100/s)" in out
    code, out, _ = typhoon(capsys, "faults", "wc", "--controller", controller.url, "--json")
    assert code == 0 and json.loads(out) == {"ok": True, "result": [INCIDENT]}
    assert controller.seen[-1] == ("GET", "/typhoon/apps/wc/faults")


def test_report_of_an_app_that_is_not_loaded_names_the_app(controller, capsys):
    code, _, err = typhoon(capsys, "autoscaler", "--controller", controller.url)
    assert code == 2
    assert err == (
        "error: the controller has no autoscaler report: is apps/autoscaler.py loaded?\n"
    )
    code, out, _ = typhoon(capsys, "lb", "--controller", controller.url)
    assert code == 0 and "configured:" in out and "achieved:" in out


def test_json_errors_are_one_document_on_stdout(controller, capsys):
    code, out, err = typhoon(capsys, "status", "nope", "--controller", controller.url, "--json")
    assert code == 2 and err == ""
    assert json.loads(out) == {"ok": False, "error": "no route /typhoon/apps/nope", "exit": 2}


def test_status_watch_shows_the_status_count_times(controller, capsys):
    code, out, _ = typhoon(
        capsys, "status", "wc", "--watch", "0.1", "--count", "3", "--controller", controller.url
    )
    assert code == 0
    assert out.count("wc  app 0x0007  physical version 2") == 3
    code, _, err = typhoon(capsys, "status", "wc", "--watch", "0", "--controller", controller.url)
    assert code == 2 and "at least 0.1 s" in err


def test_watch_on_a_terminal_redraws_in_place():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    docs = iter([1, 2])
    ctl.watch(lambda: next(docs), lambda d, o: print(f"value {d}", file=o), 0.01, out, 2)
    text = out.getvalue()
    assert "value 1" in text and "value 2" in text
    assert "\x1b[" in text  # cursor movement: the block was redrawn, not appended


def test_client_retries_transient_answers_with_backoff(controller):
    client = Client(Endpoint(controller.url, ""), backoff=0.01)
    controller.fail = [503, 502]
    assert client.call("GET", "/faults") == [INCIDENT]
    assert client.attempts == 3
    controller.fail = [503] * 5
    with pytest.raises(ApiCallError) as e:
        client.call("GET", "/faults")
    assert e.value.status == 503 and e.value.message == "starting up"
    assert client.attempts == 3 + 4  # one try and three retries


def test_client_does_not_repeat_a_change_that_may_have_arrived(controller):
    client = Client(Endpoint(controller.url, ""), backoff=0.01)
    controller.fail = [503]
    with pytest.raises(ApiCallError) as e:
        client.call("POST", "/apps", {"topology": ""})
    assert e.value.status == 503 and client.attempts == 1


def test_client_retries_a_refused_connection_then_says_how_to_set_the_controller():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Client(Endpoint(f"http://127.0.0.1:{port}", ""), backoff=0.01)
    with pytest.raises(ApiCallError) as e:
        client.call("DELETE", "/apps/x")  # refused: surely not sent, so a change is retried
    assert client.attempts == 4 and e.value.status == 0
    assert "$TYPHOON_CONTROLLER" in e.value.message


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"typhoon {cli.__version__}"


def test_json_log_lines_and_a_bad_format(monkeypatch):
    record = logging.LogRecord("typhoon.x", logging.WARNING, __file__, 1, "lost %d", (3,), None)
    doc = json.loads(logs.JsonFormatter().format(record))
    assert doc["level"] == "WARNING" and doc["logger"] == "typhoon.x" and doc["message"] == "lost 3"
    monkeypatch.setenv(logs.ENV, "xml")
    with pytest.raises(ValueError, match="one of text, json"):
        logs.log_format()
    assert logs.log_format("json") == "json"


def test_locality_verb_starts_a_run_waits_for_it_and_prints_it(controller, capsys):
    phases = iter(["routing", "measuring", "done"])
    run = {"phase": "collecting", "reason": "", "plan": {}, "crossing": {}}
    controller.docs["POST /typhoon/apps/wc/locality"] = run
    controller.docs["/typhoon/apps/wc/locality"] = lambda: {
        **run,
        "phase": next(phases, "done"),
        "crossing": {"before": {"fraction": 0.66}, "after": {"fraction": 0.2}},
    }
    code, out, _ = typhoon(capsys, "locality", "wc", "--controller", controller.url)
    assert code == 0
    assert controller.seen[0] == ("POST", "/typhoon/apps/wc/locality")
    assert [m for m, _ in controller.seen].count("GET") == 3  # until the run is done
    assert "phase: done" in out and "fraction: 0.2" in out


def test_locality_verb_reports_a_failed_run_and_a_missing_app(controller, capsys):
    controller.docs["/typhoon/apps/wc/locality"] = {"phase": "failed", "reason": "no pairs"}
    code, _, err = typhoon(capsys, "locality", "wc", "--show", "--controller", controller.url)
    assert code == 1 and "locality run failed: no pairs" in err
    code, _, err = typhoon(capsys, "locality", "x", "--controller", controller.url)
    assert code == 2 and "is apps/locality_router.py loaded?" in err


def test_status_shows_each_workers_watermark(controller, capsys):
    workers = [
        {**STATUS["workers"][0], "watermark": 1500, "watermark_closed": 0},
        {**STATUS["workers"][0], "worker": 10, "watermark": None, "watermark_closed": 1},
        {**STATUS["workers"][0], "worker": 11, "watermark": None, "watermark_closed": 0},
    ]
    controller.docs["/typhoon/apps/wc"] = {**STATUS, "workers": workers}
    code, out, _ = typhoon(capsys, "status", "wc", "--controller", controller.url)
    assert code == 0
    lines = out.splitlines()
    assert lines[2].endswith("watermark")
    assert [line.split()[-1] for line in lines[3:6]] == ["1500", "+inf", "-"]
