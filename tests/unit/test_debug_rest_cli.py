"""The debugger's REST routes (called as a WSGI application) and the CLI on top of them."""

from __future__ import annotations

import argparse
import io
import json
import logging

import pytest
from webob import Request

from controller.debugging.debug_rest import DebugRest
from controller.debugging.debugger import DebugError
from controller.framework.ryu_compat import WSGIApplication
from typhoon.client import ApiCallError
from typhoon.debug.spec import KEY_HEADER
from typhoon_cli import debug as cli

TOKEN = "secret"


class FakeDebugger:
    """Stands in for the app: records calls, answers like it."""

    logger = logging.getLogger("fake")

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.state = "live"
        self.pages: list[dict] = []
        self.rate: int | str = 200
        self.stats: dict = {"frames": 9, "tuples": 3}

    def attach(self, name, request):
        self.calls.append(("attach", name, request))
        if request.get("worker") == "nope":
            raise DebugError(404, "no node named 'nope'")
        return self.status(name, "s1")

    def list_sessions(self, name):
        return [self.status(name, "s1")]

    def status(self, name, sid):
        return {
            "session": sid,
            "app": name,
            "worker": 2,
            "direction": "out",
            "filter": "",
            "host": "h1",
            "port": 65000,
            "state": self.state,
            "reason": "",
            "received": 3,
            "mirrored_rules": 4,
            "rate": self.rate,
            "sample": 100.0,
            "stats": dict(self.stats),
        }

    session_status = status

    def detach(self, name, sid):
        self.calls.append(("detach", name, sid))
        return self.status(name, sid)

    def read(self, name, sid, after, limit):
        self.calls.append(("read", after, limit))
        if self.pages:
            return self.pages.pop(0)
        raise KeyboardInterrupt  # the user presses Ctrl-C once the pages are printed

    def receive(self, sid, key, body):
        if key != "k":
            raise DebugError(403, "wrong session key")
        self.calls.append(("receive", sid, len(body["records"])))
        return {"ok": True}


@pytest.fixture
def api():
    debugger = FakeDebugger()
    app = WSGIApplication()
    app.register(DebugRest, {"debugger": debugger, "core": debugger, "token": TOKEN})

    def call(method, path, body=None, token=TOKEN, headers=None):
        req = Request.blank("/typhoon" + path, method=method)
        if body is not None:
            req.body = json.dumps(body).encode()
        if token:
            req.headers["X-Typhoon-Token"] = token
        for k, v in (headers or {}).items():
            req.headers[k] = v
        resp = req.get_response(app)
        return resp.status_int, json.loads(resp.body)

    return debugger, call


def test_routes_and_tokens(api):
    debugger, call = api
    assert call("POST", "/apps/wc/debug", {"worker": "split[0]"})[0] == 201
    assert call("POST", "/apps/wc/debug", {"worker": "split[0]"}, token="")[0] == 401
    assert call("POST", "/apps/wc/debug", {"worker": "nope"}) == (
        404,
        {"error": "no node named 'nope'"},
    )
    assert call("GET", "/apps/wc/debug", token="")[0] == 200
    assert call("GET", "/apps/wc/debug/s1", token="")[1]["state"] == "live"
    assert call("GET", "/apps/wc/debug/s1/tuples?after=5", token="")[0] == 401  # app data
    with pytest.raises(KeyboardInterrupt):
        call("GET", "/apps/wc/debug/s1/tuples?after=5&limit=99999")
    assert debugger.calls[-1] == ("read", 5, 10000)  # limit capped
    assert call("GET", "/apps/wc/debug/s1/tuples?after=x")[0] == 400
    assert call("DELETE", "/apps/wc/debug/s1", token="wrong")[0] == 403
    assert call("DELETE", "/apps/wc/debug/s1")[0] == 200
    # debug workers authenticate with their session key, not the token
    body = {"records": [{"x": 1}], "stats": {}}
    assert call("POST", "/debug/sessions/s1/records", body, token="", headers={KEY_HEADER: "k"})
    assert call("POST", "/debug/sessions/s1/records", body, token="")[0] == 403
    assert debugger.calls[-1] == ("receive", "s1", 1)


def test_table_and_json_lines():
    record = {
        "n": 1,
        "time": 0.0,
        "src_label": "split[0]",
        "dst_label": "count[2]",
        "stream": 2,
        "fields": {"word": "alpha"},
        "values": ["alpha", 3],
    }
    line = cli.format_record(record, "table")
    assert "split[0] -> count[2]" in line and "s2" in line and 'word="alpha" 3' in line
    assert json.loads(cli.format_record(record, "json")) == record
    assert "raw frame" in cli.format_record({"time": 0, "raw": "Ether / IP"}, "table")


def args(**kw) -> argparse.Namespace:
    base = dict(
        name="wc",
        worker="split[0]",
        direction="out",
        filter="word=a",
        sample=None,
        rate=None,
        operator="",
        last=50,
        count=None,
        poll=0.0,
        format="json",
        controller="http://x",
        token=TOKEN,
        config=None,
    )
    return argparse.Namespace(**{**base, **kw})


@pytest.fixture
def wired(api, monkeypatch):
    """The CLI's HTTP client calling the WSGI application directly."""
    debugger, call = api

    def fake_call(self, method, path, body=None):
        status, reply = call(method, path, body, token=self.token)
        if status >= 400:
            raise ApiCallError(status, reply["error"])
        return reply

    monkeypatch.setattr(cli.Client, "call", fake_call)
    return debugger


def page(n: int, state: str = "live") -> dict:
    return {
        "records": [{"n": n, "time": 0, "fields": {"word": "a"}, "values": ["a"]}],
        "next": n,
        "skipped": 0,
        "state": state,
        "reason": "",
    }


def test_attach_prints_until_ctrl_c_then_detaches(wired):
    wired.pages = [page(1), page(2)]
    out, err = io.StringIO(), io.StringIO()
    assert cli.cmd_attach(args(), out, err) == 0
    assert [json.loads(line)["n"] for line in out.getvalue().splitlines()] == [1, 2]
    assert wired.calls[0] == ("attach", "wc", {"worker": "split[0]", "direction": "out",
                                               "filter": "word=a", "last": 50})  # fmt: skip
    assert ("read", 1, 1000) in wired.calls and wired.calls[-1] == ("detach", "wc", "s1")
    assert "4 mirrored rules" in err.getvalue() and "detached session s1" in err.getvalue()


def test_attach_count_and_errors(wired):
    wired.pages = [page(1), page(2)]
    out, err = io.StringIO(), io.StringIO()
    assert cli.cmd_attach(args(count=1), out, err) == 0
    assert len(out.getvalue().splitlines()) == 1 and wired.calls[-1][0] == "detach"
    assert cli.cmd_attach(args(worker="nope"), out, err) == cli.EXIT_USAGE
    assert "no node named 'nope'" in err.getvalue()
    wired.pages = [page(1, state="ended")]
    assert cli.cmd_attach(args(), io.StringIO(), err) == cli.EXIT_FAILED


def test_attach_sends_the_operator_and_shows_its_statistics(wired):
    wired.pages = [page(1)]
    err = io.StringIO()
    assert cli.cmd_attach(args(count=1, operator="m:Tally"), io.StringIO(), err) == 0
    assert wired.calls[0][2]["operator"] == "m:Tally"
    summary = cli._summary({"op_tuples": 5, "op_emitted": 4, "op_errors": 1, "op_error": "E: x"})
    assert summary == "op_tuples 5, op_emitted 4, op_errors 1; the operator's last error: E: x"


def test_the_operator_option_parses():
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    a = parser.parse_args(["debug", "attach", "wc", "split[0]", "--operator", "m:C"])
    assert a.operator == "m:C"
    assert parser.parse_args(["debug", "attach", "wc", "split[0]"]).operator == ""


def test_attach_says_the_switch_samples_and_how_much_it_left_out(wired):
    wired.pages = [page(1)]
    wired.stats = {"frames": 9, "switch_copied": 9, "switch_sampled": 991, "switch_dropped": 2}
    err = io.StringIO()
    assert cli.cmd_attach(args(count=1), io.StringIO(), err) == 0
    text = err.getvalue()
    assert "SAMPLED: the switch copies at most 200 frames/s" in text, text
    assert "--rate all copies every frame" in text
    assert "switch copied 9 frames, left out 991 by sampling (meter 200/s), dropped 2" in text


def test_attach_with_rate_all_asks_for_every_frame_and_says_so(wired):
    wired.pages = [page(1)]
    wired.rate = "all"
    wired.stats = {"frames": 9, "switch_copied": 9, "switch_sampled": 0, "switch_dropped": 0}
    err = io.StringIO()
    assert cli.cmd_attach(args(count=1, rate="all"), io.StringIO(), err) == 0
    assert wired.calls[0][2]["rate"] == "all"
    text = err.getvalue()
    assert "the switch copies every frame (no meter)" in text and "SAMPLED" not in text
    assert "switch copied 9 frames, none left out (no meter), dropped 0" in text


def test_the_rate_option_takes_a_number_or_all():
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    base = ["debug", "attach", "wc", "split[0]", "--rate"]
    assert parser.parse_args([*base, "all"]).rate == "all"
    assert parser.parse_args([*base, "ALL"]).rate == "all"
    assert parser.parse_args([*base, "50"]).rate == 50
    for bad in ("0", "fast", "-3"):
        with pytest.raises(SystemExit):
            parser.parse_args([*base, bad])


def test_sampling_notes_while_following():
    assert cli.sampling_note(200, 50.0) == (
        "SAMPLED: the switch copies at most 200 frames/s to the debugger and never copies "
        "the rest (--rate all copies every frame); 50 % of the matching tuples are shown"
    )
    assert "did not say" in cli.sampling_note(None)
    assert cli.switch_counts({}, 200) == ""
    watch = cli.SamplingWatch(200)
    assert watch.note({"switch_copied": 5, "switch_sampled": 0, "switch_dropped": 0}) == ""
    note = watch.note({"switch_copied": 10, "switch_sampled": 40, "switch_dropped": 0})
    assert note == "(so far: the switch's meter (200/s) left out 40 frames; 10 copied)"
    assert watch.note({"switch_copied": 12, "switch_sampled": 40}) == ""  # nothing new
    note = watch.note({"switch_copied": 20, "switch_sampled": 40, "switch_dropped": 3})
    assert note.endswith("the debug port dropped 3 copies; 20 copied)")
