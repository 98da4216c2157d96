"""The launcher's side of the worker fork server (typhoon.runtime.zygote_server).

:class:`ZygoteLauncher` is a tcp runner launcher (``host, argv, logfile ->
Supervised``), and an sdn host's agent's (typhoon.agent): a worker command line
(``python -m typhoon.runtime.worker SPEC...``) is forked by the zygote it
started, and so is an agent's debug worker (``python -m typhoon.debug.worker
SPEC [--coordinator URL]``); anything else (an engine service, an agent's
``--worker-cmd``) is spawned as before.  The zygote is this process's only way to its
children's exit codes: it reports each one, and :class:`ZygoteChild` answers
``poll``/``wait`` from those reports as ``Popen`` does.  When the zygote is
gone (it died, or never started) every new worker is spawned instead, and the
log says so once; its children die with it (``PR_SET_PDEATHSIG``), so a child
that ended without a report was killed: its code is ``-SIGKILL``.  A worker
is also spawned when this process's working directory or environment changed
since the zygote started, since a child would otherwise run in the old ones.

An agent's zygote is *detached*: its children start sessions of their own and
outlive it, so that an agent that restarts adopts them as it adopts spawned
workers.  When such a zygote dies before the agent, its children live on and
their exit codes are lost: a child's end is then seen through its pidfd, with
no code (``code_lost``), as an adopted worker's.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from typhoon.supervised import Supervised
from typhoon.zygote_protocol import (
    MAX_MESSAGE,
    PROGRAMS,
    Reply,
    ZygoteProtocolError,
    encode,
    reply,
)

log = logging.getLogger(__name__)

WORKER_MODULE = PROGRAMS["worker"]
DEBUG_MODULE = PROGRAMS["debug"]
SERVER_MODULE = "typhoon.runtime.zygote_server"
READY_TIMEOUT_S = 30.0
FORK_TIMEOUT_S = 10.0


class ZygoteGone(RuntimeError):
    """The zygote cannot fork (it exited, refused, or never started)."""


class ZygoteChild:
    """A forked worker as ``Supervised`` sees a ``Popen``: pid, returncode, poll, wait."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None
        self.exit_code: int | None = None  # reported by the zygote; returncode once polled
        self.code_lost = False  # ended after its detached zygote died: no code to know
        try:  # tells when it ended should the zygote be gone; pid-reuse-proof signals
            self.pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # ended and reaped already: its exit report follows
            self.pidfd = None

    def poll(self) -> int | None:
        """As ``Popen.poll``: ``returncode`` changes here (and in :meth:`wait`) only,
        never while the launcher reads the zygote's reports for another child."""
        if self.returncode is None:
            if self.exit_code is None:
                self.zygote.pump(0.0)
            self.returncode = self.exit_code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.exit_code is None and not self.code_lost:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
            self.zygote.pump(0.05 if left is None else min(0.05, left))
        self.returncode = self.exit_code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        with self.zygote.lock:  # a killer thread must not use a pidfd closed meanwhile
            if self.exit_code is None and self.pidfd is not None:  # never a reused pid
                try:
                    signal.pidfd_send_signal(self.pidfd, sig)
                except ProcessLookupError:
                    pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def ended(self, code: int | None) -> None:
        """Its exit code, or None: it ended and nobody can tell how (``code_lost``)."""
        if self.exit_code is None and not self.code_lost:
            self.exit_code = code
            self.code_lost = code is None
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None


class Zygote:
    """A started zygote: fork requests out, replies (forks, exit codes) in."""

    def __init__(
        self,
        logfile: Path,
        preload: Sequence[str] = (),
        checkpoints: bool = False,
        *,
        transport: str = "tcp",
        detach: bool = False,
    ):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", SERVER_MODULE, "--fd", str(theirs.fileno())]
        argv += ["--preload", ",".join(preload)] if preload else []
        argv += ["--checkpoints"] if checkpoints else []
        argv += ["--transport", transport, *(["--detach"] if detach else [])]
        self.detach = detach
        self.cwd = os.getcwd()
        self.env = dict(os.environ)
        self.log = logfile
        self.logfile = open(logfile, "wb")  # noqa: SIM115 - closed by close()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self.logfile,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
                start_new_session=detach,  # an agent's group signals miss it: it ends on EOF
            )
        finally:
            theirs.close()
        self.sock = ours
        self.sock.setblocking(False)
        self.pid = 0  # the zygote's word that it is ready (its imports done)
        self.children: dict[int, ZygoteChild] = {}
        self.exits: dict[int, int] = {}  # codes of children reported before fork() returned
        self.replies: dict[int, Reply] = {}  # request id -> forked or refused
        self.request_ids = iter(range(1, 1 << 62))
        self.gone: str | None = None  # why it cannot fork any more
        self.lock = threading.RLock()  # reports are read, and pidfds closed, under it

    def pump(self, timeout: float) -> None:
        """Read what the zygote said, waiting up to ``timeout`` for the first message."""
        if self.gone is None:
            select.select([self.sock], [], [], timeout)
        else:  # wait for an orphan's end instead
            fds = [c.pidfd for c in self.children.values() if c.pidfd is not None]
            if fds:
                select.select(fds, [], [], timeout)
        with self.lock:
            self._read()

    def _read(self) -> None:
        if self.gone is not None:
            self._reap_orphans()
            return
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError as e:
                self._lost(f"its socket failed: {e}")
                return
            if not data:
                self._lost(f"it exited with {self.proc.wait()}")
                return
            try:
                self._on_reply(reply(data))
            except ZygoteProtocolError as e:
                self._lost(str(e))
                return

    def _on_reply(self, r: Reply) -> None:
        if r.op == "ready":
            self.pid = r.pid
        elif r.op == "exit":
            child = self.children.pop(r.pid, None)
            if child is not None:
                child.ended(r.code)
            else:
                self.exits[r.pid] = r.code
        else:
            self.replies[r.request_id] = r

    def _lost(self, why: str) -> None:
        self.gone = why
        log.error("worker zygote gone (%s; see %s): workers are spawned from now on", why, self.log)
        self.sock.close()
        self._reap_orphans()

    def _reap_orphans(self) -> None:
        """Children left by a dead zygote die with it (PDEATHSIG): once gone, killed.
        A detached zygote's live on: once gone, their codes are lost."""
        for pid, child in list(self.children.items()):
            if child.pidfd is None or select.select([child.pidfd], [], [], 0)[0]:
                del self.children[pid]
                child.ended(None if self.detach else -signal.SIGKILL)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        deadline = time.monotonic() + timeout
        while not self.pid and self.gone is None and time.monotonic() < deadline:
            self.pump(max(0.0, deadline - time.monotonic()))
        if not self.pid and self.gone is None:
            self._lost(f"not ready in {timeout:.0f} s")
        return self.gone is None

    def fork(self, job: ForkJob, log_fd: int) -> ZygoteChild:
        """One process running ``job`` (a topology worker or a debug worker) writing to
        ``log_fd`` (ZygoteGone: cannot)."""
        if not self.wait_ready():
            raise ZygoteGone(self.gone)
        rid = next(self.request_ids)
        request: dict[str, object] = {"op": "fork", "id": rid, "specs": list(job.specs)}
        if job.program != "worker":
            request["program"] = job.program
            if job.coordinator is not None:
                request["coordinator"] = job.coordinator
        data = encode(request)
        try:
            socket.send_fds(self.sock, [data], [log_fd])
        except OSError as e:
            self._lost(f"a request failed: {e}")
            raise ZygoteGone(self.gone) from None
        deadline = time.monotonic() + FORK_TIMEOUT_S
        while rid not in self.replies:
            if self.gone is not None:
                raise ZygoteGone(self.gone)
            if time.monotonic() > deadline:
                self._lost(f"no answer to a fork in {FORK_TIMEOUT_S:.0f} s")
                raise ZygoteGone(self.gone)
            self.pump(max(0.0, deadline - time.monotonic()))
        r = self.replies.pop(rid)
        if r.op == "refused":
            raise ZygoteGone(f"it refused a request: {r.error}")
        child = ZygoteChild(self, r.pid)
        if r.pid in self.exits:
            child.ended(self.exits.pop(r.pid))
        else:
            self.children[r.pid] = child
        return child

    def usable(self) -> str | None:
        """Why a worker must be spawned instead, or None."""
        if self.gone is not None:
            return f"the zygote is gone ({self.gone})"
        if os.getcwd() != self.cwd:
            return "the working directory changed since the zygote started"
        if os.environ != self.env:
            return "the environment changed since the zygote started"
        return None

    def close(self, timeout: float = 5.0) -> None:
        """End the zygote (its EOF); its children have been stopped by then."""
        if self.gone is None:
            self.sock.close()
            self.gone = "closed"
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logfile.close()


class ZygoteLauncher:
    """A launcher that forks workers from a zygote (module docstring).

    ``append``: a worker's log is appended to (an agent's relaunch), not
    rewritten; ``own_session``: a spawned process gets a session of its own (an
    agent's).  A forked child's signals go to it alone, through its pidfd.
    """

    def __init__(self, zygote: Zygote, *, append: bool = False, own_session: bool = False):
        self.zygote = zygote
        self.append = append
        self.own_session = own_session
        self.warned: str | None = None
        self.forked = 0
        self.spawned = 0

    def __call__(self, host: str, argv: list[str], logfile: Path) -> Supervised:
        job = fork_job(argv)
        if job is None:  # not a worker: an engine service
            return self.spawn(argv, logfile)
        why = self.zygote.usable()
        if why is None:
            out = open(logfile, "ab" if self.append else "wb")  # noqa: SIM115 - close_log()
            try:
                child = self.zygote.fork(job, out.fileno())
            except ZygoteGone as e:
                out.close()
                why = f"the zygote cannot fork ({e})"
            else:
                self.forked += 1
                log.debug("%s: forked by the zygote as pid %d", logfile.stem, child.pid)
                return Supervised(logfile.stem, child, log=logfile, logfile=out, own_session=False)
        if why != self.warned:
            log.warning("%s: spawned, not forked: %s", logfile.stem, why)
            self.warned = why
        self.spawned += 1
        return self.spawn(argv, logfile)

    def spawn(self, argv: list[str], logfile: Path) -> Supervised:
        return Supervised.start(
            logfile.stem, argv, logfile, append=self.append, own_session=self.own_session
        )

    def close(self) -> None:
        self.zygote.close()


@dataclass(frozen=True)
class ForkJob:
    """A command line the zygote can run as a fork: its program and arguments."""

    program: str  # a key of typhoon.zygote_protocol.PROGRAMS
    specs: list[str]  # absolute
    coordinator: str | None = None  # a debug worker's --coordinator


def worker_specs(argv: Sequence[str]) -> list[str] | None:
    """The absolute spec paths of a worker command line, or None for anything else."""
    if list(argv[:3]) != [sys.executable, "-m", WORKER_MODULE] or len(argv) < 4:
        return None
    return [str(Path(a).absolute()) for a in argv[3:]]


def fork_job(argv: Sequence[str]) -> ForkJob | None:
    """What the zygote would fork for ``argv``: a topology worker's or a debug worker's
    command line (typhoon.debug.supervisor); None for anything else (then it is spawned)."""
    specs = worker_specs(argv)
    if specs is not None:
        return ForkJob("worker", specs)
    args = list(argv[3:])
    if list(argv[:3]) != [sys.executable, "-m", DEBUG_MODULE]:
        return None
    if len(args) == 1:
        return ForkJob("debug", [str(Path(args[0]).absolute())])
    if len(args) == 3 and args[1] == "--coordinator":
        return ForkJob("debug", [str(Path(args[0]).absolute())], args[2])
    return None
