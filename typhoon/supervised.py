"""One supervised process: how every runner starts, watches and stops its children.

The agent (workers), its debug workers and engine services, the tcp runner and
the emulation (controller, agents) all need the same few things of a process:
start it with its output in a log file, in a session of its own so a signal
reaches whatever it started too; ask whether it ended and with what code; stop
it with SIGTERM, then SIGKILL after a timeout.  An agent that restarts also
*adopts* the workers an earlier run left alive: it only has their pid, so
psutil tells whether that pid is still the same process (its start time, not a
reused pid) and not a zombie, and what its command line is -- waiting a moment
for one that is still starting, whose command line is still its parent's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Protocol

import psutil

# How long a process may take from fork to exec: a younger process whose command
# line lacks the marker may still be starting; an older one is not ours.
ADOPT_EXEC_TIMEOUT_S = 5.0
ADOPT_POLL_S = 0.01


def command_line(raw: Sequence[str]) -> list[str]:
    """A process's arguments from ``psutil``'s ``cmdline()``, also for a retitled one.

    A worker forked by the zygote (typhoon.runtime.zygote_server) shows its command
    line as one title (setproctitle): psutil gives it as one space-joined string
    followed by empty ones; split back, it reads as a spawned worker's.
    """
    args = list(raw)
    while len(args) > 1 and args[-1] == "":
        args.pop()
    if len(args) == 1 and " " in args[0]:
        return args[0].split(" ")
    return args


class Process(Protocol):
    """What a started process offers: a ``Popen``, or a worker forked by the zygote
    (typhoon.zygote.ZygoteChild, whose exit code comes from the zygote)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


def code_lost(proc: Process) -> bool:
    """Did it end with no exit code to know?  An agent's forked worker whose zygote
    died before it (typhoon.zygote.ZygoteChild.code_lost): a ``Popen`` never does."""
    return bool(getattr(proc, "code_lost", False))


class Supervised:
    """A child process (``proc``) or an adopted one (pid only), with its log file."""

    def __init__(
        self,
        name: str,
        proc: Process | None,
        *,
        adopted: psutil.Process | None = None,
        log: Path | None = None,
        logfile: IO[bytes] | None = None,
        own_session: bool = True,
    ) -> None:
        if (proc is None) == (adopted is None):
            raise ValueError("a supervised process is either started (proc) or adopted")
        self.name = name
        self.proc = proc
        self.log = log
        self.own_session = own_session  # signals go to its process group
        self._adopted = adopted
        self._logfile = logfile

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        log: Path,
        *,
        append: bool = True,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        own_session: bool = True,
    ) -> Supervised:
        """Start ``argv`` with stdout and stderr in ``log`` and no stdin.

        ``own_session``: a new session, so a terminal's signals reach only its
        parent and :meth:`signal_group` reaches everything it started.
        """
        logfile = open(log, "ab" if append else "wb")  # noqa: SIM115 - closed by close_log()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=own_session,
            )
        except BaseException:
            logfile.close()
            raise
        return cls(name, proc, log=log, logfile=logfile, own_session=own_session)

    @classmethod
    def adopt(
        cls, name: str, pid: int, marker: str, *, exec_timeout: float = ADOPT_EXEC_TIMEOUT_S
    ) -> Supervised | None:
        """The live process ``pid`` if ``marker`` is one of its arguments, else None.

        A process still starting shows its parent's command line (forked, not
        yet exec'ed) or none at all (mid-exec), so a process younger than
        ``exec_timeout`` is watched until its command line carries ``marker``,
        it ends, or it is ``exec_timeout`` old; an older one is judged at once.
        """
        try:
            process = psutil.Process(pid)
            started = process.create_time()
            deadline = time.monotonic() + exec_timeout  # bounds the wait if the clock jumps
            while True:
                if process.status() == psutil.STATUS_ZOMBIE:
                    return None
                if marker in command_line(process.cmdline()):
                    return cls(name, None, adopted=process)
                if time.time() >= started + exec_timeout or time.monotonic() >= deadline:
                    return None
                time.sleep(ADOPT_POLL_S)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            return None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else self._adopted.pid  # type: ignore[union-attr]

    @property
    def returncode(self) -> int | None:
        """The exit code once known (never for an adopted process: it is not our child)."""
        return self.proc.returncode if self.proc is not None else None

    def poll(self) -> int | None:
        """Like ``Popen.poll``: the exit code, or None while it runs."""
        return self.proc.poll() if self.proc is not None else None

    def ended(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is not None or code_lost(self.proc)
        assert self._adopted is not None
        try:
            return not self._adopted.is_running() or self._adopted.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def alive(self) -> bool:
        return not self.ended()

    def exit_status(self) -> tuple[bool, int | None]:
        """(has it ended, its exit code if known)."""
        return self.ended(), self.poll()

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to its process group (anything it started), else to it alone."""
        if self.own_session:
            try:
                os.killpg(self.pid, sig)
                return
            except (ProcessLookupError, PermissionError):
                pass
        self.send_signal(sig)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process alone; nothing if it is gone."""
        try:
            if self.proc is not None:
                self.proc.send_signal(sig)
            else:
                assert self._adopted is not None
                self._adopted.send_signal(sig)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the end (``subprocess.TimeoutExpired`` after ``timeout``)."""
        if self.proc is not None:
            return self.proc.wait(timeout)
        assert self._adopted is not None
        try:
            self._adopted.wait(timeout)
        except psutil.TimeoutExpired as e:
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0) from e
        except psutil.NoSuchProcess:
            pass
        return None

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """Signal it (its group), wait up to ``timeout``, SIGKILL what is left, close the log."""
        if not self.ended():
            self.signal_group(sig)
            try:
                self.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        if self.own_session:
            try:  # what it started may outlive it
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not self.ended():
            self.kill()
        self.wait()
        self.close_log()

    def close_log(self) -> None:
        if self._logfile is not None:
            self._logfile.close()
            self._logfile = None

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` of its log."""
        if self.log is None:
            return ""
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def stop_all(children: Sequence[Supervised], timeout: float = 10.0) -> None:
    """:meth:`Supervised.stop` for several at once: every one is signalled first, so
    they shut down side by side and the wait is the slowest one's, not the sum."""
    live = [c for c in children if not c.ended()]
    for c in live:
        c.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for c in live:
        try:
            c.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for c in children:
        c.stop(timeout=0.0)  # SIGKILL to whatever is left of each, reap, close the log
