"""The worker fork server (zygote): imports the worker runtime once, forks workers.

``python -m typhoon.runtime.zygote_server --fd N [--preload OPERATOR,...]
[--transport tcp|sdn] [--detach]``, started by the launcher (typhoon.zygote: the
tcp runner, or an sdn host's agent) with ``N`` its end of a private socket pair
(typhoon.zygote_protocol).  A fresh ``python -m typhoon.runtime.worker``
pays ~0.15 s of CPU in imports before its first line of work; a child forked
from here has them already, as Storm and Flink keep warm JVMs.

The zygote is one thread that holds nothing a child could share wrongly: no
logging setup, no sockets but the request one, no eventlet (checked), stdin on
/dev/null.  A child closes what the zygote held, puts its log file on stdout
and stderr, reseeds its random generators, takes back Python's default signal
handlers, shows the worker command line as its process title, and then leaves
the zygote's loop to run ``typhoon.runtime.worker.main`` at the top of its
stack: it exits as a spawned worker does (threads joined, ``atexit``, the
same exit codes).  It dies with the zygote (``PR_SET_PDEATHSIG``): the
launcher, which only hears exit codes through the zygote, then knows each was
killed.  Except with ``--detach`` (an agent's zygote): a child starts a session
of its own and outlives the zygote, as a spawned worker outlives its agent, so
an agent that restarts adopts it (typhoon.agent).

An agent's zygote also forks the live debugger's debug workers
(``typhoon.debug.worker``, program ``debug``).  That is as safe as forking a
topology worker, for the same reasons: the zygote runs in the agent's host's
network namespace, as the agent's user with its capabilities (a debug worker
creates a TAP there, as a spawned one does); it holds no thread, no
coordinator connection and no socket but the request one, and a child closes
every descriptor but its log before it opens its own coordinator connection
and starts its reader and shipper threads.  The debug worker's modules
(coordinator client, HTTP client, filter, decoder) are imported by the zygote
on the first debug request, not at its start, so they cost a cluster's
start-up nothing; later sessions fork with them loaded.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import logging
import os
import random
import selectors
import signal
import socket
import sys
from dataclasses import dataclass

import typhoon.runtime.chain
import typhoon.runtime.worker
from typhoon.operators.builtins import PATHS
from typhoon.zygote_protocol import (
    MAX_MESSAGE,
    PROGRAMS,
    ForkRequest,
    ZygoteProtocolError,
    encode,
    exit_message,
    fork_request,
)

PR_SET_PDEATHSIG = 1
PRELOADED = (typhoon.runtime.chain, typhoon.runtime.worker)  # imported for the children
TRANSPORTS = {"tcp": "typhoon.runtime.tcp", "sdn": "typhoon.runtime.sdn"}


@dataclass
class ChildJob:
    """What a forked child runs once it has left the zygote's loop."""

    specs: tuple[str, ...]
    log_fd: int
    zygote_pid: int
    detach: bool = False  # a session of its own, outliving the zygote
    program: str = "worker"  # a key of PROGRAMS
    coordinator: str | None = None  # a debug worker's --coordinator

    def args(self) -> list[str]:
        """What the program's ``main`` is given (what follows ``-m MODULE``)."""
        url = ["--coordinator", self.coordinator] if self.coordinator is not None else []
        return [*self.specs, *url]


def load_program(program: str) -> None:
    """Import a program's module in the zygote, for this child and every later one
    (RuntimeError: eventlet is in, whose monkey-patching children would inherit)."""
    if "eventlet" in sys.modules:  # an earlier program's import: this zygote forks no more
        raise RuntimeError("the zygote imported eventlet")
    importlib.import_module(PROGRAMS[program])
    if "eventlet" in sys.modules:
        raise RuntimeError(f"the {program} program imported eventlet")


def preload(operators: list[str], checkpoints: bool, transport: str = "tcp") -> None:
    """Import the transport and the named built-in operators' modules (ValueError: not one)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}")
    importlib.import_module(TRANSPORTS[transport])
    for name in operators:
        if name not in PATHS:
            raise ValueError(f"unknown built-in operator {name!r}")
        importlib.import_module(f"typhoon.operators.{PATHS[name].partition(':')[0]}")
    if checkpoints:
        importlib.import_module("typhoon.checkpoint")
    "127.0.0.1".encode("idna")  # what a worker's first connect imports (encodings.idna)
    if "eventlet" in sys.modules:  # a child would inherit its monkey-patching
        raise RuntimeError("the zygote imported eventlet")


class Zygote:
    """The fork loop: one request socket, a pidfd per live child."""

    def __init__(self, sock: socket.socket, detach: bool = False) -> None:
        self.sock = sock
        self.detach = detach
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ, None)
        self.children: dict[int, int] = {}  # pid -> its pidfd
        self.refused = 0

    def send(self, message: dict[str, object]) -> None:
        try:
            self.sock.send(encode(message))
        except OSError:  # the launcher is gone: its EOF ends the loop
            pass

    def serve(self) -> ChildJob | None:
        """Fork on request until the launcher closes its end; a child returns its job."""
        self.send({"op": "ready", "pid": os.getpid()})
        while True:
            for key, _ in self.sel.select():
                if key.data is not None:
                    self.reap(key.data)
                    continue
                try:
                    data, fds, flags, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
                except InterruptedError:
                    continue
                if not data and not fds:
                    return None
                job = self.handle(data, fds, bool(flags & socket.MSG_TRUNC))
                if job is not None:
                    return job

    def handle(self, data: bytes, fds: list[int], truncated: bool) -> ChildJob | None:
        rid = -1
        try:
            request = fork_request(data, len(fds), truncated)
            rid = request.request_id
            load_program(request.program)
        except (ZygoteProtocolError, ImportError, RuntimeError) as e:
            self.refused += 1
            for fd in fds:
                os.close(fd)
            print(f"zygote: refused a request: {e}", file=sys.stderr, flush=True)
            self.send({"op": "refused", "id": rid, "error": str(e)})
            return None
        return self.fork(request, fds[0])

    def fork(self, request: ForkRequest, log_fd: int) -> ChildJob | None:
        sys.stdout.flush()
        sys.stderr.flush()
        zygote_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            self.close_in_child()
            return ChildJob(
                request.specs, log_fd, zygote_pid, self.detach, request.program,
                request.coordinator,
            )  # fmt: skip
        os.close(log_fd)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = pidfd
        self.sel.register(pidfd, selectors.EVENT_READ, pid)
        self.send({"op": "forked", "id": request.request_id, "pid": pid})
        return None

    def reap(self, pid: int) -> None:
        _, status = os.waitpid(pid, os.WNOHANG)
        if _ == 0:  # readable yet not reapable: ask again on the next turn
            return
        pidfd = self.children.pop(pid)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        self.send(exit_message(pid, os.waitstatus_to_exitcode(status)))

    def close_in_child(self) -> None:
        for pidfd in self.children.values():
            os.close(pidfd)
        self.children.clear()
        self.sel.close()
        self.sock.close()


def become_worker(job: ChildJob) -> int:
    """Turn a freshly forked child into what ``python -m typhoon.runtime.worker`` is."""
    if job.detach:  # as a spawned worker of an agent: the agent's terminal and group
        os.setsid()  # signals miss it, and it lives on when the agent (and zygote) die
    else:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != job.zygote_pid:  # the zygote died before the line above
            os.kill(os.getpid(), signal.SIGKILL)
    os.dup2(job.log_fd, 1)
    os.dup2(job.log_fd, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the log's own fd too: 1 and 2 hold it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    logging.root.handlers.clear()
    module = sys.modules[PROGRAMS[job.program]]  # the zygote imported it (load_program)
    set_title([sys.executable, "-m", module.__name__, *job.args()])
    sys.argv = [module.__file__ or module.__name__, *job.args()]
    code: int = module.main(job.args())
    return code


def set_title(argv: list[str]) -> None:
    """``ps`` shows the worker's command line, not the zygote's (setproctitle, if there)."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        print("zygote: no setproctitle; the process title stays the zygote's", file=sys.stderr)
        return
    setproctitle(" ".join(argv))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m typhoon.runtime.zygote_server")
    parser.add_argument("--fd", type=int, required=True, help="the request socket (inherited)")
    parser.add_argument(
        "--preload", default="", help="built-in operators to import, comma-separated"
    )
    parser.add_argument("--checkpoints", action="store_true", help="import the checkpoint store")
    parser.add_argument("--transport", choices=sorted(TRANSPORTS), default="tcp")
    parser.add_argument(
        "--detach", action="store_true", help="children get sessions of their own, outlive it"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the workers
    sock = socket.socket(fileno=args.fd)
    preload([n for n in args.preload.split(",") if n], args.checkpoints, args.transport)
    job = Zygote(sock, args.detach).serve()
    if job is None:  # the launcher closed its end: nothing to tear down but the interpreter,
        sys.stdout.flush()  # whose finalization of every preloaded module its launcher
        sys.stderr.flush()  # (an agent shutting down) would wait for
        os._exit(0)
    return become_worker(job)


if __name__ == "__main__":
    sys.exit(main())
