"""The four control-plane apps in one ``ryu-manager`` process, with one controller core.

Each app's own test file starts it alone; this one loads all four together
and checks that every app answers on the shared REST API.
"""

from __future__ import annotations

from harness import ryu_apps, wait

from mininet_env.run import rest_call

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
