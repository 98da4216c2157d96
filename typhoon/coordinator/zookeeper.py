"""ZooKeeper coordinator backend: Table-1 state shared by the hosts of a cluster.

Layout under the prefix (default ``/typhoon``)::

    PREFIX/kv/<key>                 one znode per key segment; a key's JSON value is
                                    its data, an empty znode is only a "directory"
    PREFIX/changes/g<gen>/c<seq>    the change log: sequential znodes, data = JSON
                                    list of the keys that one write changed

Keys map onto the znode tree (``status/wc/3`` is ``PREFIX/kv/status/wc/3``), so
``list`` and ``delete`` work on native subtrees and the store can be browsed
with ``zkCli.sh``.  JSON never encodes to zero bytes, which is how a key is
told from a directory znode that only holds children.

Atomicity: every write is one multi-op transaction holding the key update and
the creation of its change-log entry, so no reader sees one without the other.
``create`` is a native ``create`` (atomic test-and-set); a directory znode
that becomes a key is set with a version check.  ``delete`` lists the
subtree, then removes it in one transaction whose deletes carry the versions
it read: a concurrent write or a new child makes it fail and it starts over.

Change log and versions: ZooKeeper numbers sequential znodes with the parent's
child version (``cversion``), so entries are totally ordered by the server,
without a counter to contend on.  The version of entry ``c<seq>`` in generation
``gen`` is ``gen << 32 | seq + 1``; ``version()`` is that of the newest entry.
``changes_since(v)`` reads the entries after ``v`` (immutable, so cached) and
lists their keys, each once, in the order of its latest change.

Bounded log: a writer whose entry number is a multiple of ``trim_every``
deletes the oldest entries beyond ``log_size``, always a prefix of the log.
So a reader is exact while the entry it saw last (or an older one) is still
there; a reader that fell further behind, or is in an older generation, gets
every current key plus every key in the retained log (deleted ones too): a
resync, as for a fresh reader.  Entry numbers are 32-bit in ZooKeeper: once
one reaches ``rollover`` (2**30), its writer replaces the generation node by
the next one in one transaction (whose versions are all larger), long before
the numbers could wrap.

Notification is pushed: ``watch()`` arms a ZooKeeper child watch on the log
and reads the new entries when it fires; no polling.

Connections: one kazoo session per process (a forked child opens its own and
never touches the parent's socket).  Every request waits at most ``timeout``
seconds; a lost connection, an unreachable ensemble or a closed coordinator
raise ``CoordinatorError``.  Idempotent requests (reads, ``put``, ``delete``)
are retried once the session reconnects within that time (a repeated ``put``
may log its key twice, which readers cannot tell apart); ``create`` is not,
since a lost reply leaves it unknown whether the key was ours.

Access: with credentials (``?auth_file=`` in the URL, ``zk_auth.py``) the
session authenticates with ZooKeeper's digest scheme and every znode it makes
is creator-only; without them znodes are open to anyone who reaches ZooKeeper.

This module holds the key writes and reads; the change log and watches are in
``typhoon/coordinator/zk_changelog.py``, the session in ``zk_session.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.client import TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.protocol.states import ZnodeStat

from .base import Coordinator, CoordinatorError, decode, encode
from .zk_changelog import ATTEMPTS, ENTRY, MAX_TXN_OPS, ChangeLog, entry_seq, failure
from .zk_session import CHANGES, KV, guarded

__all__ = ["CHANGES", "KV", "MAX_VALUE_BYTES", "ZooKeeperCoordinator"]

# ZooKeeper refuses requests over jute.maxbuffer (1 MiB by default) by dropping the
# connection, which looks like an outage: refuse big values here, with their key.
MAX_VALUE_BYTES = 1_000_000
_MAX_TXN_BYTES = 512_000  # deletes of larger subtrees are split, children first


class ZooKeeperCoordinator(ChangeLog, Coordinator):
    """Coordinator stored in a ZooKeeper ensemble (see the module docstring)."""

    def __init__(
        self,
        hosts: str,
        prefix: str = "/typhoon",
        timeout: float = 10.0,
        *,
        log_size: int = 1000,
        trim_every: int = 100,
        rollover: int = 1 << 30,
        auth: str | None = None,
    ) -> None:
        # auth: "user:password" for digest authentication and creator-only ACLs (zk_auth.py)
        super().__init__(hosts, prefix, timeout, auth)  # checks the prefix; connects below
        if log_size < 1 or trim_every < 1 or not 1 <= rollover < 1 << 31:
            raise CoordinatorError("log_size, trim_every and rollover must be positive")
        self.log_size = log_size
        self.trim_every = trim_every
        self.rollover = rollover
        self._connect()

    # ----- writes --------------------------------------------------------------------------

    def _commit(self, ops: Callable[[TransactionRequest], None], keys: list[str]) -> list[Any]:
        """One transaction of ``ops`` plus a change-log entry for ``keys`` (if any).

        Returns the results of ``ops`` when the transaction fails on one of them;
        a log generation that went away meanwhile is looked up again.
        """
        entry = json.dumps(keys, separators=(",", ":")).encode()
        for _ in range(ATTEMPTS):
            gen = self._gen
            txn = self._zk().transaction()
            ops(txn)
            if keys:
                txn.create(f"{self._gen_path(gen)}/{ENTRY}", entry, sequence=True)
            results = self._wait(txn.commit_async())
            failed = failure(results)
            if failed is None:
                if keys:
                    self._after_write(gen, entry_seq(results[-1].rsplit("/", 1)[1]))
                return results
            if keys and failed[0] == len(results) - 1 and isinstance(failed[1], NoNodeError):
                self._refresh_gen()  # the log rolled over to a new generation
                continue
            return results
        raise CoordinatorError(f"ZooKeeper change log {self._changes} keeps moving; giving up")

    def _ensure_parent(self, path: str) -> None:
        self._wait(self._zk().ensure_path_async(path.rsplit("/", 1)[0]))

    @guarded
    def put(self, key: str, value: Any) -> None:
        path = self._path(key)
        data = self._data(key, value)
        self._retry(lambda: self._put(key, path, data))

    def _put(self, key: str, path: str, data: bytes) -> None:
        exists = True  # most writes replace a value (heartbeats, statuses)
        for _ in range(ATTEMPTS):
            if exists:
                failed = failure(self._commit(lambda t: t.set_data(path, data), [key]))
                if failed is None:
                    return
                if not isinstance(failed[1], NoNodeError):
                    raise failed[1]
                exists = False
                continue
            failed = failure(self._commit(lambda t: t.create(path, data), [key]))
            if failed is None:
                return
            if isinstance(failed[1], NoNodeError):
                self._ensure_parent(path)
            elif isinstance(failed[1], NodeExistsError):
                exists = True  # created meanwhile: replace it
            else:
                raise failed[1]
        raise CoordinatorError(f"cannot write {key!r}: it keeps changing under us")

    @guarded
    def create(self, key: str, value: Any) -> bool:
        path = self._path(key)
        data = self._data(key, value)
        for _ in range(ATTEMPTS):
            try:
                failed = failure(self._commit(lambda t: t.create(path, data), [key]))
            except ConnectionLoss as e:
                raise CoordinatorError(
                    f"ZooKeeper at {self.hosts}: connection lost while creating {key!r}; "
                    "it may or may not exist now"
                ) from e
            if failed is None:
                return True
            if isinstance(failed[1], NoNodeError):
                self._ensure_parent(path)
                continue
            if not isinstance(failed[1], NodeExistsError):
                raise failed[1]
            try:
                current, stat = self._retry(lambda: self._wait(self._zk().get_async(path)))
            except NoNodeError:
                continue  # deleted meanwhile: try again
            if current:
                return False
            # a directory znode (it has children, no value): it becomes the key if unchanged
            failed = failure(
                self._commit(lambda t, v=stat.version: t.set_data(path, data, version=v), [key])
            )
            if failed is None:
                return True
            if not isinstance(failed[1], BadVersionError | NoNodeError):
                raise failed[1]
        raise CoordinatorError(f"cannot create {key!r}: it keeps changing under us")

    @guarded
    def delete(self, key: str) -> None:
        path = self._path(key)
        self._retry(lambda: self._delete(key, path))

    def _delete(self, key: str, path: str) -> None:
        for _ in range(ATTEMPTS):
            nodes = self._walk(path)
            if not nodes:
                return
            nodes.sort(key=lambda node: -node[0].count("/"))  # children before parents
            for batch in _batches(nodes):
                keys = sorted(self._key(p) for p, stat in batch if stat.dataLength > 0)

                def ops(t: TransactionRequest, batch: list[tuple[str, ZnodeStat]] = batch) -> None:
                    for p, stat in batch:
                        t.delete(p, version=stat.version)

                failed = failure(self._commit(ops, keys))
                if failed is not None:
                    if isinstance(failed[1], BadVersionError | NoNodeError | NotEmptyError):
                        break  # raced with a writer: list the subtree again
                    raise failed[1]
            else:
                return
        raise CoordinatorError(f"cannot delete {key!r}: it keeps changing under us")

    def _data(self, key: str, value: Any) -> bytes:
        data = encode(key, value).encode()
        if len(data) > MAX_VALUE_BYTES:
            raise CoordinatorError(
                f"value for {key!r} is {len(data)} bytes; a ZooKeeper znode holds at most "
                f"{MAX_VALUE_BYTES}"
            )
        return data

    # ----- reads ---------------------------------------------------------------------------

    @guarded
    def get(self, key: str) -> Any:
        path = self._path(key)
        try:
            data, _ = self._retry(lambda: self._wait(self._zk().get_async(path)))
        except NoNodeError:
            return None
        return decode(key, data) if data else None

    @guarded
    def list(self, prefix: str = "") -> list[str]:
        root = self._path(prefix) if prefix else self._kv
        nodes = self._retry(lambda: self._walk(root))
        return sorted(self._key(p) for p, stat in nodes if p != root and stat.dataLength > 0)


def _batches(nodes: list[tuple[str, ZnodeStat]]) -> Iterable[list[tuple[str, ZnodeStat]]]:
    """Split deletes so no transaction exceeds ZooKeeper's request size."""
    batch: list[tuple[str, ZnodeStat]] = []
    size = 0
    for node in nodes:
        cost = len(node[0]) * 2 + 32  # the delete and the key in the log entry
        if batch and (len(batch) >= MAX_TXN_OPS or size + cost > _MAX_TXN_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(node)
        size += cost
    if batch:
        yield batch
