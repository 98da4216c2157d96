"""The daemons as an operator starts them: typhoon-controller and typhoon-agent.

``typhoon-controller`` writes a Ryu config from the sample deploy/controller.conf
and runs ryu-manager with the core and an app; a real userspace bridge connects
to it and gets the core's rules, and the REST API holds the tokens from the token
files (a read token: every GET needs it, /metrics as a bearer token) and refuses
a chunked body over its limit.  ``typhoon-agent`` is started with the command line of
deploy/systemd/typhoon-agent.service.
"""

from __future__ import annotations

import http.client
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, free_port, run

from controller.framework import backend
from mininet_env.run import rest_call
from typhoon.coordinator import SqliteCoordinator

BIN = Path(sys.executable).parent


def command(script: str, module: str) -> list[str]:
    """The console script if this environment has it, else the module it runs."""
    exe = BIN / script
    return [str(exe)] if exe.exists() else [sys.executable, "-m", module]


def http_status(port: int, method: str, path: str, headers: dict, chunks=None) -> int:
    """The status of one request (``chunks``: a body sent with Transfer-Encoding: chunked)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=chunks, headers=headers, encode_chunked=chunks is not None)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


@pytest.mark.parametrize("framework", ["ryu", "os-ken"])
def test_controller_daemon_serves_switches_and_rest(tmp_path, net_names, ovs, framework):
    """On Ryu (scripts/setup.sh's venv) and on os-ken (a plain `pip install`, Python 3.12+)."""
    if framework == "ryu" and not backend.installed("ryu"):
        # optional only where it cannot be installed (README: Ryu is Python 3.11 only)
        if sys.version_info[:2] == (3, 11):
            pytest.fail("Ryu is not installed in this Python 3.11 venv: run `make setup`")
        pytest.skip("Ryu is not installed (the `ryu` extra; Python 3.11 only)")
    ofp, wsapi = free_port(), free_port()
    token = tmp_path / "api-token"
    token.write_text("t0ken\n")
    read_token = tmp_path / "read-token"
    read_token.write_text("r3ad\n")
    runtime = tmp_path / "run"
    argv = [
        *command("typhoon-controller", "controller.daemon"),
        "--config", str(REPO / "deploy/controller.conf"),  # the sample, with overrides
        "--coordinator", str(tmp_path / "c.db"),
        "--ofp-listen-host", "127.0.0.1", "--ofp-port", str(ofp),
        "--wsapi-port", str(wsapi), "--api-token-file", str(token),
        "--read-token-file", str(read_token),
        "--app", "fault_detector", "--runtime-dir", str(runtime), "--backend", framework,
    ]  # fmt: skip
    log = tmp_path / "controller.log"
    bridge = net_names.switch("d")
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        ovs.wait_for(lambda: proc.poll() is not None or listening(ofp), 60, what="OpenFlow port")
        assert proc.poll() is None, log.read_text()
        conf = runtime / "ryu.conf"
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600  # it holds the token
        assert "api_token = t0ken" in conf.read_text()

        run("ovs-vsctl", "add-br", bridge, "--", "set", "Bridge", bridge,
            "datapath_type=netdev", "fail_mode=secure", "protocols=OpenFlow13",
            f"other-config:datapath-id={net_names.dpid(1)}")  # fmt: skip
        run("ovs-vsctl", "set-controller", bridge, f"tcp:127.0.0.1:{ofp}")
        ovs.wait_for(lambda: ovs.controller_connected(bridge), 30, what="the switch to connect")
        ovs.wait_for(lambda: ovs.flows(bridge), 30, what="the core's default rules")

        framework_module = framework.replace("-", "_")
        assert f"{framework_module}.controller.ofp_handler" in log.read_text()  # the one asked
        url = f"http://127.0.0.1:{wsapi}"
        assert rest_call(url, "GET", "/apps")[0] == 401  # a read token is set
        assert rest_call(url, "GET", "/apps", token="r3ad")[0] == 200
        assert rest_call(url, "DELETE", "/apps/none", token="r3ad")[0] == 403
        assert rest_call(url, "DELETE", "/apps/none")[0] == 401
        assert rest_call(url, "DELETE", "/apps/none", token="t0ken")[0] == 404
        assert http_status(wsapi, "GET", "/metrics", {}) == 401
        assert http_status(wsapi, "GET", "/metrics", {"Authorization": "Bearer r3ad"}) == 200
        big = (b"x" * 65536 for _ in range(20))  # 1.25 MiB, chunked: no Content-Length
        headers = {"X-Typhoon-Token": "t0ken", "Content-Type": "application/yaml"}
        assert http_status(wsapi, "POST", "/typhoon/apps", headers, big) == 413
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=10)
        run("ovs-vsctl", "--if-exists", "del-br", bridge, check=False)
    assert code in (0, -signal.SIGTERM), log.read_text()


def test_agent_starts_as_its_systemd_unit_says(tmp_path, ovs):
    unit = (REPO / "deploy/systemd/typhoon-agent.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    words = shlex.split(exec_start.removeprefix("ExecStart="))
    assert words[0] == "/opt/typhoon/bin/typhoon-agent"
    env = {"TYPHOON_HOST": "h9", "TYPHOON_COORDINATOR": str(tmp_path / "c.db")}
    args = [env.get(w[2:-1], w) if w.startswith("${") else w for w in words[1:]]
    args[args.index("--workdir") + 1] = str(tmp_path / "work")  # not /var/lib/typhoon
    argv = [*command("typhoon-agent", "typhoon.agent"), *args]
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **env})  # fmt: skip
    coord = SqliteCoordinator(tmp_path / "c.db")
    try:
        state = ovs.wait_for(lambda: proc.poll() is None and coord.get_agent("h9"), 30,
                             what=f"agents/h9\n{log.read_text()}")  # fmt: skip
        assert state.pid == proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    assert code == 0, log.read_text()
    assert coord.get_agent("h9") is None  # a clean stop takes its record away
    coord.close()
