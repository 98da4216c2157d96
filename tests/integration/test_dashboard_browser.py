"""The web dashboard in a real browser: headless Chromium (Selenium) opens the
controller's ``/dashboard`` while a topology runs on an emulated cluster; the graph
shows the application's workers, a node's rate goes above zero, the page's
scale button (behind the token) adds a worker, seen through REST, the spout's
deactivate, rate and activate buttons are obeyed by its worker (its metrics),
and the debugger attached from the page shows the worker's tuples.

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package
(``scripts/setup.sh`` installs them).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
import yaml
from harness import emulated_cluster, wait
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.support.select import Select

from mininet_env.browser import headless_chromium
from typhoon.topology import load_topology_text

pytestmark = pytest.mark.integration
T = TypeVar("T")

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


# The page redraws the graph and the panels at every poll (once a second): read it in
# one script each time, never through element references that a redraw leaves stale.


def graph_workers(driver) -> dict[str, tuple[str, str]]:
    """Worker id -> (node, host) as the page's SVG graph draws them."""
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#graph g.worker')].map(e => ["
        "e.getAttribute('data-worker'), e.getAttribute('data-node'), "
        "e.getAttribute('data-host')])"
    )
    return {w: (node, host) for w, node, host in rows}


def node_rate(driver, node: str) -> float:
    rate = driver.execute_script(
        "const n = [...document.querySelectorAll('#graph g.node')]"
        ".find(e => e.getAttribute('data-node') === arguments[0]);"
        "return n ? n.getAttribute('data-rate') : null",
        node,
    )
    return float(rate) if rate is not None else 0.0


def edge_rates(driver) -> list[float]:
    rates = driver.execute_script(
        "return [...document.querySelectorAll('#graph g.edge')]"
        ".map(e => e.getAttribute('data-rate'))"
    )
    return [float(r) for r in rates]


def chart_rate(driver, node: str) -> str:
    """The current rate printed above ``node``'s chart."""
    return driver.execute_script(
        "const c = [...document.querySelectorAll('.chart')]"
        ".find(e => e.getAttribute('data-node') === arguments[0]);"
        "return c ? c.querySelector('.current').textContent : ''",
        node,
    )


def debug_tuples(driver) -> str:
    """The text of every debug session's tuple box."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#debug .tuples')].map(e => e.textContent)"
        ".join('\\n')"
    )


def retry_stale(action: Callable[[], T], tries: int = 5) -> T:
    """Run a find-then-act step again if a redraw replaced the element in between."""
    for attempt in range(tries):
        try:
            return action()
        except StaleElementReferenceException:
            if attempt == tries - 1:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


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
        hosts = driver.execute_script(
            "return [...document.querySelectorAll('#hosts .host')]"
            ".map(e => e.getAttribute('data-host'))"
        )
        assert hosts == ["h1", "h2"]

        # live rates: the sink's input, its chart, and a stream's label
        wait(lambda: node_rate(driver, "sink") > 0, 20, "a non-zero rate on the page")
        wait(lambda: chart_rate(driver, "sink") not in ("", "0/s"), 10, "the sink's chart")
        assert any(r > 0 for r in edge_rates(driver)), edge_rates(driver)

        # actions need the token: refused in the page without it, then typed in
        scale = 'button[data-action="scale"][data-node="mid"]'
        retry_stale(lambda: driver.find_element("css selector", scale).click())
        result = driver.find_element("id", "action-result")
        assert "enter the token first" in result.text
        driver.find_element("id", "token").send_keys(cluster.token)
        driver.find_element("css selector", "#token-form button").click()
        assert driver.find_element("id", "token-state").text == "set"

        def scale_to_3() -> None:
            field = driver.find_element("css selector", 'input[data-scale-node="mid"]')
            field.clear()
            field.send_keys("3")
            driver.find_element("css selector", scale).click()

        retry_stale(scale_to_3)
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

        # the spout's Table 2 buttons: deactivate, a rate, activate, each obeyed by the
        # worker as its metrics say (tuples out stop, then the rate, then emission again)
        source = next(w for w, (node, _) in want.items() if node == "source")

        def metrics() -> dict:
            return cluster.coordinator.get_metrics("dash").get(int(source), {})

        def click(action: str, rate: str | None = None) -> None:
            if rate is not None:
                field = driver.find_element("css selector", 'input[data-rate-node="source"]')
                field.clear()
                field.send_keys(rate)
            button = f'button[data-action="{action}"][data-node="source"]'
            driver.find_element("css selector", button).click()

        for action, rate, what, obeyed in (
            ("deactivate", None, "DEACTIVATE", lambda m: m.get("active") == 0),
            ("input-rate", "500", "INPUT_RATE", lambda m: m.get("rate") == 500.0),
            ("activate", None, "ACTIVATE", lambda m: m.get("active") == 1),
        ):
            retry_stale(lambda a=action, r=rate: click(a, r))
            wait(lambda w=what: result.text.startswith(f"{w} source: 202"), 10,
                 f"the {what} request to be accepted", explain=lambda: result.text)  # fmt: skip
            wait(lambda ok=obeyed: ok(metrics()), 10, f"{what} obeyed by the source",
                 explain=lambda: str(metrics()))  # fmt: skip
            if what == "DEACTIVATE":  # stopped: its count stays put across fresh answers
                count = sum(metrics()["out"].values())
                last = metrics()["time"]
                wait(lambda t=last: metrics()["time"] > t + 0.5, 10, "newer metrics")
                assert sum(metrics()["out"].values()) == count, metrics()

        # the debugger, attached from the page to the source: its last tuples show up

        def attach() -> None:
            Select(driver.find_element("id", "debug-worker")).select_by_value(source)
            Select(driver.find_element("id", "debug-direction")).select_by_value("out")
            driver.find_element("css selector", 'button[data-action="attach"]').click()

        retry_stale(attach)
        wait(lambda: result.get_attribute("data-status") == "201", 10,
             "the debugger to be attached", explain=lambda: result.text)  # fmt: skip
        seen = re.compile(r"#\d+ source\[0\] → mid\[\d\] s1: ")  # a tuple source -> mid
        wait(lambda: seen.search(debug_tuples(driver)), 20, "debugged tuples on the page",
             explain=lambda: str(cluster.rest("GET", "/apps/dash/debug")))  # fmt: skip
        status, sessions = cluster.rest("GET", "/apps/dash/debug")
        assert status == 200 and [s["worker"] for s in sessions] == [int(source)], sessions
        cluster.kill("dash")
    print(f"dashboard browser test: {time.monotonic() - started:.1f} s")
