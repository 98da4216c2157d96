"""typhoon/supervised.py with real child processes: start, exit codes, group stop, adoption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from typhoon.supervised import Supervised, stop_all

PY = sys.executable


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_exit_code_and_log(tmp_path):
    p = Supervised.start("w", [PY, "-c", "print('hello'); raise SystemExit(3)"], tmp_path / "w.log")
    assert p.wait(10) == 3
    assert p.exit_status() == (True, 3) and p.returncode == 3 and not p.alive()
    p.close_log()
    assert p.tail() == "hello"


def test_log_is_appended_unless_asked(tmp_path):
    log = tmp_path / "w.log"
    for _ in range(2):
        p = Supervised.start("w", [PY, "-c", "print('x')"], log)
        p.wait(10)
        p.stop()
    assert log.read_text() == "x\nx\n"
    p = Supervised.start("w", [PY, "-c", "print('y')"], log, append=False, own_session=False)
    p.wait(10)
    p.stop()
    assert log.read_text() == "y\n"


def test_stop_reaches_what_it_started_and_kills_what_ignores_sigterm(tmp_path):
    # the child starts a grandchild that ignores SIGTERM (and says so), then waits
    grandchild = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(os.getpid(), flush=True); time.sleep(60)"
    )
    code = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(60)"
    )
    log = tmp_path / "w.log"
    p = Supervised.start("w", [PY, "-c", code], log)
    wait_for(lambda: log.read_text().strip())
    grandchild = int(log.read_text().split()[0])
    p.stop(timeout=0.5)
    assert p.returncode == -signal.SIGTERM
    wait_for(lambda: not _exists(grandchild))  # SIGKILLed with its group


def test_adopt_checks_the_command_line_and_sees_the_end(tmp_path):
    marker = str(tmp_path / "worker-1.spec.json")
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(60)", marker])
    try:
        # Popen returns while the kernel may still be setting up the new command line
        wait_for(lambda: marker in _cmdline(proc.pid))
        other = str(tmp_path / "other.spec.json")
        assert Supervised.adopt("w", proc.pid, other, exec_timeout=0.2) is None
        p = Supervised.adopt("w", proc.pid, marker)
        assert p is not None and p.pid == proc.pid and p.alive()
        assert p.exit_status() == (False, None)
        p.send_signal(signal.SIGTERM)
        proc.wait(10)  # reaped by its parent (this test), as the agent's workers are by init
        wait_for(lambda: not p.alive())
        assert p.exit_status() == (True, None)  # not our child: no exit code
    finally:
        proc.kill()
        proc.wait()


def test_adopt_waits_for_a_process_still_starting(tmp_path):
    # the child shows another command line (as a forked, not yet exec'ed worker shows
    # its parent's) until the test creates `go`, then execs into one with the marker
    marker, go = str(tmp_path / "worker-1.spec.json"), tmp_path / "go"
    then = f"[sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}]"
    code = (
        "import os, pathlib, sys, time\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)\n"
        f"os.execv(sys.executable, {then})"
    )
    proc = subprocess.Popen([PY, "-c", code])
    adopted: list[Supervised | None] = []
    waiter = threading.Thread(
        target=lambda: adopted.append(Supervised.adopt("w", proc.pid, marker, exec_timeout=30.0))
    )
    try:
        waiter.start()
        assert marker not in _cmdline(proc.pid)  # it cannot exec before `go` exists
        go.touch()
        waiter.join(60)
        assert len(adopted) == 1 and adopted[0] is not None
        assert adopted[0].pid == proc.pid and adopted[0].alive()
        assert marker in _cmdline(proc.pid)
    finally:
        go.touch()
        proc.kill()
        proc.wait()
        waiter.join(60)


def test_adopt_gives_up_on_a_starting_process_that_ends(tmp_path):
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(0.3)"])
    try:
        assert Supervised.adopt("w", proc.pid, "marker", exec_timeout=30.0) is None
        assert proc.poll() is not None  # it returned because the process ended, not on time
    finally:
        proc.kill()
        proc.wait()


def test_adopt_refuses_a_zombie_and_a_missing_pid(tmp_path):
    proc = subprocess.Popen([PY, "-c", "pass", "marker"])
    wait_for(lambda: _state(proc.pid) == "Z")  # exited, not reaped
    assert Supervised.adopt("w", proc.pid, "marker") is None
    proc.wait()
    assert Supervised.adopt("w", proc.pid, "marker") is None


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return _state(pid) != "Z"


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return ""


def test_stop_all_stops_every_one_and_kills_what_ignores_sigterm(tmp_path):
    polite = Supervised.start("a", [PY, "-c", "import time; time.sleep(60)"], tmp_path / "a.log")
    stubborn_code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    stubborn = Supervised.start("b", [PY, "-c", stubborn_code], tmp_path / "b.log")
    done = Supervised.start("c", [PY, "-c", "pass"], tmp_path / "c.log")
    done.wait(10)
    wait_for(lambda: "ready" in (tmp_path / "b.log").read_text())
    stop_all([polite, stubborn, done], timeout=0.5)
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert done.returncode == 0
    assert all(p._logfile is None for p in (polite, stubborn, done))  # logs closed
