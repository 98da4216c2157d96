"""Running tcp jobs by name: where each one's control endpoint listens and its token.

A tcp run has no controller, so ``typhoon unchain NAME NODE`` finds the run by
its name here, as it finds an sdn job through the controller named by its
config (``typhoon.client``).  A run with a control endpoint
(``typhoon.tcp_control``) writes ``NAME.json`` (its URL, a token made for the
run, its process ID) into a directory of this user's, mode 0700, the file 0600
(``typhoon.private_files``): only this user can read the token, so only this
user can change the run.  The directory is ``$TYPHOON_TCP_JOBS``, else
``$XDG_RUNTIME_DIR/typhoon/tcp-jobs``, else ``~/.local/state/typhoon/tcp-jobs``.

One run per name: a second run of a name whose first run still runs gets no
entry (:func:`register` says why), and an entry whose process is gone is
stale: :func:`lookup` removes it and answers None.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from typhoon.private_files import SecretFileError, private_dir, read_secret, write_private

ENV = "TYPHOON_TCP_JOBS"
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")  # a topology name (typhoon.topology.schema)


@dataclass(frozen=True)
class TcpJob:
    """Where one running tcp job's control endpoint answers."""

    name: str
    url: str
    token: str
    pid: int


class JobNameTaken(Exception):
    """Another running tcp job has the name; the message is one sentence."""


def jobs_dir() -> Path:
    """The directory of the entries (module docstring); not created here."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "typhoon" / "tcp-jobs"
    return Path("~/.local/state/typhoon/tcp-jobs").expanduser()


def entry_path(name: str) -> Path | None:
    """The entry file of ``name``; None for a name no topology can have (no path from it)."""
    if not NAME.match(name) or name in (".", ".."):
        return None
    return jobs_dir() / f"{name}.json"


def register(job: TcpJob) -> Path:
    """Write ``job``'s entry; JobNameTaken if a live run of that name has one."""
    path = entry_path(job.name)
    if path is None:
        raise JobNameTaken(f"'{job.name}' cannot name a tcp job entry")
    other = lookup(job.name)
    if other is not None and other != job:
        raise JobNameTaken(
            f"a tcp job named '{job.name}' is already running (process {other.pid}, "
            f"{path}), so this run has no control endpoint; give this one another name"
        )
    private_dir(path.parent)
    body = {"name": job.name, "url": job.url, "token": job.token, "pid": job.pid}
    write_private(path, json.dumps(body) + "\n")
    return path


def unregister(job: TcpJob) -> None:
    """Remove ``job``'s entry if it is still this run's."""
    path = entry_path(job.name)
    try:
        if path is not None and _read(path) == job:
            path.unlink(missing_ok=True)
    except (SecretFileError, OSError):  # not ours any more: left alone
        pass


def lookup(name: str) -> TcpJob | None:
    """The running tcp job named ``name``, or None (no entry, or a stale one, removed).

    An entry others may read, or one that is not ours, is refused
    (SecretFileError): its token would not be this user's secret."""
    path = entry_path(name)
    if path is None or not path.exists():
        return None
    job = _read(path)
    if job is None:
        raise SecretFileError(f"tcp job entry {path} is not valid; remove it")
    if not _alive(job.pid):
        path.unlink(missing_ok=True)
        return None
    return job


def _read(path: Path) -> TcpJob | None:
    try:
        text = read_secret(path, "tcp job entry")
    except SecretFileError:
        if not path.exists():
            return None
        raise
    try:
        doc = json.loads(text)
        job = TcpJob(str(doc["name"]), str(doc["url"]), str(doc["token"]), int(doc["pid"]))
    except (ValueError, KeyError, TypeError):
        return None
    return job if job.name == path.stem else None


def _alive(pid: int) -> bool:
    if pid < 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process has that ID now: not this run
        return False
    return True
