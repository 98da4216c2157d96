"""The store's change log: versions, reads of what changed, trimming, rollover, watches.

The scheme is described in ``typhoon/coordinator/zookeeper.py``: every write adds
a sequential entry listing its keys; a reader asks for the keys changed since the
version it saw, and a ``watch`` is woken by a ZooKeeper child watch on the log.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.exceptions import KazooException, NoNodeError, RolledBackError, RuntimeInconsistency

from .base import CoordinatorError, Watch, decode
from .zk_session import ZooKeeperSession, guarded, log

ENTRY = "c"
SEQ_BITS = 32
MAX_TXN_OPS = 1000  # operations in one transaction (a trim, a delete of a subtree)
ATTEMPTS = 50  # optimistic retries of one write against concurrent writers


def log_version(gen: int, next_seq: int) -> int:
    return gen << SEQ_BITS | next_seq


def entry_seq(name: str) -> int:
    return int(name[len(ENTRY) :])


def latest_order(entries: Iterable[list[str]]) -> list[str]:
    """Keys of the entries (oldest first), each once, in the order of its latest change."""
    order: dict[str, None] = {}
    for keys in entries:
        for key in keys:
            order.pop(key, None)
            order[key] = None
    return list(order)


def failure(results: list[Any]) -> tuple[int, Exception] | None:
    """The failed operation of a transaction's results (the others just rolled back)."""
    for i, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(
            result, RolledBackError | RuntimeInconsistency
        ):
            return i, result
    return None


class ChangeLog(ZooKeeperSession):
    """The change-log half of the ZooKeeper coordinator (its writes add the entries)."""

    log_size: int
    trim_every: int
    rollover: int

    @guarded
    def version(self) -> int:
        gen, seqs = self._retry(self._listing)
        return log_version(gen, seqs[-1] + 1 if seqs else 0)

    @guarded
    def changes_since(self, version: int) -> tuple[int, list[str]]:
        return self._retry(lambda: self._changes_since(version))

    @guarded
    def _armed_changes(self, version: int, watch: Callable[[Any], None]) -> tuple[int, list[str]]:
        """``changes_since`` that also arms a child watch on the log (for ``watch()``)."""
        return self._changes_since(version, watch)

    def _listing(self, watch: Callable[[Any], None] | None = None) -> tuple[int, list[int]]:
        """(generation, sorted entry numbers) of the log; ``watch`` arms a child watch."""
        client = self._zk()
        for _ in range(ATTEMPTS):
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
            seqs = sorted(entry_seq(n) for n in names if n.startswith(ENTRY))
            with self._lock:
                self._listing_cache = (gen, stat.czxid, stat.cversion, seqs)
            return gen, seqs
        raise CoordinatorError(f"ZooKeeper change log {self._changes} keeps moving")

    def _changes_since(
        self, version: int, watch: Callable[[Any], None] | None = None
    ) -> tuple[int, list[str]]:
        gen, seqs = self._listing(watch)
        newest = seqs[-1] + 1 if seqs else 0
        current = log_version(gen, newest)
        if version == current:
            return current, []
        v_gen, v_seq = version >> SEQ_BITS, version & ((1 << SEQ_BITS) - 1)
        # Trims remove a prefix of the log: if the entry the caller saw last (or an older
        # one) is still there, every entry after it is too.
        if v_gen == gen and v_seq <= newest and (not seqs or seqs[0] <= v_seq):
            entries = self._entries(gen, seqs[bisect.bisect_left(seqs, v_seq) :])
            if entries is not None:
                return current, latest_order(entries)
        return current, self._resync(gen, seqs)

    def _resync(self, gen: int, seqs: list[int]) -> list[str]:
        """For a caller that fell behind the log: every key, the logged ones in log order."""
        entries = self._entries(gen, seqs, skip_missing=True) or []
        logged = latest_order(entries)
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
            s: client.get_async(f"{path}/{ENTRY}{s:010d}")
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
                keys = decode(f"{path}/{ENTRY}{s:010d}", data)
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
        seqs = sorted(entry_seq(n) for n in self._wait(client.get_children_async(path)))
        doomed = seqs[: max(0, len(seqs) - self.log_size)]
        for i in range(0, len(doomed), MAX_TXN_OPS):  # oldest first: always a prefix
            txn = client.transaction()
            for s in doomed[i : i + MAX_TXN_OPS]:
                txn.delete(f"{path}/{ENTRY}{s:010d}")
            if failure(self._wait(txn.commit_async())) is not None:
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
        if failure(self._wait(txn.commit_async())) is None:
            log.info("change log %s rolled over to generation %d", self._changes, gen + 1)
        self._refresh_gen()

    # ----- watch ---------------------------------------------------------------------------

    def watch(self, callback: Callable[[list[str]], None], interval: float = 0.05) -> Watch:
        """Like the base watch, but woken by a ZooKeeper child watch on the change log.

        ``interval`` only bounds how long a lost notification can go unnoticed (at
        least 1 s): changes are pushed, not polled.
        """
        watch = PushWatch(self, callback, max(interval, 1.0))
        self._watches.add(watch)
        return watch


class PushWatch(Watch):
    """A watch thread that sleeps until ZooKeeper reports a new change-log entry."""

    def __init__(
        self,
        coordinator: ChangeLog,
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
