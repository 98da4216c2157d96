"""The four control-plane apps in one ``ryu-manager`` process, with one controller core.

Each app's own test file starts it alone; this one loads all four together,
checks that every app answers on the shared REST API, and runs a job under
them: a live-debugger session receives the tuples it mirrors.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

from harness import emulated_cluster, ryu_apps, wait

from mininet_env.run import rest_call
from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report, read_worker_reports
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]

APPS = ["apps/fault_detector.py", "apps/live_debugger.py", "apps/load_balancer.py",
        "apps/autoscaler.py"]  # fmt: skip


def test_all_four_apps_in_one_ryu_manager(tmp_path):
    with ryu_apps(tmp_path, APPS) as ryu:
        answers: dict[str, int] = {}

        def every_app_answers():
            for path in ("/faults", "/lb", "/autoscaler", "/apps"):
                got = ryu.get(path)
                if got is not None:
                    answers[path] = got[0]
            return len(answers) == 4

        wait(every_app_answers, 60, "every app's REST API", interval=0.3)
        assert answers == {"/faults": 200, "/lb": 200, "/autoscaler": 200, "/apps": 200}
        # one application's report: 404 with a sentence when it has none
        for path, says in (
            ("/apps/nope/lb", "no balanced stream"),
            ("/apps/nope/autoscaler", "no managed node"),
        ):
            status, body = rest_call(ryu.url, "GET", path)
            assert status == 404 and says in body["error"], (path, status, body)
    text = ryu.log()
    assert text.count("instantiating app controller.core") == 1
    for app in APPS:
        assert f"instantiating app {app}" in text, text[-3000:]


def test_the_four_apps_serve_one_running_job(tmp_path):
    """All four apps in one controller, on an emulated cluster running wordcount: a live
    debugger session on split[0] receives the words split[0] emits (checked against the
    words of the input sentences, computed here), and the counts stay exact."""
    sentences = list(generate_sentences(12_000, 7, 8, 500))
    vocabulary = {w for s in sentences for w in s.split()}
    with emulated_cluster(tmp_path, "a", apps=APPS, timeout=300) as c:
        t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
        t.name = "wcall"
        t.nodes["source"].args.update(count=len(sentences), rate=1_500)
        c.submit(t)
        c.wait_active(t.name)
        post = lambda body: c.rest("POST", f"/apps/{t.name}/debug", body)  # noqa: E731
        status, session = wait(
            lambda: (r := post({"worker": "split[0]", "direction": "out"}))[0] != 409 and r,
            20,
            "split[0] attached for debugging",
        )
        assert status == 201, session
        path = f"/apps/{t.name}/debug/{session['session']}"

        def records():
            status, page = c.rest("GET", f"{path}/tuples?after=0&limit=1000")
            return status == 200 and len(page["records"]) >= 50 and page["records"]

        got = wait(records, 60, "mirrored tuples of split[0] at the debugger")
        split0 = c.coordinator.get_physical(t.name).of_node("split")[0].worker_id
        assert all(r["src"] == split0 for r in got), got[:3]
        assert {r["fields"]["word"] for r in got} <= vocabulary, got[:3]
        assert c.rest("DELETE", path)[0] == 200
        assert c.wait_finished(t.name)
        report = build_report(t, read_worker_reports(c.report_dir(t.name)), ok=True)
        c.kill(t.name)
    want = Counter(w for s in sentences for w in s.split())
    assert report["results"]["count"]["counts"] == dict(want)
