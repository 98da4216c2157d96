"""The ZooKeeper coordinator inside ryu-manager (sockets green, threads real).

Green threads of one process call the coordinator at once, as the controller's
core, REST API and apps do.  kazoo's own threading handler did green I/O on a
real thread there and lost its session under this load ("Connection time-out:
socket time-out during write/read"); the coordinator gives kazoo the unpatched
socket and select modules instead.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    from ryu.lib import hub
    hub.patch(thread=False)  # what ryu-manager does first
    import logging, sys, time
    import eventlet
    from typhoon.coordinator import open_coordinator
    from typhoon.coordinator.zookeeper import _NativeThreadingHandler
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    c = open_coordinator(sys.argv[1])
    assert isinstance(c._client.handler, _NativeThreadingHandler), c._client.handler
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


def test_green_threads_share_one_session_without_time_outs(zookeeper_server):
    url = f"zk://{zookeeper_server.hosts}/eventlet"
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, url], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Connection time-out" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert "Zookeeper connection lost" not in out.stdout + out.stderr
    assert int(out.stdout.split("ops")[-1]) > 100
