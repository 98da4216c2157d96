"""``GET /typhoon/dashboard``: the aggregate over a real coordinator's view with made-up
rates and app reports; the page's routes through Ryu's WSGI app."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from webob import Request

from controller.dashboard import MAX_DECISIONS, MAX_INCIDENTS, Inputs, Reports, gather, snapshot
from controller.framework.ryu_compat import WSGIApplication
from controller.reconfigure import Registry
from controller.recovery.fault_detector import Incident
from controller.rest import DASHBOARD_DIR, DASHBOARD_FILES, TyphoonRest
from controller.rules.view import ClusterView
from typhoon.cluster import Cluster, FabricLink, HostInfo
from typhoon.coordinator import SqliteCoordinator
from typhoon.coordinator.base import WorkerStatus
from typhoon.manager import Manager
from typhoon.topology import load_topology_text

# a diamond with two input streams into ``join``: the split of a worker's input rate
DIAMOND = """
name: dia
spouts:
  - {id: source, operator: sequence_source}
bolts:
  - {id: left, operator: identity, parallelism: 2}
  - {id: right, operator: identity}
  - {id: join, operator: sequence_check}
streams:
  - {from: source, to: left, grouping: shuffle}
  - {from: source, to: right, grouping: {type: fields, fields: [seq]}}
  - {from: left, to: join, grouping: shuffle}
  - {from: right, to: join, grouping: global}
"""


@pytest.fixture
def coordinator(tmp_path: Path):
    c = SqliteCoordinator(tmp_path / "coord.db")
    hosts = {h: HostInfo(h, f"br{h}", i + 1) for i, h in enumerate(["h1", "h2"])}
    c.put_cluster(Cluster(hosts, [FabricLink("h2", 1, "h1", 1)]))
    Manager(c).submit(load_topology_text(DIAMOND))
    yield c
    c.close()


def ids_of(view: ClusterView) -> dict[tuple[str, int], int]:
    return {(w.node, w.index): w.worker_id for w in view.apps["dia"].physical.workers}


def test_nodes_workers_and_stream_rates(coordinator):
    view = ClusterView.read(coordinator)
    ids = ids_of(view)
    for w in view.apps["dia"].physical.workers:
        state = "exited" if (w.node, w.index) == ("left", 1) else "running"
        view.apps["dia"].statuses[w.worker_id] = WorkerStatus(w.worker_id, w.host, state)
    join, source = ids[("join", 0)], ids[("source", 0)]
    rates = {"dia": {join: {"in": 300.0, "out": 0.0}, source: {"in": 0.0, "out": 400.0},
                     ids[("left", 0)]: {"in": 150.0, "out": 150.0}}}  # fmt: skip
    # join got 3 tuples on stream 3 (left) for each 1 on stream 4 (right); "0" is control
    metrics = {"dia": {join: {"in": {"0": 50, "3": 600, "4": 200}, "out": {}, "queue": 4},
                       source: {"in": {"0": 9}, "out": {"1": 700, "2": 300}}}}  # fmt: skip
    doc = snapshot(Inputs(view, rates, metrics, connected={"h1"}, now=1234.5))

    assert doc["time"] == 1234.5
    assert doc["hosts"] == [{"name": "h1", "connected": True}, {"name": "h2", "connected": False}]
    assert doc["links"] == [("h1", "h2")]
    (app,) = doc["apps"]
    nodes = {n["name"]: n for n in app["nodes"]}
    assert {n: (v["kind"], v["depth"]) for n, v in nodes.items()} == {
        "source": ("spout", 0), "left": ("bolt", 1), "right": ("bolt", 1), "join": ("bolt", 2)
    }  # fmt: skip
    assert nodes["left"]["workers"] == [ids[("left", 0)], ids[("left", 1)]]
    assert nodes["source"]["rate_out"] == 400.0
    assert nodes["left"]["rate_in"] == 150.0  # left[1] has no rate yet: counts as 0
    workers = {w["worker"]: w for w in app["workers"]}
    assert len(workers) == 5
    assert workers[join]["tuples_in"] == 800  # control traffic is not data
    assert workers[source]["tuples_out"] == 1000
    assert workers[join]["queue"] == 4
    assert workers[ids[("left", 1)]]["state"] == "exited"
    assert {w["host"] for w in workers.values()} <= {"h1", "h2"}
    streams = {(s["from"], s["to"]): s for s in app["streams"]}
    assert streams[("left", "join")]["rate"] == 225.0  # 300/s * 600 / 800
    assert streams[("right", "join")]["rate"] == 75.0
    assert streams[("source", "left")]["rate"] == 0.0  # left's input counts are unknown
    assert streams[("source", "right")]["fields"] == ["seq"]
    assert streams[("right", "join")]["policy"] == "global"
    assert app["reconfig"] is None
    assert (doc["faults"], doc["autoscaler"], doc["lb"], doc["debug"]) == (None,) * 4
    json.dumps(doc)  # what the route sends


def test_reports_are_trimmed_to_the_newest(coordinator):
    view = ClusterView.read(coordinator)
    incidents = [
        Incident("dia", 2, "left", "port deleted", t, 1000.0 + t).to_dict()
        for t in range(MAX_INCIDENTS + 5)
    ][::-1]
    decisions = [{"time": float(t), "action": "keep"} for t in range(MAX_DECISIONS + 3)]
    reports = Reports(
        faults=incidents,
        autoscaler={"dia": {"left": {"parallelism": 2, "decisions": decisions}}},
        lb={"dia": {"left": {"configured": {"2": 0.5}, "decisions": []}}},
        debug=[{"session": "ab12", "app": "dia", "worker": 2, "received": 7}],
    )
    doc = snapshot(Inputs(view, reports=reports))
    assert len(doc["faults"]) == MAX_INCIDENTS
    assert [i["detected_wall"] for i in doc["faults"]][-1] == 1000.0 + MAX_INCIDENTS + 4
    assert doc["faults"][0]["detected_wall"] == 1005.0  # the oldest five left out
    kept = doc["autoscaler"]["dia"]["left"]["decisions"]
    assert [d["time"] for d in kept] == [float(t) for t in range(3, MAX_DECISIONS + 3)]
    assert len(reports.autoscaler["dia"]["left"]["decisions"]) == MAX_DECISIONS + 3  # a copy
    assert doc["lb"]["dia"]["left"]["configured"] == {"2": 0.5}
    assert doc["debug"][0]["session"] == "ab12"


class FakeCore:
    """What :func:`gather` and the routes read of the controller."""

    def __init__(self, coordinator: SqliteCoordinator) -> None:
        self.coordinator = coordinator
        self.view = ClusterView.read(coordinator)
        self.logger = logging.getLogger("fake-core")
        self.datapaths = {2: object(), 99: object()}  # 99: a switch that is no host
        self.rates: dict = {}
        self.worker_metrics: dict = {}
        self.reconfigs = Registry()


def test_gather_reads_the_core_and_the_loaded_apps(coordinator):
    core = FakeCore(coordinator)
    session = SimpleNamespace(to_dict=lambda: {"session": "s1", "app": "dia"})
    apps = {
        "FaultDetector": SimpleNamespace(report=lambda: []),
        "LiveDebugger": SimpleNamespace(sessions=SimpleNamespace(sessions={"s1": session})),
    }
    inputs = gather(core, apps.get, 5.0)
    assert inputs.connected == {"h2"}
    assert inputs.now == 5.0
    assert inputs.reports == Reports(faults=[], debug=[{"session": "s1", "app": "dia"}])
    assert inputs.reconfigs == {}


def wsgi_app(core: FakeCore, apps: dict) -> WSGIApplication:
    wsgi = WSGIApplication()
    wsgi.register(TyphoonRest, {"core": core, "token": "s3cret", "lookup": apps.get})
    return wsgi


def test_dashboard_routes(coordinator):
    wsgi = wsgi_app(FakeCore(coordinator), {"Autoscaler": SimpleNamespace(report=lambda: {})})
    resp = Request.blank("/typhoon/dashboard").get_response(wsgi)
    assert resp.status_int == 200
    doc = json.loads(resp.body)
    assert [a["name"] for a in doc["apps"]] == ["dia"]
    assert doc["autoscaler"] == {} and doc["faults"] is None

    page = Request.blank("/dashboard").get_response(wsgi)
    assert page.status_int == 200 and page.headers["Content-Type"].startswith("text/html")
    assert b"/dashboard/dashboard.js" in page.body
    for name, ctype in DASHBOARD_FILES.items():
        got = Request.blank(f"/dashboard/{name}").get_response(wsgi)
        assert got.status_int == 200 and got.headers["Content-Type"].startswith(ctype)
        assert got.body == (DASHBOARD_DIR / name).read_bytes()
    for bad in ("/dashboard/rest.py", "/dashboard/..%2Frest.py", "/dashboard/%2e%2e"):
        got = Request.blank(bad).get_response(wsgi)
        assert got.status_int == 404, bad
    missing = Request.blank("/dashboard/rest.py").get_response(wsgi)
    assert json.loads(missing.body) == {"error": "the dashboard has no file named 'rest.py'"}


def test_every_file_of_the_page_is_served():
    """A file added to the page's directory but not to DASHBOARD_FILES would be a 404."""
    assert {p.name for p in DASHBOARD_DIR.iterdir()} == set(DASHBOARD_FILES)
    html = (DASHBOARD_DIR / "index.html").read_text()
    for name in DASHBOARD_FILES:
        if name != "index.html":
            assert f"/dashboard/{name}" in html
