"""Where consistent checkpoints live: one file per (epoch, worker part), written atomically.

A recovery must never start from a half-written or damaged checkpoint, so each
part is written to a temporary name, synced and renamed into place, and framed
with a header (magic, format version, payload length, SHA-256) that
:meth:`CheckpointStore.read` verifies.  A damaged or incomplete epoch is
skipped by :meth:`CheckpointStore.latest_complete`, which then falls back to
the previous one.  Layout::

    <root>/<app>/<epoch as 12 digits>/<part>.ckpt
    <root>/<app>/<epoch as 12 digits>/manifest.json   (after mark_complete)

Local paths use the OS directly (fsync of file and directory); ``hdfs://``,
``s3://``, ``gs://`` ... go through ``pyarrow.fs``, imported only for them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import struct
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from typhoon.private_files import private_dir, write_private
from typhoon.topology.config import DEFAULTS

log = logging.getLogger(__name__)

DEFAULT_STORE = DEFAULTS.checkpoint_store  # declared in typhoon/topology/config.py
MAGIC = b"TYCK"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">4sHQ32s")  # magic, format version, payload length, sha256(payload)
_EPOCH_DIGITS = 12
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_SUFFIX = ".ckpt"
_MANIFEST = "manifest.json"
# schemes pyarrow.fs.FileSystem.from_uri knows besides file://
ARROW_SCHEMES = frozenset({"hdfs", "viewfs", "s3", "gs", "gcs", "abfs", "abfss"})


class CheckpointError(Exception):
    """A checkpoint that cannot be written or read; the message is one plain sentence."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint file whose header, length or checksum is wrong."""


def frame(data: bytes) -> bytes:
    """``data`` behind the header :func:`unframe` checks."""
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(data), hashlib.sha256(data).digest()) + data


def unframe(blob: bytes, where: str) -> bytes:
    """The payload of a framed checkpoint; CorruptCheckpoint naming ``where`` if it is damaged."""
    if len(blob) < _HEADER.size:
        raise CorruptCheckpoint(f"checkpoint {where} is truncated ({len(blob)} bytes, no header)")
    magic, version, length, digest = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise CorruptCheckpoint(f"checkpoint {where} is not a checkpoint file (bad magic)")
    if version != FORMAT_VERSION:
        raise CorruptCheckpoint(f"checkpoint {where} has unknown format version {version}")
    payload = blob[_HEADER.size :]
    if len(payload) != length:
        raise CorruptCheckpoint(
            f"checkpoint {where} is truncated or padded ({len(payload)} of {length} bytes)"
        )
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint(f"checkpoint {where} fails its checksum")
    return payload


def check_name(name: str, what: str) -> str:
    """An app or part name that is one safe path component, or ValueError saying why not."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise ValueError(
            f"{what} name {name!r} must be letters, digits, '_', '-' and '.', "
            "start with a letter, digit or '_', and contain no '..' or '/'"
        )
    return name


def _check_epoch(epoch: int) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < 10**_EPOCH_DIGITS:
        raise ValueError(
            f"epoch must be an integer from 0 to {10**_EPOCH_DIGITS - 1}, not {epoch!r}"
        )
    return epoch


def _cause(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__


class _LocalFS:
    """A directory on this machine; writes are synced before and after the rename."""

    join = staticmethod(os.path.join)

    def makedirs(self, path: str) -> None:
        private_dir(path)  # operators' state: 0700, this user's

    def write_atomic(self, path: str, data: bytes) -> None:
        write_private(path, data, sync=True)
        folder = os.path.dirname(path)
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)  # the rename itself survives a crash
        finally:
            os.close(dfd)

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def listdir(self, path: str) -> list[tuple[str, bool]]:
        """(name, is a directory) of each entry; empty if ``path`` does not exist."""
        try:
            with os.scandir(path) as it:
                return [(e.name, e.is_dir()) for e in it]
        except FileNotFoundError:
            return []

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path)

    def remove(self, path: str) -> None:
        os.unlink(path)

    def probe(self, folder: str) -> None:
        """Fail now, not at the first checkpoint, if ``folder`` cannot take files."""
        path = os.path.join(folder, f".probe-{uuid.uuid4().hex[:12]}")
        self.write_atomic(path, b"")
        os.unlink(path)


class _ArrowFS:
    """A ``pyarrow.fs`` file system: temp name then ``move`` (atomic where the store is)."""

    join = staticmethod(posixpath.join)

    def __init__(self, fs: Any) -> None:
        import pyarrow.fs

        self.fs = fs
        self.pafs = pyarrow.fs

    def makedirs(self, path: str) -> None:
        self.fs.create_dir(path, recursive=True)

    def write_atomic(self, path: str, data: bytes) -> None:
        folder, name = posixpath.split(path)
        tmp = posixpath.join(folder, f".{name}.tmp-{uuid.uuid4().hex[:12]}")
        try:
            with self.fs.open_output_stream(tmp) as out:
                out.write(data)
            self.fs.move(tmp, path)
        except BaseException:
            try:
                self.fs.delete_file(tmp)
            except Exception:  # noqa: BLE001 - cleaning up after the error that matters
                pass
            raise

    def read(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return f.readall()

    def listdir(self, path: str) -> list[tuple[str, bool]]:
        infos = self.fs.get_file_info(self.pafs.FileSelector(path, allow_not_found=True))
        return [(i.base_name, i.type == self.pafs.FileType.Directory) for i in infos]

    def rmtree(self, path: str) -> None:
        self.fs.delete_dir(path)

    def remove(self, path: str) -> None:
        self.fs.delete_file(path)

    def probe(self, folder: str) -> None:
        info = self.fs.get_file_info(folder)
        if info.type != self.pafs.FileType.Directory:
            raise NotADirectoryError(20, "not a directory")


def _errors(backend: Any) -> tuple[type[BaseException], ...]:
    """What a backend raises for an I/O problem (pyarrow adds its own exception types)."""
    if isinstance(backend, _ArrowFS):
        import pyarrow

        return (OSError, pyarrow.ArrowException)
    return (OSError,)


class CheckpointStore:
    """The checkpoints of one app: write and verify parts, find the newest usable epoch."""

    def __init__(self, backend: Any, root: str, app: str, url: str) -> None:
        self._fs, self.url = backend, url
        self.app = check_name(app, "app")
        self.root = backend.join(root, self.app)
        self._io = _errors(backend)
        try:
            backend.makedirs(self.root)
            backend.probe(self.root)
        except self._io as e:
            raise CheckpointError(
                f"checkpoint store {url} cannot be used at {self.root}: {_cause(e)}"
            ) from e

    @classmethod
    def local(cls, root: str, app: str, url: str | None = None) -> CheckpointStore:
        """A store in the local directory ``root`` (created if missing)."""
        return cls(_LocalFS(), root, app, url or f"file://{root}")

    @classmethod
    def arrow(cls, filesystem: Any, root: str, app: str, url: str | None = None) -> CheckpointStore:
        """A store on a ``pyarrow.fs.FileSystem`` under the path ``root``."""
        return cls(_ArrowFS(filesystem), root, app, url or f"{filesystem.type_name}:{root}")

    # ----- paths ---------------------------------------------------------------------------

    def _epoch_dir(self, epoch: int) -> str:
        return self._fs.join(self.root, f"{_check_epoch(epoch):0{_EPOCH_DIGITS}d}")

    def _part_path(self, epoch: int, part: str) -> str:
        return self._fs.join(self._epoch_dir(epoch), check_name(part, "part") + _SUFFIX)

    # ----- parts ---------------------------------------------------------------------------

    def write(self, epoch: int, part: str, data: bytes) -> None:
        """Store ``data`` as ``part`` of ``epoch``; all or nothing, earlier epochs untouched."""
        path = self._part_path(epoch, part)
        try:
            self._fs.makedirs(self._epoch_dir(epoch))
            self._fs.write_atomic(path, frame(bytes(data)))
        except self._io as e:
            raise CheckpointError(f"cannot write checkpoint {path}: {_cause(e)}") from e

    def read(self, epoch: int, part: str) -> bytes:
        """The verified payload of ``part`` of ``epoch``."""
        path = self._part_path(epoch, part)
        try:
            blob = self._fs.read(path)
        except self._io as e:
            raise CheckpointError(f"cannot read checkpoint {path}: {_cause(e)}") from e
        return unframe(blob, path)

    # ----- key groups in transit (typhoon/runtime/migration.py) -----------------------------

    def _blob_path(self, name: str) -> str:
        return self._fs.join(self.root, "migrations", check_name(name, "blob") + _SUFFIX)

    def put_blob(self, name: str, data: bytes) -> None:
        """Store ``data`` under ``name`` (all or nothing): keyed state on its way to a worker."""
        path = self._blob_path(name)
        try:
            self._fs.makedirs(self._fs.join(self.root, "migrations"))
            self._fs.write_atomic(path, frame(bytes(data)))
        except self._io as e:
            raise CheckpointError(f"cannot write {path}: {_cause(e)}") from e

    def get_blob(self, name: str) -> bytes | None:
        """The verified blob ``name``, or None while it is not there."""
        path = self._blob_path(name)
        folder = self._fs.join(self.root, "migrations")
        if (check_name(name, "blob") + _SUFFIX, False) not in self._fs.listdir(folder):
            return None
        try:
            blob = self._fs.read(path)
        except self._io as e:
            raise CheckpointError(f"cannot read {path}: {_cause(e)}") from e
        return unframe(blob, path)

    def delete_blob(self, name: str) -> None:
        try:
            self._fs.remove(self._blob_path(name))
        except self._io:
            pass  # a leftover costs disk, not correctness

    def epochs(self) -> list[int]:
        """Every epoch that has a directory, ascending (complete or not)."""
        try:
            entries = self._fs.listdir(self.root)
        except self._io as e:
            raise CheckpointError(f"cannot list checkpoints in {self.root}: {_cause(e)}") from e
        return sorted(
            int(name)
            for name, is_dir in entries
            if is_dir and len(name) == _EPOCH_DIGITS and name.isdigit()
        )

    def parts(self, epoch: int) -> set[str]:
        """Names of the parts written for ``epoch`` (verified or not)."""
        folder = self._epoch_dir(epoch)
        try:
            entries = self._fs.listdir(folder)
        except self._io as e:
            raise CheckpointError(f"cannot list checkpoint {folder}: {_cause(e)}") from e
        return {
            name[: -len(_SUFFIX)]
            for name, is_dir in entries
            if not is_dir and name.endswith(_SUFFIX) and not name.startswith(".")
        }

    def latest_complete(
        self, expected_parts: set[str], accept: Callable[[int], bool] | None = None
    ) -> int | None:
        """Newest epoch whose every expected part is there and verifies (and that
        ``accept`` takes, if given); None if there is none.

        A damaged or incomplete epoch is skipped with a warning, so a crash
        during a checkpoint (or a bad disk block) costs one epoch, not the job.
        """
        for epoch in reversed(self.epochs()):
            missing = set(expected_parts) - self.parts(epoch)
            if missing:
                log.warning(
                    "checkpoint epoch %d of %s is incomplete (missing %s); skipping it",
                    epoch,
                    self.app,
                    ", ".join(sorted(missing)),
                )
                continue
            try:
                for part in sorted(expected_parts):
                    self.read(epoch, part)
            except CheckpointError as e:
                log.warning("checkpoint epoch %d of %s is unusable: %s", epoch, self.app, e)
                continue
            if accept is not None and not accept(epoch):
                continue
            return epoch
        return None

    # ----- completion manifests ------------------------------------------------------------

    def mark_complete(self, epoch: int, manifest: dict) -> None:
        """Record that ``epoch`` is a consistent checkpoint, with what the caller wants kept."""
        try:
            body = json.dumps(
                {"epoch": epoch, "manifest": manifest}, sort_keys=True, separators=(",", ":")
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"manifest of epoch {epoch} is not JSON data ({e})") from e
        text = json.dumps(
            {"body": body, "sha256": hashlib.sha256(body.encode()).hexdigest()}, indent=1
        )
        path = self._fs.join(self._epoch_dir(epoch), _MANIFEST)
        try:
            self._fs.makedirs(self._epoch_dir(epoch))
            self._fs.write_atomic(path, text.encode() + b"\n")
        except self._io as e:
            raise CheckpointError(f"cannot write checkpoint manifest {path}: {_cause(e)}") from e

    def manifest(self, epoch: int) -> dict:
        """The manifest given to :meth:`mark_complete`; CheckpointError if missing or damaged."""
        path = self._fs.join(self._epoch_dir(epoch), _MANIFEST)
        try:
            raw = self._fs.read(path)
        except self._io as e:
            raise CheckpointError(f"cannot read checkpoint manifest {path}: {_cause(e)}") from e
        try:
            outer = json.loads(raw)
            body = outer["body"]
            ok = hashlib.sha256(body.encode()).hexdigest() == outer["sha256"]
            inner = json.loads(body) if ok else None
        except (ValueError, TypeError, KeyError, AttributeError):
            ok, inner = False, None
        if not ok or not isinstance(inner, dict) or inner.get("epoch") != epoch:
            raise CorruptCheckpoint(f"checkpoint manifest {path} is damaged")
        return inner["manifest"]

    def completed(self) -> list[int]:
        """Epochs marked complete whose manifest verifies, ascending."""
        done = []
        for epoch in self.epochs():
            try:
                self.manifest(epoch)
            except CorruptCheckpoint as e:
                log.warning("%s; epoch %d is not counted as complete", e, epoch)
                continue
            except CheckpointError:
                continue
            done.append(epoch)
        return done

    def clear(self) -> None:
        """Delete every epoch of the app: a new submission starts from nothing, and a
        previous run's complete epochs must not look like this run's."""
        for epoch in self.epochs():
            folder = self._epoch_dir(epoch)
            try:
                self._fs.rmtree(folder)
            except self._io as e:
                raise CheckpointError(f"cannot delete checkpoint {folder}: {_cause(e)}") from e
        folder = self._fs.join(self.root, "migrations")
        if ("migrations", True) in self._fs.listdir(self.root):
            try:  # keyed state a previous run left in transit must not reach this one
                self._fs.rmtree(folder)
            except self._io as e:
                raise CheckpointError(f"cannot delete {folder}: {_cause(e)}") from e

    def prune(self, keep_from: int) -> None:
        """Delete epochs older than ``keep_from``, but never the newest completed one."""
        done = self.completed()
        keep = min(keep_from, done[-1]) if done else keep_from
        for epoch in self.epochs():
            if epoch >= keep:
                break
            folder = self._epoch_dir(epoch)
            try:
                self._fs.rmtree(folder)
            except self._io as e:
                raise CheckpointError(f"cannot delete checkpoint {folder}: {_cause(e)}") from e


def open_store(url: str | None, app: str) -> CheckpointStore:
    """The checkpoint store at ``url`` for ``app``; CheckpointError if it cannot be used.

    ``None`` or ``""`` is :data:`DEFAULT_STORE`; ``file:///abs/path`` or an
    absolute path is a local directory; hdfs://, s3://, gs:// ... use pyarrow.
    """
    url = url or DEFAULT_STORE
    check_name(app, "app")
    if url.startswith("/"):
        return CheckpointStore.local(os.path.normpath(url), app, url)
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise CheckpointError(
                f"checkpoint store {url} must name an absolute local path, like file:///var/ckpt"
            )
        return CheckpointStore.local(os.path.normpath(parsed.path), app, url)
    if scheme in ARROW_SCHEMES:
        try:
            import pyarrow
            import pyarrow.fs
        except ImportError as e:
            raise CheckpointError(f"checkpoint store {url} needs pyarrow, which is missing") from e
        try:
            fs, root = pyarrow.fs.FileSystem.from_uri(url)
        except (OSError, pyarrow.ArrowException) as e:
            raise CheckpointError(f"checkpoint store {url} cannot be opened: {_cause(e)}") from e
        return CheckpointStore.arrow(fs, root, app, url)
    known = ", ".join(["file", *sorted(ARROW_SCHEMES)])
    raise CheckpointError(
        f"checkpoint store {url} has an unknown scheme "
        f"'{parsed.scheme or url}' (use an absolute path or one of: {known})"
    )
