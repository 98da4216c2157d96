"""The process plumbing of the servers tests start (Redis, PostgreSQL, NATS, ZooKeeper,
ryu-manager): a free loopback port, a child that dies with pytest, and a stop that
always reaps.  Imported by name (``tests/`` is on ``sys.path``), as ``dbservers`` is."""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess


def free_port() -> int:
    """A loopback TCP port nothing listens on now (another may take it before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """A ``preexec_fn``: runs in the child before exec, so the server gets SIGTERM when
    pytest exits, however it exits (PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it is still there after 10 s; reaped either way.  A
    process that ended already is left as it is."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
