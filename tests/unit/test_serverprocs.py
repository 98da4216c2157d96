"""``tests/serverprocs.py``: the stop every test server goes through reaps a running
process (SIGTERM, or SIGKILL for one that ignores it) and leaves an ended one alone; a
child started with ``die_with_parent`` still runs its command."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

from serverprocs import die_with_parent, free_port, stop_process


def test_stop_process_terminates_and_reaps():
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent)
    stop_process(proc)
    assert proc.returncode == -signal.SIGTERM


def test_stop_process_kills_what_ignores_sigterm(monkeypatch):
    code = "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"  # SIGTERM is ignored from here on
    real_wait = proc.wait
    waits: list[float] = []

    def short_wait(timeout=None):  # noqa: ANN001, ANN202
        waits.append(timeout)
        return real_wait(timeout=0.2 if len(waits) == 1 else timeout)

    monkeypatch.setattr(proc, "wait", short_wait)
    stop_process(proc)
    assert proc.returncode == -signal.SIGKILL and waits == [10, 10]
    proc.stdout.close()


def test_stop_process_leaves_an_ended_process_alone():
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    stop_process(proc)
    assert proc.returncode == 0


def test_free_port_can_be_bound():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
