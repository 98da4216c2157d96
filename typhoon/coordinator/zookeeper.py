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
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.handlers import utils as kazoo_utils
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.protocol.states import KazooState, ZnodeStat
from kazoo.retry import KazooRetry

from .base import Coordinator, CoordinatorError, Watch, check_key, decode, encode

log = logging.getLogger(__name__)

KV = "kv"
CHANGES = "changes"
_GEN = "g"
_ENTRY = "c"
_SEQ_BITS = 32
# ZooKeeper refuses requests over jute.maxbuffer (1 MiB by default) by dropping the
# connection, which looks like an outage: refuse big values here, with their key.
MAX_VALUE_BYTES = 1_000_000
# Deletes of larger subtrees are split into several transactions, children first.
_MAX_TXN_OPS = 1000
_MAX_TXN_BYTES = 512_000
_ATTEMPTS = 50  # optimistic retries of one write against concurrent writers

P = ParamSpec("P")
R = TypeVar("R")


def _timeouts() -> tuple[type[Exception], ...]:
    """The timeout errors of kazoo's handlers (the eventlet one has its own)."""
    green = sys.modules.get("kazoo.handlers.eventlet")
    return (KazooTimeoutError, green.TimeoutError) if green else (KazooTimeoutError,)


def _guarded(method: Callable[P, R]) -> Callable[P, R]:
    """Turn kazoo's errors (lost connection, timeouts, closed client) into CoordinatorError."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        self = args[0]
        assert isinstance(self, ZooKeeperCoordinator)
        try:
            return method(*args, **kwargs)
        except CoordinatorError:
            raise
        except _timeouts() as e:
            raise CoordinatorError(
                f"ZooKeeper at {self.hosts} did not answer within {self.timeout:g}s "
                f"({self._state()})"
            ) from e
        except KazooException as e:
            raise CoordinatorError(
                f"ZooKeeper at {self.hosts}: {type(e).__name__} {e}".rstrip()
            ) from e

    return wrapper


class _NativeThreadingHandler(SequentialThreadingHandler):
    """kazoo's threading handler on the socket and select modules eventlet left alone.

    With sockets patched but not threads (ryu-manager --enable-debugger), kazoo's
    connection thread is a real thread doing green I/O, which misses its
    deadlines ("socket time-out during write") and the session drops.
    """

    def __init__(self, socket_module: Any, select_module: Any) -> None:
        super().__init__()
        self._socket_module, self._select_module = socket_module, select_module

    def select(self, rlist: Any, wlist: Any, xlist: Any, timeout: float | None = None) -> Any:
        return self._select_module.select(rlist, wlist, xlist, timeout)

    def socket(self) -> Any:
        return kazoo_utils.create_tcp_socket(self._socket_module)

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        return kazoo_utils.create_tcp_connection(self._socket_module, *args, **kwargs)

    def create_socket_pair(self) -> Any:
        return kazoo_utils.create_socket_pair(self._socket_module)


def _handler() -> Any:
    """The native handler when eventlet patched sockets but not threads; else kazoo's own."""
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is None or not patcher.is_monkey_patched("socket"):
        return None
    if patcher.is_monkey_patched("thread"):
        # everything green (ryu-manager without --enable-debugger): kazoo's own
        # threading handler blocks the hub in its selector and deadlocks
        from kazoo.handlers.eventlet import SequentialEventletHandler

        return SequentialEventletHandler()
    return _NativeThreadingHandler(patcher.original("socket"), patcher.original("select"))


def _version(gen: int, next_seq: int) -> int:
    return gen << _SEQ_BITS | next_seq


def _seq(name: str) -> int:
    return int(name[len(_ENTRY) :])


def _latest_order(entries: Iterable[list[str]]) -> list[str]:
    """Keys of the entries (oldest first), each once, in the order of its latest change."""
    order: dict[str, None] = {}
    for keys in entries:
        for key in keys:
            order.pop(key, None)
            order[key] = None
    return list(order)


def _failure(results: list[Any]) -> tuple[int, Exception] | None:
    """The failed operation of a transaction's results (the others just rolled back)."""
    for i, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(
            result, RolledBackError | RuntimeInconsistency
        ):
            return i, result
    return None


class ZooKeeperCoordinator(Coordinator):
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
    ) -> None:
        if not prefix.startswith("/"):
            raise CoordinatorError(f"ZooKeeper prefix must be an absolute path, not {prefix!r}")
        if log_size < 1 or trim_every < 1 or not 1 <= rollover < 1 << 31:
            raise CoordinatorError("log_size, trim_every and rollover must be positive")
        self.hosts = hosts
        self.prefix = prefix.rstrip("/")
        self.timeout = timeout
        self.log_size = log_size
        self.trim_every = trim_every
        self.rollover = rollover
        self._kv = f"{self.prefix}/{KV}"
        self._changes = f"{self.prefix}/{CHANGES}"
        self._stale: list[KazooClient] = []
        self._watches: weakref.WeakSet[_PushWatch] = weakref.WeakSet()
        self._client: KazooClient | None = None
        self._pid = -1
        self._closed = False
        self._connect()

    # ----- connection ----------------------------------------------------------------------

    def _connect(self) -> None:
        """Open this process's session and make sure the layout exists."""
        self._lock = threading.Lock()
        self._gen = -1
        # (gen, czxid, cversion, entry numbers): the log listing, valid while cversion holds
        self._listing_cache: tuple[int, int, int, list[int]] | None = None
        self._entry_cache: dict[tuple[int, int], list[str]] = {}
        # reconnect attempts at most a second apart: an ensemble back up is used at once
        handler = _handler() or SequentialThreadingHandler()
        retry = KazooRetry(
            max_tries=-1, delay=0.1, backoff=2, max_delay=1.0, sleep_func=handler.sleep_func
        )
        client = KazooClient(
            hosts=self.hosts, timeout=self.timeout, connection_retry=retry, handler=handler
        )
        try:
            client.start(timeout=self.timeout)
        except _timeouts() as e:
            _end(client)
            raise CoordinatorError(
                f"cannot reach ZooKeeper at {self.hosts} within {self.timeout:g}s"
            ) from e
        self._client, self._pid = client, os.getpid()
        try:
            self._wait(client.ensure_path_async(self._kv))
            self._wait(client.ensure_path_async(self._changes))
            if not self._wait(client.get_children_async(self._changes)):
                try:
                    self._wait(client.create_async(f"{self._changes}/{_GEN}{0:010d}"))
                except NodeExistsError:
                    pass  # another process initialised the store at the same time
            self._refresh_gen()
        except (KazooException, CoordinatorError) as e:
            self._client, self._pid = None, -1  # the next request tries again
            _end(client)
            if isinstance(e, CoordinatorError):
                raise
            raise CoordinatorError(
                f"cannot set up {self.prefix} on ZooKeeper at {self.hosts}: {e!r}"
            ) from e

    def _zk(self) -> KazooClient:
        """This process's client; a forked child opens its own session first."""
        if self._closed:
            raise CoordinatorError(f"ZooKeeper coordinator {self.hosts}{self.prefix} is closed")
        if self._pid != os.getpid():
            if self._client is not None:
                # inherited over fork: its threads are gone and its socket is the parent's
                self._stale.append(self._client)
                self._client = None
            self._connect()
        assert self._client is not None
        return self._client

    def _state(self) -> str:
        state = self._client.state if self._client is not None else None
        return {
            KazooState.CONNECTED: "connected",
            KazooState.SUSPENDED: "connection lost, reconnecting",
            KazooState.LOST: "session lost, reconnecting",
        }.get(state, "closed")

    def _wait(self, result: Any) -> Any:
        """The outcome of an async kazoo request, waiting at most ``timeout``."""
        return result.get(timeout=self.timeout)

    def _retry(self, fn: Callable[[], R]) -> R:
        """Run an idempotent request again after a connection loss, until ``timeout``."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return fn()
            except ConnectionLoss:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)  # the retried request queues until the session reconnects

    def close(self) -> None:
        """End this process's session; the coordinator cannot be used afterwards."""
        self._closed = True
        for watch in list(self._watches):
            watch.stop()
        client, self._client = self._client, None
        if client is not None and self._pid == os.getpid():
            _end(client)

    # ----- paths ---------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return f"{self._kv}/{check_key(key)}"

    def _key(self, path: str) -> str:
        return path[len(self._kv) + 1 :]

    def _gen_path(self, gen: int) -> str:
        return f"{self._changes}/{_GEN}{gen:010d}"

    def _refresh_gen(self) -> int:
        names = self._wait(self._zk().get_children_async(self._changes))
        gens = [int(n[len(_GEN) :]) for n in names if n.startswith(_GEN) and n[1:].isdigit()]
        if not gens:
            raise CoordinatorError(f"ZooKeeper store {self._changes} has no change log")
        with self._lock:
            self._gen = max(gens)
            return self._gen

    # ----- writes --------------------------------------------------------------------------

    def _commit(self, ops: Callable[[TransactionRequest], None], keys: list[str]) -> list[Any]:
        """One transaction of ``ops`` plus a change-log entry for ``keys`` (if any).

        Returns the results of ``ops`` when the transaction fails on one of them;
        a log generation that went away meanwhile is looked up again.
        """
        entry = json.dumps(keys, separators=(",", ":")).encode()
        for _ in range(_ATTEMPTS):
            gen = self._gen
            txn = self._zk().transaction()
            ops(txn)
            if keys:
                txn.create(f"{self._gen_path(gen)}/{_ENTRY}", entry, sequence=True)
            results = self._wait(txn.commit_async())
            failed = _failure(results)
            if failed is None:
                if keys:
                    self._after_write(gen, _seq(results[-1].rsplit("/", 1)[1]))
                return results
            if keys and failed[0] == len(results) - 1 and isinstance(failed[1], NoNodeError):
                self._refresh_gen()  # the log rolled over to a new generation
                continue
            return results
        raise CoordinatorError(f"ZooKeeper change log {self._changes} keeps moving; giving up")

    def _ensure_parent(self, path: str) -> None:
        self._wait(self._zk().ensure_path_async(path.rsplit("/", 1)[0]))

    @_guarded
    def put(self, key: str, value: Any) -> None:
        path = self._path(key)
        data = self._data(key, value)
        self._retry(lambda: self._put(key, path, data))

    def _put(self, key: str, path: str, data: bytes) -> None:
        exists = True  # most writes replace a value (heartbeats, statuses)
        for _ in range(_ATTEMPTS):
            if exists:
                failed = _failure(self._commit(lambda t: t.set_data(path, data), [key]))
                if failed is None:
                    return
                if not isinstance(failed[1], NoNodeError):
                    raise failed[1]
                exists = False
                continue
            failed = _failure(self._commit(lambda t: t.create(path, data), [key]))
            if failed is None:
                return
            if isinstance(failed[1], NoNodeError):
                self._ensure_parent(path)
            elif isinstance(failed[1], NodeExistsError):
                exists = True  # created meanwhile: replace it
            else:
                raise failed[1]
        raise CoordinatorError(f"cannot write {key!r}: it keeps changing under us")

    @_guarded
    def create(self, key: str, value: Any) -> bool:
        path = self._path(key)
        data = self._data(key, value)
        for _ in range(_ATTEMPTS):
            try:
                failed = _failure(self._commit(lambda t: t.create(path, data), [key]))
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
            failed = _failure(
                self._commit(lambda t, v=stat.version: t.set_data(path, data, version=v), [key])
            )
            if failed is None:
                return True
            if not isinstance(failed[1], BadVersionError | NoNodeError):
                raise failed[1]
        raise CoordinatorError(f"cannot create {key!r}: it keeps changing under us")

    @_guarded
    def delete(self, key: str) -> None:
        path = self._path(key)
        self._retry(lambda: self._delete(key, path))

    def _delete(self, key: str, path: str) -> None:
        for _ in range(_ATTEMPTS):
            nodes = self._walk(path)
            if not nodes:
                return
            nodes.sort(key=lambda node: -node[0].count("/"))  # children before parents
            for batch in _batches(nodes):
                keys = sorted(self._key(p) for p, stat in batch if stat.dataLength > 0)

                def ops(t: TransactionRequest, batch: list[tuple[str, ZnodeStat]] = batch) -> None:
                    for p, stat in batch:
                        t.delete(p, version=stat.version)

                failed = _failure(self._commit(ops, keys))
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

    @_guarded
    def get(self, key: str) -> Any:
        path = self._path(key)
        try:
            data, _ = self._retry(lambda: self._wait(self._zk().get_async(path)))
        except NoNodeError:
            return None
        return decode(key, data) if data else None

    @_guarded
    def list(self, prefix: str = "") -> list[str]:
        root = self._path(prefix) if prefix else self._kv
        nodes = self._retry(lambda: self._walk(root))
        return sorted(self._key(p) for p, stat in nodes if p != root and stat.dataLength > 0)

    def _walk(self, root: str) -> list[tuple[str, ZnodeStat]]:
        """Every znode of the subtree at ``root`` with its stat, one pipelined level at a time."""
        client = self._zk()
        out: list[tuple[str, ZnodeStat]] = []
        level = [root]
        while level:
            pending = [(p, client.get_children_async(p, include_data=True)) for p in level]
            level = []
            for p, result in pending:
                try:
                    children, stat = self._wait(result)
                except NoNodeError:
                    continue  # deleted while we walked
                out.append((p, stat))
                level += [f"{p}/{c}" for c in children]
        return out

    # ----- change log ----------------------------------------------------------------------

    @_guarded
    def version(self) -> int:
        gen, seqs = self._retry(self._listing)
        return _version(gen, seqs[-1] + 1 if seqs else 0)

    @_guarded
    def changes_since(self, version: int) -> tuple[int, list[str]]:
        return self._retry(lambda: self._changes_since(version))

    @_guarded
    def _armed_changes(self, version: int, watch: Callable[[Any], None]) -> tuple[int, list[str]]:
        """``changes_since`` that also arms a child watch on the log (for ``watch()``)."""
        return self._changes_since(version, watch)

    def _listing(self, watch: Callable[[Any], None] | None = None) -> tuple[int, list[int]]:
        """(generation, sorted entry numbers) of the log; ``watch`` arms a child watch."""
        client = self._zk()
        for _ in range(_ATTEMPTS):
            gen = self._gen
            path = self._gen_path(gen)
            try:
                if watch is None:  # cheap check first: the listing is unchanged most of the time
                    stat = self._wait(client.exists_async(path))
                    if stat is None:
                        raise NoNodeError(path)
                    cached = self._listing_cache
                    if cached and cached[:3] == (gen, stat.czxid, stat.cversion):
                        return gen, cached[3]
                names, stat = self._wait(
                    client.get_children_async(path, watch=watch, include_data=True)
                )
            except NoNodeError:
                self._refresh_gen()
                continue
            seqs = sorted(_seq(n) for n in names if n.startswith(_ENTRY))
            with self._lock:
                self._listing_cache = (gen, stat.czxid, stat.cversion, seqs)
            return gen, seqs
        raise CoordinatorError(f"ZooKeeper change log {self._changes} keeps moving")

    def _changes_since(
        self, version: int, watch: Callable[[Any], None] | None = None
    ) -> tuple[int, list[str]]:
        gen, seqs = self._listing(watch)
        newest = seqs[-1] + 1 if seqs else 0
        current = _version(gen, newest)
        if version == current:
            return current, []
        v_gen, v_seq = version >> _SEQ_BITS, version & ((1 << _SEQ_BITS) - 1)
        # Trims remove a prefix of the log: if the entry the caller saw last (or an older
        # one) is still there, every entry after it is too.
        if v_gen == gen and v_seq <= newest and (not seqs or seqs[0] <= v_seq):
            entries = self._entries(gen, seqs[bisect.bisect_left(seqs, v_seq) :])
            if entries is not None:
                return current, _latest_order(entries)
        return current, self._resync(gen, seqs)

    def _resync(self, gen: int, seqs: list[int]) -> list[str]:
        """For a caller that fell behind the log: every key, the logged ones in log order."""
        entries = self._entries(gen, seqs, skip_missing=True) or []
        logged = _latest_order(entries)
        seen = set(logged)
        return [k for k in self._walk_keys() if k not in seen] + logged

    def _walk_keys(self) -> list[str]:
        return sorted(self._key(p) for p, stat in self._walk(self._kv) if stat.dataLength > 0)

    def _entries(
        self, gen: int, seqs: list[int], skip_missing: bool = False
    ) -> list[list[str]] | None:
        """The keys of each entry (cached: entries never change); None if one was trimmed."""
        client = self._zk()
        path = self._gen_path(gen)
        with self._lock:
            known = {s: self._entry_cache.get((gen, s)) for s in seqs}
        pending = {
            s: client.get_async(f"{path}/{_ENTRY}{s:010d}")
            for s, keys in known.items()
            if keys is None
        }
        out: list[list[str]] = []
        for s in seqs:
            keys = known[s]
            if s in pending:
                try:
                    data, _ = self._wait(pending[s])
                except NoNodeError:
                    if skip_missing:
                        continue
                    return None
                keys = decode(f"{path}/{_ENTRY}{s:010d}", data)
                if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                    raise CoordinatorError(f"change-log entry {path}/{s} is malformed")
                with self._lock:
                    self._entry_cache[(gen, s)] = keys
            assert keys is not None
            out.append(keys)
        with self._lock:
            if len(self._entry_cache) > 2 * (self.log_size + self.trim_every):
                keep = set(seqs)
                self._entry_cache = {
                    k: v for k, v in self._entry_cache.items() if k[0] == gen and k[1] in keep
                }
        return out

    def _after_write(self, gen: int, seq: int) -> None:
        """Keep the log bounded; best effort, as whoever writes next will try again."""
        try:
            if seq >= self.rollover:
                self._roll_over(gen)
            elif seq and seq % self.trim_every == 0:
                self._trim(gen)
        except NoNodeError:
            pass  # the generation rolled over meanwhile: nothing left to trim
        except (KazooException, CoordinatorError):
            log.warning("could not trim the change log %s", self._changes, exc_info=True)

    def _trim(self, gen: int) -> None:
        client = self._zk()
        path = self._gen_path(gen)
        seqs = sorted(_seq(n) for n in self._wait(client.get_children_async(path)))
        doomed = seqs[: max(0, len(seqs) - self.log_size)]
        for i in range(0, len(doomed), _MAX_TXN_OPS):  # oldest first: always a prefix
            txn = client.transaction()
            for s in doomed[i : i + _MAX_TXN_OPS]:
                txn.delete(f"{path}/{_ENTRY}{s:010d}")
            if _failure(self._wait(txn.commit_async())) is not None:
                return  # another writer is trimming the same entries
        if doomed:
            log.debug("trimmed %d change-log entries of %s", len(doomed), path)

    def _roll_over(self, gen: int) -> None:
        """Replace generation ``gen`` by ``gen + 1`` in one transaction (empty log, new numbers)."""
        client = self._zk()
        path = self._gen_path(gen)
        try:
            names = self._wait(client.get_children_async(path))
        except NoNodeError:  # another writer rolled it over first
            self._refresh_gen()
            return
        txn = client.transaction()
        for name in names:
            txn.delete(f"{path}/{name}")
        txn.delete(path)
        txn.create(self._gen_path(gen + 1))
        if _failure(self._wait(txn.commit_async())) is None:
            log.info("change log %s rolled over to generation %d", self._changes, gen + 1)
        self._refresh_gen()

    # ----- watch ---------------------------------------------------------------------------

    def watch(self, callback: Callable[[list[str]], None], interval: float = 0.05) -> Watch:
        """Like the base watch, but woken by a ZooKeeper child watch on the change log.

        ``interval`` only bounds how long a lost notification can go unnoticed (at
        least 1 s): changes are pushed, not polled.
        """
        watch = _PushWatch(self, callback, max(interval, 1.0))
        self._watches.add(watch)
        return watch


def _end(client: KazooClient) -> None:
    """Stop a client's threads and end its session (best effort: it may be gone)."""
    try:
        client.stop()
        client.close()
    except KazooException:
        log.debug("closing the ZooKeeper session failed", exc_info=True)


def _batches(nodes: list[tuple[str, ZnodeStat]]) -> Iterable[list[tuple[str, ZnodeStat]]]:
    """Split deletes so no transaction exceeds ZooKeeper's request size."""
    batch: list[tuple[str, ZnodeStat]] = []
    size = 0
    for node in nodes:
        cost = len(node[0]) * 2 + 32  # the delete and the key in the log entry
        if batch and (len(batch) >= _MAX_TXN_OPS or size + cost > _MAX_TXN_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(node)
        size += cost
    if batch:
        yield batch


class _PushWatch(Watch):
    """A watch thread that sleeps until ZooKeeper reports a new change-log entry."""

    def __init__(
        self,
        coordinator: ZooKeeperCoordinator,
        callback: Callable[[list[str]], None],
        interval: float,
    ) -> None:
        self._wake = threading.Event()
        self._zk_coordinator = coordinator
        super().__init__(coordinator, callback, interval)

    def _fired(self, _event: Any) -> None:
        """Kazoo's event thread: only wake ours (a slow callback must not block kazoo)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            pause = self._interval
            try:
                # the read that re-arms the watch also returns the entries to report
                self.version, keys = self._zk_coordinator._armed_changes(self.version, self._fired)
                if keys and not self._stop.is_set():
                    self._callback(keys)
            except Exception:  # a watcher must outlive one bad callback or read
                log.exception("coordinator watch callback failed")
                pause = min(pause, 0.5)  # the watch may not be armed: look again soon
            self._wake.wait(pause)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        super().stop(timeout)
