"""The controller's REST API in-process (Ryu's WSGI app, a fake core) and the CLI verbs on it.

Every changing verb refuses a missing or wrong token and malformed input with
a 4xx and a sentence; random JSON (hypothesis) never gets a 5xx.  The CLI is
run against the same app served by wsgiref on a local port.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webob import Request

import typhoon_cli as cli
from controller.fault_detector import FaultSettings, no_recovery
from controller.reconfigure import Registry
from controller.rest import TyphoonRest
from controller.ryu_compat import WSGIApplication
from controller.view import ClusterView
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
VERBS = ["scale", "route", "swap", "insert", "remove"]
GOOD = {
    "scale": {"node": "sink", "parallelism": 2},
    "route": {"stream": 1, "policy": "fields", "fields": ["seq"]},
    "swap": {"node": "sink", "operator": "sequence_check", "args": {"ts": "ts"}},
    "insert": {"node": "mid", "operator": "identity", "from": "source", "to": "sink"},
    "remove": {"node": "sink"},  # refused by the planner (a sink has no output)
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
     "grouping", "table", "topology", "type", "body", "workers", "stateful"]
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


def test_cli_verbs_with_flags_env_and_config_file(server, capsys, monkeypatch, tmp_path):
    flags = ["--controller", server, "--token", TOKEN]
    code, out, _ = typhoon(capsys, "list", "--controller", server)
    assert code == 0 and out.startswith("fwd  app ")
    code, out, _ = typhoon(capsys, "scale", "fwd", "sink", "2", *flags)
    assert code == 0 and "reconfiguration 1 done" in out and "[ok]" in out
    monkeypatch.setenv("TYPHOON_CONTROLLER", server)
    monkeypatch.setenv("TYPHOON_TOKEN", TOKEN)
    code, out, _ = typhoon(capsys, "route", "fwd", "source:sink", "fields", "--fields", "seq")
    assert code == 0, out
    code, out, _ = typhoon(
        capsys, "swap", "fwd", "sink", "sequence_check", "--args", '{"ts": "ts"}'
    )
    assert code == 0, out
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
    ],
)
def test_cli_bad_requests_exit_2_with_one_line(server, capsys, argv, message):
    code, out, err = typhoon(capsys, *argv, "--controller", server, "--token", TOKEN)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1, err


def test_cli_without_token_or_controller(server, capsys):
    code, _, err = typhoon(capsys, "kill", "fwd", "--controller", server)
    assert code == 2 and err == "error: missing X-Typhoon-Token header\n"
    code, _, err = typhoon(capsys, "list", "--controller", "http://127.0.0.1:9")
    assert code == 1 and err.startswith("error: cannot reach the controller")
