"""The web dashboard in a real browser: headless Chromium (Selenium) opens the
controller's ``/dashboard`` while a topology runs on an emulated cluster; the graph
shows the application's workers, a node's rate goes above zero, the page's
scale button (behind the token) adds a worker, seen through REST, and the
debugger attached from the page shows the worker's tuples.

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package
(``scripts/setup.sh`` installs them).
"""

from __future__ import annotations

import re
import time

import pytest
import yaml
from harness import emulated_cluster, wait
from selenium.webdriver.support.select import Select

from mininet_env.browser import headless_chromium
from typhoon.topology import load_topology_text

pytestmark = pytest.mark.integration

APPS = ["apps/fault_detector.py", "apps/live_debugger.py"]

FLOW = {
    "name": "dash",
    "spouts": [{"id": "source", "operator": "sequence_source", "args": {"rate": 4000, "size": 50}}],
    "bolts": [
        {"id": "mid", "operator": "identity", "parallelism": 2},
        {"id": "sink", "operator": "sequence_check"},
    ],
    "streams": [
        {"from": "source", "to": "mid", "grouping": "shuffle"},
        {"from": "mid", "to": "sink", "grouping": "shuffle"},
    ],
}


def graph_workers(driver) -> dict[str, tuple[str, str]]:
    """Worker id -> (node, host) as the page's SVG graph draws them."""
    found = driver.find_elements("css selector", "#graph g.worker")
    return {
        e.get_attribute("data-worker"): (e.get_attribute("data-node"), e.get_attribute("data-host"))
        for e in found
    }


def node_rate(driver, node: str) -> float:
    found = driver.find_elements("css selector", f'#graph g.node[data-node="{node}"]')
    return float(found[0].get_attribute("data-rate")) if found else 0.0


def chart_rate(driver, node: str) -> str:
    """The current rate printed above ``node``'s chart (redrawn at every poll)."""
    found = driver.find_elements("css selector", f'.chart[data-node="{node}"] .current')
    return found[0].text if found else ""


def debug_tuples(driver) -> str:
    """The text of every debug session's tuple box."""
    return "\n".join(e.text for e in driver.find_elements("css selector", "#debug .tuples"))


def expected_workers(cluster, name: str) -> dict[str, tuple[str, str]]:
    status, app = cluster.rest("GET", f"/apps/{name}")
    assert status == 200, app
    return {str(w["worker"]): (w["node"], w["host"]) for w in app["workers"]}


def test_dashboard_shows_workers_and_rates_and_scales_a_node(tmp_path):
    started = time.monotonic()
    with (
        headless_chromium() as driver,  # BrowserMissing says what to install
        emulated_cluster(tmp_path, "db", hosts=2, apps=APPS) as cluster,
    ):
        cluster.submit(load_topology_text(yaml.safe_dump(FLOW)))
        cluster.wait_active("dash")
        page = f"http://127.0.0.1:{cluster.wsapi_port}/dashboard"
        driver.get(page)

        # the graph: exactly the application's workers, on their nodes and hosts
        want = expected_workers(cluster, "dash")
        assert sorted(n for n, _ in want.values()) == ["mid", "mid", "sink", "source"]
        wait(lambda: graph_workers(driver) == want, 20, "the graph to show every worker",
             explain=lambda: f"page: {graph_workers(driver)}, REST: {want}")  # fmt: skip
        hosts = driver.find_elements("css selector", "#hosts .host")
        assert [h.get_attribute("data-host") for h in hosts] == ["h1", "h2"]

        # live rates: the sink's input, its chart, and a stream's label
        wait(lambda: node_rate(driver, "sink") > 0, 20, "a non-zero rate on the page")
        wait(lambda: chart_rate(driver, "sink") not in ("", "0/s"), 10, "the sink's chart")
        assert any(
            float(e.get_attribute("data-rate")) > 0
            for e in driver.find_elements("css selector", "#graph g.edge")
        )

        # actions need the token: refused in the page without it, then typed in
        scale = driver.find_element("css selector", 'button[data-action="scale"][data-node="mid"]')
        scale.click()
        result = driver.find_element("id", "action-result")
        assert "enter the token first" in result.text
        driver.find_element("id", "token").send_keys(cluster.token)
        driver.find_element("css selector", "#token-form button").click()
        assert driver.find_element("id", "token-state").text == "set"

        field = driver.find_element("css selector", 'input[data-scale-node="mid"]')
        field.clear()
        field.send_keys("3")
        driver.find_element("css selector", 'button[data-action="scale"][data-node="mid"]').click()
        wait(lambda: result.get_attribute("data-status") == "202", 10,
             "the scale request to be accepted", explain=lambda: result.text)  # fmt: skip

        def scaled() -> dict | None:
            status, app = cluster.rest("GET", "/apps/dash")
            mids = [w for w in app["workers"] if w["node"] == "mid" and w["role"] == "active"]
            done = (app.get("reconfig") or {}).get("state") == "done"
            return app if status == 200 and len(mids) == 3 and done else None

        app = wait(scaled, 30, "a third mid worker (REST)",
                   explain=lambda: str(cluster.rest("GET", "/apps/dash/reconfig")))  # fmt: skip
        assert app["nodes"]["mid"]["parallelism"] == 3
        want = {str(w["worker"]): (w["node"], w["host"]) for w in app["workers"]}
        wait(lambda: graph_workers(driver) == want, 10, "the graph to show the new worker",
             explain=lambda: f"page: {graph_workers(driver)}, REST: {want}")  # fmt: skip

        # the debugger, attached from the page to the source: its last tuples show up
        source = next(w for w, (node, _) in want.items() if node == "source")
        Select(driver.find_element("id", "debug-worker")).select_by_value(source)
        Select(driver.find_element("id", "debug-direction")).select_by_value("out")
        driver.find_element("css selector", 'button[data-action="attach"]').click()
        wait(lambda: result.get_attribute("data-status") == "201", 10,
             "the debugger to be attached", explain=lambda: result.text)  # fmt: skip
        seen = re.compile(r"#\d+ source\[0\] → mid\[\d\] s1: ")  # a tuple source -> mid
        wait(lambda: seen.search(debug_tuples(driver)), 20, "debugged tuples on the page",
             explain=lambda: str(cluster.rest("GET", "/apps/dash/debug")))  # fmt: skip
        status, sessions = cluster.rest("GET", "/apps/dash/debug")
        assert status == 200 and [s["worker"] for s in sessions] == [int(source)], sessions
        cluster.kill("dash")
    print(f"dashboard browser test: {time.monotonic() - started:.1f} s")
