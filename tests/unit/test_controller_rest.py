"""The controller's REST API in-process (Ryu's WSGI app, a fake core) and the CLI verbs on it.

Every changing verb refuses a missing or wrong token and malformed input with
a 4xx and a sentence; random JSON (hypothesis) never gets a 5xx.  The CLI is
run against the same app served by wsgiref on a local port.
"""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webob import Request

import typhoon_cli as cli
from controller.framework.ryu_compat import WSGIApplication
from controller.reconfigure import Registry
from controller.recovery.fault_detector import FaultSettings, no_recovery
from controller.rest import MAX_BODY, TyphoonRest
from controller.rules.view import ClusterView
from typhoon.cluster import Cluster, HostInfo
from typhoon.coordinator import SqliteCoordinator
from typhoon.manager import Manager
from typhoon.topology import load_topology_text

TOKEN = "s3cret"
FORWARD = """
name: fwd
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: sink
    operator: sequence_check
streams:
  - {from: source, to: sink, grouping: shuffle}
"""
VERBS = ["scale", "route", "swap", "insert", "remove", "move"]
GOOD = {
    "scale": {"node": "sink", "parallelism": 2},
    "route": {"stream": 1, "policy": "fields", "fields": ["seq"]},
    "swap": {"node": "sink", "operator": "sequence_check", "args": {"ts": "ts"}},
    "insert": {"node": "mid", "operator": "identity", "from": "source", "to": "sink"},
    "remove": {"node": "sink"},  # refused by the planner (a sink has no output)
    "move": {"worker": 2, "host": "h1"},  # the sink, from h2
}


class FakeCore:
    """What the REST layer uses of the core; reconfigurations are planned, not run."""

    def __init__(self, coordinator: SqliteCoordinator) -> None:
        self.coordinator = coordinator
        self.manager = Manager(coordinator)
        self.reconfigs = Registry()
        self.rates: dict = {}
        self.acks: list = []
        self.responses: dict = {}
        self.channel = SimpleNamespace(next_request_id=itertools.count(1).__next__)
        self.logger = logging.getLogger("fake-core")
        self.sent: list = []
        self.finish_at_once = False
        self.fault_settings = FaultSettings()

    @property
    def view(self) -> ClusterView:
        return ClusterView.read(self.coordinator)

    def recovery_refusal(self, topology):
        return no_recovery(topology, self.fault_settings)

    def send_control(self, app, worker_ids, ct):
        self.sent.append((app, list(worker_ids), ct))
        return len(list(worker_ids))

    def reconfigure(self, app, request):
        record = self.reconfigs.begin(app, lambda: self.manager.plan(app, request))
        if self.finish_at_once:
            for s in record.steps:
                s.state = "done"
            record.state, record.finished = "done", time.time()
        return record


@pytest.fixture
def core(tmp_path: Path):
    c = SqliteCoordinator(tmp_path / "coord.db")
    c.put_cluster(Cluster({h: HostInfo(h, f"br{h}", i + 1) for i, h in enumerate(["h1", "h2"])}))
    m = Manager(c)
    m.submit(load_topology_text(FORWARD))
    c.put_app_state("fwd", {"active": True})
    yield FakeCore(c)
    c.close()


@pytest.fixture
def app(core):
    wsgi = WSGIApplication()
    wsgi.register(TyphoonRest, {"core": core, "token": TOKEN})
    return wsgi


def call(app, method, path, body=None, token=TOKEN, raw=None, ctype="application/json"):
    req = Request.blank("/typhoon" + path, method=method)
    if token is not None:
        req.headers["X-Typhoon-Token"] = token
    if raw is not None:
        req.body = raw
    elif body is not None:
        req.body = json.dumps(body).encode()
    req.content_type = ctype
    resp = req.get_response(app)
    return resp.status_int, json.loads(resp.body or b"null")


CHANGES = (
    [("POST", "/apps")]
    + [("POST", f"/apps/fwd/{v}") for v in VERBS]
    + [
        ("DELETE", "/apps/fwd"),
        ("POST", "/apps/fwd/control"),
    ]
)


@pytest.mark.parametrize(("method", "path"), CHANGES)
def test_every_change_needs_the_token(app, core, method, path):
    status, body = call(app, method, path, {}, token=None)
    assert status == 401 and body == {"error": "missing X-Typhoon-Token header"}
    status, body = call(app, method, path, {}, token="wrong")
    assert status == 403 and body == {"error": "wrong token"}
    assert core.coordinator.get_physical("fwd").version == 1 and core.sent == []


@pytest.mark.parametrize(("method", "path"), [c for c in CHANGES if c[0] == "POST"])
@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe"])
def test_malformed_bodies_get_a_400_with_a_sentence(app, method, path, raw):
    status, body = call(app, method, path, raw=raw)
    assert status == 400, body
    assert isinstance(body["error"], str) and body["error"].endswith(("object", ")", "UTF-8"))


@pytest.mark.parametrize("verb", VERBS)
def test_reconfiguration_of_an_unknown_app_is_404(app, verb):
    status, body = call(app, "POST", f"/apps/nope/{verb}", GOOD[verb])
    assert status == 404 and body["error"] == "no running application named 'nope'"


def test_a_good_request_is_accepted_with_its_plan_and_a_second_one_waits(app, core):
    status, body = call(app, "POST", "/apps/fwd/scale", GOOD["scale"])
    assert status == 202, body
    assert body["state"] == "running" and body["request"] == "scale sink to 2"
    assert [s["action"] for s in body["steps"]][:3] == ["keep_rules", "write", "wait_attached"]
    status, again = call(app, "POST", "/apps/fwd/route", GOOD["route"])
    assert status == 409 and "still running" in again["error"]
    status, now = call(app, "GET", "/apps/fwd/reconfig")
    assert status == 200 and now["id"] == body["id"]
    # planning wrote nothing: the agents and the controller see the old topology
    assert core.coordinator.get_physical("fwd").version == 1


def test_a_refused_plan_is_a_4xx_and_changes_nothing(app, core):
    status, body = call(app, "POST", "/apps/fwd/remove", GOOD["remove"])
    assert status == 400 and "one of each" in body["error"]
    status, body = call(app, "POST", "/apps/fwd/scale", {"node": "source", "parallelism": 3})
    assert status == 400 and "spout" in body["error"]
    assert core.reconfigs.get("fwd") is None


def test_a_move_is_planned_and_bad_moves_are_refused_with_a_sentence(app, core):
    for body, status, words in [
        ({"worker": 9, "host": "h1"}, 404, "'fwd' has no worker 9 (workers: 1, 2)"),
        ({"worker": 2, "host": "h7"}, 404, "no host named 'h7' in the cluster (hosts: h1, h2)"),
        ({"worker": 2, "host": "h2"}, 400, "worker 2 ('sink' #0) already runs on h2"),
        ({"worker": 1, "host": "h2"}, 400, "worker 1 belongs to the spout 'source'"),
        ({"worker": "2", "host": "h1"}, 400, "'worker' must be a worker ID"),
    ]:
        status_, reply = call(app, "POST", "/apps/fwd/move", body)
        assert status_ == status and reply["error"].startswith(words), reply
        assert reply["error"].count(". ") == 0  # one sentence
    assert core.reconfigs.get("fwd") is None
    status, body = call(app, "POST", "/apps/fwd/move", GOOD["move"])
    assert status == 202 and body["request"] == "move worker 2 to h1", body
    assert body["removed"] == [2] and len(body["added"]) == 1
    plan = core.reconfigs.get("fwd").plan
    (new,) = plan.added
    assert (plan.final.by_id(new).host, plan.final.by_id(new).node) == ("h1", "sink")
    assert core.coordinator.get_physical("fwd").version == 1  # planned, nothing written


def test_submit_status_list_and_kill(app, core):
    text = FORWARD.replace("name: fwd", "name: other")
    status, body = call(app, "POST", "/apps", {"topology": text})
    assert status == 201 and body["name"] == "other" and len(body["workers"]) == 2
    status, body = call(app, "POST", "/apps", raw=text.encode(), ctype="application/yaml")
    assert status == 409 and "already running" in body["error"]
    status, apps = call(app, "GET", "/apps")
    assert set(apps) == {"fwd", "other"}
    status, s = call(app, "GET", "/apps/fwd")
    assert [(w["node"], w["host"], w["port"], w["role"]) for w in s["workers"]] == [
        ("source", "h1", 100, "active"),
        ("sink", "h2", 100, "active"),
    ]
    assert s["streams"] == [
        {"id": 1, "from": "source", "to": "sink", "policy": "shuffle", "fields": []}
    ]
    assert all("watermark" not in w for w in s["workers"])  # no event time: no column
    sink = s["workers"][1]["worker"]
    core.coordinator.put_metrics("fwd", sink, {"watermark": 900, "watermark_closed": 0})
    s = call(app, "GET", "/apps/fwd")[1]
    assert (s["workers"][1]["watermark"], s["workers"][1]["watermark_closed"]) == (900, 0)
    assert call(app, "DELETE", "/apps/other") == (200, {"killed": "other"})
    assert call(app, "DELETE", "/apps/other")[0] == 404


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: x\nspouts: []\n", "spouts"),
        (FORWARD.replace("sequence_check", "evil.module:Bolt"), "would import code"),
        ("{{{", "YAML"),
    ],
)
def test_submit_refuses_bad_topologies_and_imports(app, text, words):
    status, body = call(app, "POST", "/apps", {"topology": text})
    assert status == 400 and words in body["error"], body


@pytest.mark.parametrize(
    ("settings_", "words"),
    [
        (FaultSettings(replace=False), "does not replace dead workers ([fault_detector] replace"),
        (FaultSettings(port_events=False, heartbeat_timeout=0), "detects no dead worker"),
    ],
)
def test_submit_refuses_a_guarantee_the_controller_cannot_recover(
    app, core, tmp_path, settings_, words
):
    text = FORWARD.replace("name: fwd", "name: eo") + (
        f"config: {{guarantee: exactly_once, checkpoint_store: {tmp_path}}}\n"
    )
    core.fault_settings = settings_
    status, body = call(app, "POST", "/apps", {"topology": text})
    assert status == 409 and body["error"].startswith(
        "application 'eo' asks for guarantee exactly_once, but this controller "
    ), body
    assert words in body["error"] and core.coordinator.get_physical("eo") is None
    core.fault_settings = FaultSettings()  # the defaults recover it
    status, body = call(app, "POST", "/apps", {"topology": text})
    assert status == 201, body
    assert no_recovery(load_topology_text(FORWARD), settings_) == ""  # no guarantee asked


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(
    ["node", "parallelism", "stream", "policy", "fields", "operator", "args", "from", "to",
     "grouping", "table", "topology", "type", "body", "workers", "stateful", "worker", "host"]
)  # fmt: skip
bodies = st.dictionaries(field_names | st.text(max_size=8), json_values, max_size=6) | json_values


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    target=st.sampled_from(CHANGES + [("GET", "/apps/fwd"), ("GET", "/apps/fwd/reconfig")]),
    body=bodies,
)
def test_random_json_never_gets_a_5xx(app, core, target, body):
    method, path = target
    status, reply = call(app, method, path, body)
    assert status < 500, (body, reply)
    if status >= 400:
        assert isinstance(reply["error"], str) and reply["error"]
    if core.coordinator.get_physical("fwd") is None:  # a fuzzed kill: bring the app back
        core.manager.submit(load_topology_text(FORWARD))
        core.coordinator.put_app_state("fwd", {"active": True})
    core.reconfigs.latest.clear()


# ----- the CLI verbs on the same API ---------------------------------------------------------


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(app, core, monkeypatch, tmp_path):
    httpd = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    core.finish_at_once = True
    for var in ("TYPHOON_CONTROLLER", "TYPHOON_TOKEN", "TYPHOON_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/typhoon/client.ini of the user
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


def typhoon(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_verbs_with_flags_env_and_config_file(server, core, capsys, monkeypatch, tmp_path):
    flags = ["--controller", server, "--token", TOKEN]
    code, out, _ = typhoon(capsys, "list", "--controller", server)
    assert code == 0 and out.startswith("fwd  app ")
    code, out, _ = typhoon(capsys, "scale", "fwd", "sink", "2", *flags)
    assert code == 0 and "reconfiguration 1 done" in out and "[ok]" in out
    monkeypatch.setenv("TYPHOON_CONTROLLER", server)
    monkeypatch.setenv("TYPHOON_TOKEN", TOKEN)
    code, out, _ = typhoon(capsys, "route", "fwd", "source:sink", "fields", "--fields", "seq")
    assert code == 0, out
    route = core.reconfigs.get("fwd").plan  # the verb reached the planner, as asked
    (stream,) = route.topology.streams
    assert (stream.grouping.type, stream.grouping.fields) == ("fields", ("seq",)), stream
    code, out, _ = typhoon(
        capsys, "swap", "fwd", "sink", "sequence_check", "--args", '{"ts": "ts"}'
    )
    assert code == 0, out
    swap = core.reconfigs.get("fwd").plan
    assert swap is not route
    sink = swap.topology.nodes["sink"]
    assert (sink.operator, sink.args) == ("sequence_check", {"ts": "ts"})
    # every sink worker is replaced by a new one running the new operator
    old_sinks = {w.worker_id for w in swap.old_physical.of_node("sink")}
    assert old_sinks and set(swap.removed) == old_sinks, (swap.removed, old_sinks)
    assert len(swap.added) == len(old_sinks) and not set(swap.added) & old_sinks
    code, out, _ = typhoon(capsys, "move", "fwd", "2", "h1")
    assert code == 0 and "move worker 2 to h1" in out and "reconfiguration 4 done" in out, out
    move = core.reconfigs.get("fwd").plan
    assert move.removed == [2] and move.final.by_id(move.added[0]).host == "h1"
    code, out, _ = typhoon(capsys, "status", "fwd")
    assert code == 0 and "stream 1: source -> sink [shuffle]" in out and "  sink  " in out
    monkeypatch.delenv("TYPHOON_CONTROLLER")
    monkeypatch.delenv("TYPHOON_TOKEN")
    conf = tmp_path / "client.ini"
    conf.write_text(f"[typhoon]\ncontroller = {server}\ntoken = {TOKEN}\n")
    topo = tmp_path / "t.yaml"
    topo.write_text(FORWARD.replace("name: fwd", "name: two"))
    code, out, _ = typhoon(capsys, "submit", str(topo), "--config", str(conf))
    assert code == 0 and out.startswith("submitted two: 2 workers")
    code, out, _ = typhoon(capsys, "kill", "two", "--config", str(conf))
    assert code == 0 and out == "killed two\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["scale", "fwd", "source", "3"], "error: 'source' is a spout"),
        (["scale", "nope", "sink", "3"], "error: no running application named 'nope'"),
        (["swap", "fwd", "sink", "identity", "--args", "{"], "error: --args is not valid JSON"),
        (["route", "fwd", "7", "shuffle"], "error: no stream 7"),
        (["kill", "nope"], "error: no application named 'nope'"),
        (["move", "fwd", "1", "h2"], "error: worker 1 belongs to the spout 'source'"),
        (["move", "fwd", "2", "h2"], "error: worker 2 ('sink' #0) already runs on h2"),
        (["move", "fwd", "5", "h1"], "error: 'fwd' has no worker 5"),
        (["move", "fwd", "2", "h9"], "error: no host named 'h9'"),
        (["move", "nope", "2", "h1"], "error: no running application named 'nope'"),
    ],
)
def test_cli_bad_requests_exit_2_with_one_line(server, capsys, argv, message):
    code, out, err = typhoon(capsys, *argv, "--controller", server, "--token", TOKEN)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1, err


def test_cli_without_token_or_controller(server, capsys):
    code, _, err = typhoon(capsys, "kill", "fwd", "--controller", server)
    assert code == 2 and err == (
        "error: missing X-Typhoon-Token header (this request needs the API token: give it "
        "with --token, $TYPHOON_TOKEN or token = in ~/.config/typhoon/client.ini; the "
        "controller reads it from its api_token_file)\n"
    )
    code, _, err = typhoon(capsys, "list", "--controller", "http://127.0.0.1:9")
    assert code == 1 and err.startswith("error: cannot reach the controller")


def test_report_of_a_job_running_then_finished_and_removed(app, core, server, capsys):
    """GET /apps/NAME/report and ``typhoon report``: not ok while running, merged once all
    workers exited, and still there after the job was removed."""
    from controller.job_end import finish_jobs
    from typhoon.coordinator import WorkerStatus

    flags = ["--controller", server, "--token", TOKEN]
    code, out, _ = typhoon(capsys, "report", "fwd", *flags)
    assert code == 1 and out.startswith("fwd: running, NOT OK\n")
    assert "not started" in out and "problem: not finished: 2 of 2 workers" in out
    code, out, err = typhoon(capsys, "report", "fwd", "--wait", "--timeout", "0.2", *flags)
    assert code == 1 and err == "error: fwd has not finished after 0.2 s\n"
    c = core.coordinator
    c.put_app_state("fwd", {"active": True, "remove_when_done": True})
    for w in c.get_physical("fwd").workers:
        c.put_worker_status("fwd", WorkerStatus(w.worker_id, w.host, "exited", exit_code=0))
    assert finish_jobs(core.view, c, core.manager, core.logger) == ["fwd"]
    status, body = call(app, "GET", "/apps/fwd/report")
    assert status == 200 and body["finished"] and body["topology"] == "fwd"
    code, out, _ = typhoon(capsys, "report", "fwd", "--wait", "--json", *flags)
    assert json.loads(out)["result"]["worker_states"][0]["exit_code"] == 0
    code, out, _ = typhoon(capsys, "list", *flags)
    assert code == 0 and out.startswith("no applications (typhoon submit FILE")
    status, body = call(app, "GET", "/apps/nope/report")
    assert status == 404 and "no application named 'nope'" in body["error"]


def test_a_report_asked_while_its_job_is_being_removed_is_the_stored_one(app, core, monkeypatch):
    """CI: ``typhoon report --wait`` polled between the stored report and the view's
    next poll, while the job's nodes were being deleted: the live report could not be
    read and the answer was 404 instead of the stored report."""
    from controller.job_end import finish_jobs
    from typhoon.coordinator import WorkerStatus

    c = core.coordinator
    c.put_app_state("fwd", {"active": True})
    for w in c.get_physical("fwd").workers:
        c.put_worker_status("fwd", WorkerStatus(w.worker_id, w.host, "exited", exit_code=0))
    stale = core.view  # the controller's view before its next coordinator poll
    assert finish_jobs(core.view, c, core.manager, core.logger) == []
    c.delete_application("fwd")  # removed meanwhile (--remove-when-done, or a kill)
    monkeypatch.setattr(type(core), "view", property(lambda self: stale))
    assert not core.view.apps["fwd"].state.get("finished")  # listed, not finished
    status, body = call(app, "GET", "/apps/fwd/report")
    assert status == 200 and body["finished"] and body["topology"] == "fwd", body


def test_submit_remove_when_done_reaches_the_app_state(app, core, server, capsys, tmp_path):
    topo = tmp_path / "t.yaml"
    topo.write_text(FORWARD.replace("name: fwd", "name: once"))
    code, out, _ = typhoon(
        capsys, "submit", str(topo), "--remove-when-done", "--controller", server, "--token", TOKEN
    )
    assert code == 0, out
    assert core.coordinator.get_app_state("once")["remove_when_done"] is True
    status, body = call(app, "POST", "/apps", {"topology": FORWARD, "remove_when_done": "yes"})
    assert status == 400 and body == {"error": "'remove_when_done' must be true or false"}
    core.coordinator.put_app_state("fwd", {"active": True, "finished": True, "ok": True})
    code, out, _ = typhoon(capsys, "status", "fwd", "--controller", server)
    assert out.splitlines()[0].endswith("finished (ok: typhoon report)")


def test_debug_attach_without_the_debugger_loaded_says_so(server, capsys):
    """This controller serves the core's routes only (no apps/live_debugger.py)."""
    code, _, err = typhoon(capsys, "debug", "attach", "fwd", "0", "--controller", server,
                           "--token", TOKEN)  # fmt: skip
    assert code == 2 and err == (
        "error: the controller has no live debugger: the live_debugger app is not loaded "
        "(add it to apps = in the [controller] section of controller.conf, or --app "
        "live_debugger, and restart the controller)\n"
    )


# ----- ${ENV} is the submitter's, never the controller's (issue 28) ---------------------------


def test_a_rest_submission_is_not_expanded_with_the_controllers_environment(app, core, monkeypatch):
    monkeypatch.setenv("HOME", "/home/controller-secret")
    text = FORWARD.replace("name: fwd", "name: env").replace(
        "operator: sequence_check", "operator: sequence_check\n    args: {ts: '${HOME}'}"
    )
    for body, ctype in (({"topology": text}, "application/json"), (None, "application/yaml")):
        raw = text.encode() if body is None else None
        status, reply = call(app, "POST", "/apps", body, raw=raw, ctype=ctype)
        assert status == 400, reply
        assert reply["error"] == (
            "topology:9: '${HOME}': the controller does not substitute environment variables "
            "(`typhoon submit FILE` substitutes them from your environment before sending)"
        )
    assert core.coordinator.get_topology("env") is None
    assert "controller-secret" not in json.dumps(call(app, "GET", "/apps")[1])


def test_a_reconfiguration_keeps_dollar_braces_as_text(app, core, monkeypatch):
    monkeypatch.delenv("TYPHOON_SURELY_UNSET", raising=False)
    swap = {"node": "sink", "operator": "sequence_check", "args": {"ts": "${TYPHOON_SURELY_UNSET}"}}
    status, body = call(app, "POST", "/apps/fwd/swap", swap)
    assert status == 202, body


def test_cli_submit_expands_the_submitters_environment(server, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SINK_PAR", "3")
    monkeypatch.setenv("TS_FIELD", "stamp")
    topo = tmp_path / "t.yaml"
    topo.write_text(
        FORWARD.replace("name: fwd", "name: envy").replace(
            "operator: sequence_check",
            "operator: sequence_check\n    parallelism: ${SINK_PAR:-1}\n"
            "    args: {ts: '${TS_FIELD}'}",
        )
    )
    code, out, err = typhoon(capsys, "submit", str(topo), "--controller", server, "--token", TOKEN)
    assert code == 0 and out.startswith("submitted envy: 4 workers"), (out, err)
    code, out, _ = typhoon(capsys, "status", "envy", "--json", "--controller", server)
    assert json.loads(out)["result"]["nodes"]["sink"]["args"] == {"ts": "stamp"}
    monkeypatch.delenv("TS_FIELD")
    code, _, err = typhoon(capsys, "submit", str(topo), "--controller", server, "--token", TOKEN)
    assert code == 2 and "environment variable 'TS_FIELD' is not set" in err, err


# ----- the body limit holds whatever the framing (issue 28) -----------------------------------


@pytest.fixture(params=["ryu_compat", "osken_wsgi"])
def eventlet_server(request, core):
    """The REST app on the controller's own server (eventlet.wsgi, which decodes chunked bodies)."""
    from controller.framework.ryu_compat import hub

    if request.param == "osken_wsgi":
        os.environ.setdefault("OSKEN_HUB_TYPE", "eventlet")
        from controller.framework.osken_wsgi import WSGIApplication as App
    else:
        App = WSGIApplication
    wsgi = App()
    wsgi.register(TyphoonRest, {"core": core, "token": TOKEN})
    server = hub.WSGIServer(("127.0.0.1", 0), wsgi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server.getsockname()[1]


def chunked_post(port: int, body: bytes, ctype: str = "application/json") -> tuple[int, dict]:
    """POST ``body`` in 64 KiB chunks with Transfer-Encoding: chunked (no Content-Length)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    pieces = (body[i : i + 65536] for i in range(0, len(body), 65536))
    conn.request(
        "POST",
        "/typhoon/apps",
        body=pieces,
        headers={"X-Typhoon-Token": TOKEN, "Content-Type": ctype},
        encode_chunked=True,
    )
    resp = conn.getresponse()
    status, reply = resp.status, json.loads(resp.read())
    conn.close()
    return status, reply


def test_a_chunked_body_over_the_limit_is_refused_and_one_under_it_is_read(eventlet_server, core):
    text = FORWARD.replace("name: fwd", "name: chunky")
    big = json.dumps({"topology": text + "#" + "x" * MAX_BODY + "\n"}).encode()
    status, reply = chunked_post(eventlet_server, big)
    assert status == 413 and reply == {"error": f"request body is larger than {MAX_BODY} bytes"}
    status, reply = chunked_post(eventlet_server, big, ctype="application/yaml")
    assert status == 413, reply
    assert core.coordinator.get_topology("chunky") is None
    status, reply = chunked_post(eventlet_server, json.dumps({"topology": text}).encode())
    assert status == 201 and reply["name"] == "chunky", reply


# ----- the optional read token: every GET, /metrics too (issue 28) ---------------------------

READ = "r3ader"


@pytest.fixture
def guarded(core):
    """Every REST view the controller serves, on one WSGI app with a read token set."""
    from prometheus_client import CollectorRegistry

    from apps.locality_router import LocalityRest
    from controller.app_support import list_rest, report_rest
    from controller.debugging.debug_rest import DebugRest
    from controller.rest import set_read_tokens

    wsgi = WSGIApplication()
    core.metrics_registry = CollectorRegistry()
    reports = SimpleNamespace(report=dict, logger=core.logger)
    debugger = SimpleNamespace(
        list_sessions=lambda name: [], session_status=lambda name, sid: {}, read=lambda *a: {}
    )
    wsgi.register(TyphoonRest, {"core": core, "token": TOKEN})
    wsgi.register(DebugRest, {"debugger": debugger, "core": core, "token": TOKEN})
    wsgi.register(LocalityRest, {"app": reports, "token": TOKEN})
    wsgi.register(report_rest("lb", missing="none"), {"app": reports})
    wsgi.register(list_rest("faults"), {"app": reports})
    set_read_tokens(wsgi, READ, TOKEN)
    return wsgi


def get_routes(wsgi) -> list[str]:
    """The path of every GET route on ``wsgi``, its variables filled in."""
    paths = []
    for r in wsgi.mapper.matchlist:
        if "GET" in (r.conditions or {}).get("method", ["GET"]):
            path = r.routepath
            for var in r.minkeys | set(r.reqs):
                path = path.replace("{" + var + "}", {"name": "fwd"}.get(var, "1"))
            paths.append(path)
    return sorted(set(paths))


def test_with_a_read_token_every_get_needs_it(guarded):
    paths = get_routes(guarded)
    pages = {"/dashboard", "/dashboard/1"}  # the page's own files: no data in them
    assert "/metrics" in paths and "/typhoon/apps/fwd" in paths and len(paths) >= 14, paths
    for path in sorted(set(paths) - pages):
        for headers, want in [
            ({}, 401),
            ({"X-Typhoon-Token": "wrong"}, 403),
            ({"Authorization": "Bearer wrong"}, 403),
        ]:
            resp = Request.blank(path, headers=headers).get_response(guarded)
            assert resp.status_int == want, (path, headers, resp.body)
        readers = [{"X-Typhoon-Token": READ}, {"Authorization": f"Bearer {READ}"}]
        if path.endswith("/tuples"):  # a debug session's tuples: app data, the change token
            readers = []
        for headers in [*readers, {"X-Typhoon-Token": TOKEN}]:  # the change token reads too
            resp = Request.blank(path, headers=headers).get_response(guarded)
            assert resp.status_int not in (401, 403), (path, headers, resp.body)
    resp = Request.blank("/typhoon/apps").get_response(guarded)
    assert json.loads(resp.body) == {
        "error": "missing token: this controller needs its read token on every GET "
        "(X-Typhoon-Token or Authorization: Bearer)"
    }
    assert Request.blank("/dashboard").get_response(guarded).status_int == 200


def test_the_read_token_does_not_allow_changes(guarded, core):
    req = Request.blank("/typhoon/apps/fwd", method="DELETE", headers={"X-Typhoon-Token": READ})
    assert req.get_response(guarded).status_int == 403
    assert core.coordinator.get_physical("fwd") is not None


def test_without_a_read_token_reading_stays_open(app):
    from controller.rest import set_read_tokens

    set_read_tokens(app, "", TOKEN)
    assert call(app, "GET", "/apps", token=None)[0] == 200
