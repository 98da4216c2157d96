"""``GET /metrics``: the collector over a fake controller state, parsed back with
prometheus_client's own parser; the route through Ryu's WSGI app."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter, deque
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families
from webob import Request

from controller.framework.ryu_compat import WSGIApplication
from controller.metrics import SparkTotals, exposition, registry
from controller.recovery.fault_detector import Incident
from controller.rest import TyphoonRest
from controller.rules.view import ClusterView
from typhoon.cluster import Cluster, HostInfo
from typhoon.coordinator import SqliteCoordinator
from typhoon.manager import Manager
from typhoon.topology import load_topology_text

FORWARD = """
name: fwd
spouts:
  - {id: source, operator: sequence_source}
bolts:
  - {id: sink, operator: sequence_check, parallelism: 2}
streams:
  - {from: source, to: sink, grouping: shuffle}
"""


def worker_metrics(node: str, tin: dict, tout: dict, **extra) -> dict:
    return {
        "node": node,
        "in": tin,
        "out": tout,
        "queue": 7,
        "queue_bytes": 700,
        "proc_us": 2.5,
        "proc_s": 0.25,
        "serializations": 10,
        "frames_in": 3,
        "frames_out": 4,
        "bytes_in": 300,
        "bytes_out": 400,
        "seq_gaps": 1,
        "retransmitted": 2,
        "credit_stalls": 5,
        "drops": {"bad_source": 2, "stale_seq": 1},
        "active": 1,
        "done": 0,
        "rate": 0.0,
        "batch_size": 100,
        "time": 1700000000.0,
        **extra,
    }


class FakeCore:
    def __init__(self, coordinator: SqliteCoordinator) -> None:
        self.coordinator = coordinator
        self.view = ClusterView.read(coordinator)
        self.logger = logging.getLogger("fake-core")
        physical = self.view.apps["fwd"].physical
        ids = {(w.node, w.index): w.worker_id for w in physical.workers}
        self.ids = ids
        self.worker_metrics = {
            "fwd": {
                ids[("source", 0)]: worker_metrics("source", {"0": 9}, {"1": 1000}),
                ids[("sink", 0)]: worker_metrics("sink", {"0": 3, "1": 600}, {}),
                ids[("sink", 1)]: worker_metrics("sink", {"1": 400}, {}),
            },
            "gone": {1: worker_metrics("x", {"1": 5}, {})},  # killed: not exported
        }
        self.datapaths = {1: object()}
        self.installed = {1: {"r1", "r2", "r3"}, 2: {"r1"}}
        self.installed_groups = {1: {"g1"}}
        self.drops = {"unknown_sender": 4}
        self.spark_totals = SparkTotals()


def fake_apps() -> dict:
    incidents = [
        Incident("fwd", 2, "sink", "port deleted", 1.0, 1.0, state="rejoined", reroute_ms=12.0),
        Incident("fwd", 3, "sink", "port deleted", 2.0, 2.0, state="failed", reroute_ms=300.0),
        Incident("fwd", 4, "sink", "no METRIC_RESP", 3.0, 3.0),
    ]
    session = SimpleNamespace(spec=SimpleNamespace(app="fwd"), id="s1", state="live", received=42)
    return {
        "FaultDetector": SimpleNamespace(incidents=incidents),
        "Autoscaler": SimpleNamespace(
            decision_counts=Counter({("fwd", "sink", "scale up"): 2}),
            shape={("fwd", "sink"): 3},
            decisions=deque(),
        ),
        "LiveDebugger": SimpleNamespace(sessions=SimpleNamespace(sessions={"s1": session})),
        "LoadBalancer": SimpleNamespace(
            nodes={("fwd", "sink"): SimpleNamespace(installed={2: 0.75, 3: 0.25})}
        ),
    }


@pytest.fixture
def core(tmp_path: Path):
    c = SqliteCoordinator(tmp_path / "coord.db")
    c.put_cluster(Cluster({h: HostInfo(h, f"br{h}", i + 1) for i, h in enumerate(["h1", "h2"])}))
    Manager(c).submit(load_topology_text(FORWARD))
    yield FakeCore(c)
    c.close()


def scrape(core, apps: dict | None = None) -> dict[str, dict[tuple, float]]:
    """name of each sample -> sorted label items -> value."""
    text = exposition(registry(core, (apps or {}).get)).decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def labels(core, node: str, index: int, **more) -> tuple:
    wid = core.ids[(node, index)]
    host = next(w.host for w in core.view.apps["fwd"].physical.workers if w.worker_id == wid)
    d = {"app": "fwd", "node": node, "worker": str(wid), "host": host, **more}
    return tuple(sorted(d.items()))


def test_worker_series_per_worker_in_base_units(core):
    m = scrape(core)
    tin = m["typhoon_worker_tuples_in_total"]
    assert tin[labels(core, "sink", 0)] == 600  # stream 0 (control) is not data
    assert tin[labels(core, "sink", 1)] == 400
    assert tin[labels(core, "source", 0)] == 0
    assert m["typhoon_worker_tuples_out_total"][labels(core, "source", 0)] == 1000
    assert len(tin) == 3  # the killed application's worker is gone
    one = labels(core, "sink", 1)
    assert m["typhoon_worker_queue_tuples"][one] == 7
    assert m["typhoon_worker_queue_bytes"][one] == 700
    assert m["typhoon_worker_busy_seconds_total"][one] == 0.25
    assert m["typhoon_worker_tuple_process_seconds"][one] == pytest.approx(2.5e-6)
    assert m["typhoon_worker_credit_stalls_total"][one] == 5
    assert m["typhoon_worker_seq_gaps_total"][one] == 1
    assert m["typhoon_worker_retransmitted_frames_total"][one] == 2
    assert m["typhoon_worker_sent_bytes_total"][one] == 400
    drops = m["typhoon_worker_dropped_frames_total"]
    assert drops[labels(core, "sink", 1, reason="bad_source")] == 2
    assert drops[labels(core, "sink", 1, reason="stale_seq")] == 1


def test_busy_time_of_workers_that_report_only_the_mean(core):
    wid = core.ids[("sink", 1)]
    del core.worker_metrics["fwd"][wid]["proc_s"]
    m = scrape(core)
    assert m["typhoon_worker_busy_seconds_total"][labels(core, "sink", 1)] == pytest.approx(1e-3)


def test_switches_and_controller(core):
    m = scrape(core)
    assert m["typhoon_switch_connected"] == {(("host", "h1"),): 1, (("host", "h2"),): 0}
    assert m["typhoon_switch_flows"] == {(("host", "h1"),): 3, (("host", "h2"),): 1}
    assert m["typhoon_switch_groups"][(("host", "h1"),)] == 1
    assert m["typhoon_controller_dropped_messages_total"] == {(("reason", "unknown_sender"),): 4}
    assert m["typhoon_app_workers"] == {(("app", "fwd"),): 3}


def test_apps_not_loaded_export_nothing(core):
    names = set(scrape(core))
    assert not {n for n in names if n.startswith(("typhoon_fault", "typhoon_autoscaler"))}
    assert not {n for n in names if n.startswith(("typhoon_debug", "typhoon_lb", "typhoon_spark"))}


def test_control_plane_apps(core):
    m = scrape(core, fake_apps())
    assert m["typhoon_fault_incidents_total"] == {(("app", "fwd"), ("node", "sink")): 3}
    assert m["typhoon_fault_incidents_by_state"] == {
        (("state", "failed"),): 1,
        (("state", "rejoined"),): 1,
        (("state", "rerouting"),): 1,
    }
    hist = m["typhoon_fault_reroute_seconds_bucket"]
    assert hist[(("le", "0.025"),)] == 1
    assert hist[(("le", "0.5"),)] == 2
    assert hist[(("le", "+Inf"),)] == 2
    assert m["typhoon_fault_reroute_seconds_count"][()] == 2
    assert m["typhoon_fault_reroute_seconds_sum"][()] == pytest.approx(0.312)
    key = (("action", "scale up"), ("app", "fwd"), ("node", "sink"))
    assert m["typhoon_autoscaler_decisions_total"] == {key: 2}
    assert m["typhoon_autoscaler_parallelism"] == {(("app", "fwd"), ("node", "sink")): 3}
    assert m["typhoon_debug_sessions"] == {(("app", "fwd"), ("state", "live")): 1}
    assert m["typhoon_debug_records_total"] == {(("app", "fwd"), ("session", "s1")): 42}
    assert m["typhoon_lb_share"][(("app", "fwd"), ("node", "sink"), ("worker", "2"))] == 0.75


def test_spark_batches(core):
    core.spark_totals.add("fwd", "enrich", {"batch_ms": 400, "input_rows": 100})
    core.spark_totals.add("fwd", "enrich", {"durationMs": {"triggerExecution": 2000},
                                            "numInputRows": 50})  # fmt: skip
    m = scrape(core)
    key = (("app", "fwd"), ("node", "enrich"))
    assert m["typhoon_spark_batches_total"] == {key: 2}
    assert m["typhoon_spark_input_rows_total"] == {key: 150}
    assert m["typhoon_spark_batch_duration_seconds_count"] == {key: 2}
    assert m["typhoon_spark_batch_duration_seconds_sum"][key] == pytest.approx(2.4)
    assert m["typhoon_spark_batch_duration_seconds_bucket"][(*key[:1], ("le", "0.5"), key[1])] == 1


def test_get_metrics_route_needs_no_token(core):
    core.metrics_registry = registry(core)
    wsgi = WSGIApplication()
    wsgi.register(TyphoonRest, {"core": core, "token": "s3cret"})
    resp = Request.blank("/metrics").get_response(wsgi)
    assert resp.status_int == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    names = {f.name for f in text_string_to_metric_families(resp.body.decode())}
    assert "typhoon_worker_tuples_in" in names


DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "typhoon.json"


def panels(items: list[dict]) -> list[dict]:
    out = []
    for p in items:
        out.append(p)
        out.extend(panels(p.get("panels", [])))
    return out


def test_every_dashboard_query_names_metrics_the_collector_exports(core):
    core.spark_totals.add("fwd", "enrich", {"batch_ms": 400, "input_rows": 100})
    exported = set(scrape(core, fake_apps()))  # sample names: *_total, *_bucket, gauges
    dash = json.loads(DASHBOARD.read_text())
    queries = [p for p in panels(dash["panels"]) if p["type"] != "row"]
    assert len(queries) >= 10
    used = set()
    for p in queries:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            names = set(re.findall(r"\btyphoon_[a-z_]+\b", t["expr"]))
            assert names, (p["title"], t["expr"])
            unknown = names - exported
            assert not unknown, (p["title"], unknown)
            used |= names
    # the panels: throughput per node, queue depth, drops, fault incidents
    for name in (
        "typhoon_worker_tuples_in_total",
        "typhoon_worker_queue_tuples",
        "typhoon_worker_dropped_frames_total",
        "typhoon_fault_incidents_total",
    ):
        assert name in used
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert re.findall(r"\btyphoon_[a-z_]+\b", variables["app"]["definition"])[0] in exported


def test_event_time_watermark_per_worker(core):
    """docs/windows.md: a worker's watermark and its windows' drops, where it has them."""
    one, two = core.ids[("sink", 0)], core.ids[("sink", 1)]
    core.worker_metrics["fwd"][one].update(watermark=12_345, watermark_closed=0, window_late=3)
    core.worker_metrics["fwd"][two].update(watermark=None, watermark_closed=1)
    m = scrape(core)
    assert m["typhoon_worker_watermark"] == {labels(core, "sink", 0): 12_345}
    assert m["typhoon_worker_watermark_closed"][labels(core, "sink", 1)] == 1
    assert m["typhoon_worker_window_late_tuples_total"] == {labels(core, "sink", 0): 3}
