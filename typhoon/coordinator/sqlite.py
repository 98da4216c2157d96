"""SQLite coordinator backend: one database file shared by the processes of one machine.

The default backend (docs/design.md §2): the manager, the agents (one per emulated
host) and the controller each open the same file with their own connection.

Path: the constructor argument, else the environment variable
``TYPHOON_COORDINATOR`` (a path or a ``sqlite:///path`` URL), else
``/var/lib/typhoon/coordinator.db``.  The parent directory is created.

Concurrency: WAL mode lets readers proceed while one process writes; every
write is one ``BEGIN IMMEDIATE`` transaction that takes the write lock up
front (no lock upgrades, so no deadlock between processes), and a busy timeout
makes a writer wait for the lock instead of failing.  Within a process one
connection is shared by all threads under a lock; a forked child opens its
own, as SQLite requires.

Tables: ``kv(key, value)`` holds JSON text; ``changes(version, key)`` keeps one
row per key with the version of its latest change (AUTOINCREMENT, so versions
only grow, even across deletes), which is exactly what ``changes_since`` needs.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from .base import Coordinator, CoordinatorError, check_key, decode, encode

ENV_VAR = "TYPHOON_COORDINATOR"
DEFAULT_PATH = "/var/lib/typhoon/coordinator.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS changes (
    version INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE
);
"""


def default_path() -> str:
    """The database file named by ``TYPHOON_COORDINATOR``, or the system default."""
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return DEFAULT_PATH
    if value.startswith("sqlite://"):
        return value[len("sqlite://") :]
    if "://" in value:
        raise CoordinatorError(f"{ENV_VAR}={value!r} does not name an SQLite database")
    return value


def _subtree(key: str) -> tuple[str, str]:
    """Bounds of the keys strictly under ``key/``: '/' + 1 is '0' in ASCII."""
    return key + "/", key + "0"


class SqliteCoordinator(Coordinator):
    """Coordinator stored in one SQLite file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, timeout: float = 30.0) -> None:
        self.path = Path(path if path is not None else default_path())
        self.timeout = timeout
        self._lock = threading.RLock()
        self._pid = -1
        self._stale: list[sqlite3.Connection] = []
        self._conn: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._write() as db:  # executescript() would commit: run statements one by one
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
        except (OSError, sqlite3.Error, CoordinatorError) as e:
            cause = e.__cause__ or e
            raise CoordinatorError(f"cannot open coordinator database {self.path}: {cause}") from e

    # ----- connection ----------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._pid != os.getpid():
            if self._conn is not None:
                # inherited over fork: never touch (or close) the parent's connection
                self._stale.append(self._conn)
            conn = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._conn, self._pid = conn, os.getpid()
        assert self._conn is not None
        return self._conn

    def _write(self) -> _Transaction:
        return _Transaction(self, immediate=True)

    def _read(self) -> _Transaction:
        return _Transaction(self, immediate=False)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                if self._pid == os.getpid():
                    self._conn.close()
                else:
                    self._stale.append(self._conn)  # the parent's: leave it alone
            self._conn, self._pid = None, -1

    # ----- backend contract ----------------------------------------------------------------

    def put(self, key: str, value: Any) -> None:
        text = encode(check_key(key), value)
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, text))
            _changed(db, [key])

    def create(self, key: str, value: Any) -> bool:
        text = encode(check_key(key), value)
        with self._write() as db:
            cur = db.execute("INSERT OR IGNORE INTO kv (key, value) VALUES (?, ?)", (key, text))
            if cur.rowcount == 0:
                return False
            _changed(db, [key])
            return True

    def get(self, key: str) -> Any:
        check_key(key)
        with self._read() as db:
            row = db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else decode(key, row[0])

    def delete(self, key: str) -> None:
        check_key(key)
        low, high = _subtree(key)
        where = "key = ? OR (key >= ? AND key < ?)"
        with self._write() as db:
            keys = [r[0] for r in db.execute(f"SELECT key FROM kv WHERE {where}", (key, low, high))]
            if keys:
                db.execute(f"DELETE FROM kv WHERE {where}", (key, low, high))
                _changed(db, sorted(keys))

    def list(self, prefix: str = "") -> list[str]:
        with self._read() as db:
            if not prefix:
                rows = db.execute("SELECT key FROM kv ORDER BY key")
            else:
                low, high = _subtree(check_key(prefix))
                rows = db.execute(
                    "SELECT key FROM kv WHERE key >= ? AND key < ? ORDER BY key", (low, high)
                )
            return [r[0] for r in rows]

    def version(self) -> int:
        with self._read() as db:
            return db.execute("SELECT COALESCE(MAX(version), 0) FROM changes").fetchone()[0]

    def changes_since(self, version: int) -> tuple[int, list[str]]:
        with self._read() as db:
            rows = db.execute(
                "SELECT version, key FROM changes WHERE version > ? ORDER BY version", (version,)
            ).fetchall()
        return (rows[-1][0] if rows else version), [key for _, key in rows]


def _changed(db: sqlite3.Connection, keys: list[str]) -> None:
    """Give each key a new latest version (REPLACE drops its old change row)."""
    db.executemany("INSERT OR REPLACE INTO changes (key) VALUES (?)", [(k,) for k in keys])


class _Transaction:
    """``with``: hold the process lock and one SQLite transaction; commit or roll back."""

    def __init__(self, owner: SqliteCoordinator, immediate: bool) -> None:
        self.owner = owner
        self.immediate = immediate

    def __enter__(self) -> sqlite3.Connection:
        self.owner._lock.acquire()
        try:
            self.db = self.owner._connection()
            if self.immediate:
                self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            self.owner._lock.release()
            raise CoordinatorError(f"coordinator database {self.owner.path}: {e}") from e
        except BaseException:
            self.owner._lock.release()
            raise
        return self.db

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, _: Any
    ) -> None:
        try:
            if self.immediate:
                self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        except sqlite3.Error as e:
            if exc_type is None:
                raise CoordinatorError(f"coordinator database {self.owner.path}: {e}") from e
        finally:
            self.owner._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise CoordinatorError(f"coordinator database {self.owner.path}: {exc}") from exc
