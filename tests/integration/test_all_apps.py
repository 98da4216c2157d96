"""The four control-plane apps in one ``ryu-manager`` process, with one controller core.

Each app's own test file starts it alone; this one loads all four together
and checks that every app answers on the shared REST API.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from mininet_env.processes import free_port
from mininet_env.run import rest_call

ROOT = Path(__file__).resolve().parents[2]
APPS = ["apps/fault_detector.py", "apps/live_debugger.py", "apps/load_balancer.py",
        "apps/autoscaler.py"]  # fmt: skip


def test_all_four_apps_in_one_ryu_manager(tmp_path):
    conf = tmp_path / "ryu.conf"
    conf.write_text(f"[typhoon]\ncoordinator = {tmp_path / 'c.db'}\napi_token = t\n")
    port, ofp = free_port(), free_port()
    log_path = tmp_path / "ryu.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("ryu-manager")), "--config-file", str(conf),
             "--wsapi-host", "127.0.0.1", "--wsapi-port", str(port),
             "--ofp-tcp-listen-port", str(ofp), *APPS],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}/typhoon"
            deadline = time.monotonic() + 60
            answers: dict[str, int] = {}
            while time.monotonic() < deadline and len(answers) < 4:
                assert proc.poll() is None, log_path.read_text()
                for path in ("/faults", "/lb", "/autoscaler", "/apps"):
                    try:
                        answers[path] = rest_call(url, "GET", path)[0]
                    except OSError:
                        pass
                time.sleep(0.3)
            assert answers == {"/faults": 200, "/lb": 200, "/autoscaler": 200, "/apps": 200}
            # one application's report: 404 with a sentence when it has none
            for path, says in (
                ("/apps/nope/lb", "no balanced stream"),
                ("/apps/nope/autoscaler", "no managed node"),
            ):
                status, body = rest_call(url, "GET", path)
                assert status == 404 and says in body["error"], (path, status, body)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    text = log_path.read_text()
    assert text.count("instantiating app controller.core") == 1
    for app in APPS:
        assert f"instantiating app {app}" in text, text[-3000:]
