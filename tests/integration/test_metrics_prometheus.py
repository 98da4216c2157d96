"""See it run: a real Prometheus server scrapes the controller's ``GET /metrics`` while an
emulated topology runs, and its query API gives each worker's tuple rate; a bolt that
raises ends an sdn run with its traceback in the report.

Needs ``/usr/bin/prometheus`` (Debian's ``prometheus``, installed by scripts/setup.sh).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from harness import ROOT, emulated_cluster, stop_process, wait

from mininet_env.processes import free_port
from typhoon.topology import load_topology_text

pytestmark = pytest.mark.integration

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
FAILING_OPS = ROOT / "tests" / "runtime"  # failing_ops.py: an operator that raises

STEADY = {
    "name": "steady",
    "spouts": [
        {
            "id": "source",
            "operator": "sequence_source",
            "args": {"count": 150_000, "rate": 10_000},
            "parallelism": 2,
        }
    ],
    "bolts": [
        {"id": "mid", "operator": "identity", "parallelism": 2},
        {"id": "sink", "operator": "sequence_check"},
    ],
    "streams": [
        {"from": "source", "to": "mid", "grouping": "shuffle"},
        {"from": "mid", "to": "sink", "grouping": "shuffle"},
    ],
}

EXPLODE = {
    "name": "explode",
    "spouts": [{"id": "source", "operator": "sequence_source", "args": {"count": 5000}}],
    "bolts": [
        {"id": "boom", "operator": "failing_ops:Explode", "args": {"after": 100}},
        {"id": "sink", "operator": "sequence_check"},
    ],
    "streams": [
        {"from": "source", "to": "boom", "grouping": "shuffle"},
        {"from": "boom", "to": "sink", "grouping": "shuffle"},
    ],
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two emulated hosts; agents (and so workers) can import failing_ops."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAILING_OPS), old) if p)
    sys.path.insert(0, str(FAILING_OPS))
    try:
        with emulated_cluster(tmp_path_factory.mktemp("metrics"), "pm", hosts=2) as c:
            yield c
    finally:
        sys.path.remove(str(FAILING_OPS))
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def http_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.fixture
def prometheus(cluster, tmp_path):
    """A Prometheus server scraping the controller every second; yields its URL."""
    if not Path(PROMETHEUS).exists():
        pytest.fail(f"{PROMETHEUS} not found: run `make setup` (apt package prometheus)")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "typhoon",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [f"127.0.0.1:{cluster.wsapi_port}"]}],
            }
        ],
    }
    conf = tmp_path / "prometheus.yml"
    conf.write_text(yaml.safe_dump(config))
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={conf}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return proc.poll() is not None  # died: stop waiting, the assert says so

    try:
        wait(ready, 30, "Prometheus to be ready")
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        yield url
    finally:
        stop_process(proc)
        log.close()


def query(url: str, promql: str) -> list[dict]:
    reply = http_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert reply["status"] == "success", reply
    return reply["data"]["result"]


def test_prometheus_sees_every_worker_move_tuples(cluster, prometheus):
    topology = load_topology_text(yaml.safe_dump(STEADY))
    started = time.monotonic()
    cluster.submit(topology)
    cluster.wait_active("steady")
    workers = {str(w.worker_id): w.node for w in cluster.coordinator.get_physical("steady").workers}
    promql = 'rate(typhoon_worker_tuples_in_total{app="steady"}[5s])'

    def moving() -> dict[str, float]:
        rates = {r["metric"]["worker"]: float(r["value"][1]) for r in query(prometheus, promql)}
        receivers = {w for w, node in workers.items() if node != "source"}
        return rates if receivers <= {w for w, r in rates.items() if r > 0} else {}

    rates = wait(moving, 40, "Prometheus to see every receiving worker's rate", interval=0.5)
    seen_after = time.monotonic() - started
    # every tuple reaches the one sink; each mid worker gets about half
    sink = next(w for w, node in workers.items() if node == "sink")
    assert rates[sink] > 1000, rates
    up = query(prometheus, 'up{job="typhoon"}')
    assert [r["value"][1] for r in up] == ["1"]
    out = query(prometheus, 'sum(typhoon_worker_tuples_out_total{app="steady",node="source"})')
    assert float(out[0]["value"][1]) > 0
    flows = query(prometheus, "typhoon_switch_flows")
    assert {r["metric"]["host"] for r in flows} == {"h1", "h2"}
    assert all(float(r["value"][1]) > 0 for r in flows)
    print(f"rates seen by Prometheus {seen_after:.1f} s after submit: {rates}")
    cluster.drain("steady")
    assert cluster.wait_finished("steady")
    cluster.kill("steady")


def test_a_bolt_that_raises_ends_the_sdn_run_with_its_traceback(cluster):
    report = cluster.run(load_topology_text(yaml.safe_dump(EXPLODE)))
    assert not report["ok"]
    first = report["failures"][0]
    assert (first["node"], first["exit_code"]) == ("boom", 1)
    assert first["traceback"][-1] == "ValueError: boom at tuple 101"
    assert first["log"] == str(cluster.workdir / "explode" / f"worker-{first['worker']}.log")
    assert report["problems"][0].startswith(f"worker {first['worker']} (boom[0]) on h")
