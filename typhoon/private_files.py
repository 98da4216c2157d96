"""Files only their owner may read: tokens, session keys, worker specs, checkpoints.

Each file is created with mode 0600 (directories 0700) from its first byte,
whatever the umask, and put in place with a rename: no moment exists in which
another user could open it (as between ``write_text`` and ``chmod``), and a
file it replaces does not pass on its looser mode (``O_TRUNC`` on an existing
file keeps the old mode).  The rename also replaces a symlink planted at the
path instead of writing through it.
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def write_private(path: str | os.PathLike[str], data: str | bytes, sync: bool = False) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8), mode 0600; ``sync``: fsync first."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.tmp-{uuid.uuid4().hex[:12]}")
    blob = data.encode() if isinstance(data, str) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)  # a umask can take bits from the owner too
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory of this user's, mode 0700; missing parents are made 0700 too.

    An existing directory with a looser mode is tightened; if another user owns
    it (a directory planted in /var/tmp, or root squashed on NFS) it is used only
    when it is already 0700, else refused (PermissionError): its mode cannot be
    fixed from here and others could read what goes in.
    """
    target = Path(path)
    missing = []
    p = target
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by another process: checked below if it is the target
        os.chmod(d, DIR_MODE)  # mkdir's mode goes through the umask
    info = os.stat(target)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(20, "not a directory", str(target))
    if stat.S_IMODE(info.st_mode) & 0o077:
        if info.st_uid != os.geteuid():
            raise PermissionError(
                13,
                f"mode {stat.S_IMODE(info.st_mode):04o}, owned by uid {info.st_uid}, not by this "
                f"user (uid {os.geteuid()})",
                str(target),
            )
        os.chmod(target, DIR_MODE)
    return target


class SecretFileError(ValueError):
    """A secret file that is missing, open to others or empty; one sentence."""


def read_secret(path: str | os.PathLike[str], what: str) -> str:
    """The stripped text of the secret file ``path``: refused if group or others may read it."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise SecretFileError(f"{what} {name}: {e.strerror or e}") from e
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise SecretFileError(f"{what} {name} is not a regular file")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise SecretFileError(
                f"{what} {name} is readable by others (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"chmod 0600 {name}"
            )
        raw = f.read(4096)
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        text = ""
    if not text:
        raise SecretFileError(f"{what} {name} is empty or not text")
    return text
