"""The ZooKeeper coordinator inside ryu-manager's eventlet monkey-patching.

Green threads of one process call the coordinator at once, as the controller's
core, REST API and apps do.  ryu-manager patches everything but threads at
import, then threads too (unless --enable-debugger).  kazoo's threading handler
lost its session there: fully patched, its selector blocked the hub (every
request ended in ConnectionLoss); with real threads, its thread's green I/O
missed its deadlines ("Connection time-out: socket time-out during write").
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    from ryu.lib import hub
    hub.patch(thread=False)  # what ryu-manager does at import
    if sys.argv[2] == "threads":
        hub.patch(thread=True)  # and then, without --enable-debugger
    import logging, time
    import eventlet
    from typhoon.coordinator import open_coordinator
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    c = open_coordinator(sys.argv[1])
    print("handler", type(c._client.handler).__name__)
    done = []
    def worker(k):
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4:
            c.put(f"x/{k}", {"k": k}); c.changes_since(0); c.agents()
            done.append(k)
            eventlet.sleep(0.01 * k)
    for g in [eventlet.spawn(worker, k) for k in range(4)]:
        g.wait()
    c.close()
    print("ops", len(done))
    """
)


@pytest.mark.parametrize(
    ("threads", "handler"),
    [("threads", "SequentialEventletHandler"), ("no-threads", "NativeThreadingHandler")],
)
def test_green_threads_share_one_session_without_time_outs(zookeeper_server, threads, handler):
    url = f"zk://{zookeeper_server.hosts}/eventlet-{threads}"
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, threads], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Connection time-out" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert "Zookeeper connection lost" not in out.stdout + out.stderr
    assert f"handler {handler}" in out.stdout
    assert int(out.stdout.split("ops")[-1]) > 100
