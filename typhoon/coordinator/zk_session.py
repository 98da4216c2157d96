"""One ZooKeeper session per process, and the znode paths of the store.

``typhoon/coordinator/zookeeper.py`` describes the layout; this module only
connects (again after a fork), turns kazoo's errors into ``CoordinatorError``
and waits for asynchronous requests at most ``timeout`` seconds.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
)
from kazoo.protocol.states import KazooState, ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import CREATOR_ALL_ACL, OPEN_ACL_UNSAFE

from .base import CoordinatorError, Watch, check_key
from .zk_handler import session_handler, timeouts

log = logging.getLogger("typhoon.coordinator.zookeeper")

KV = "kv"
CHANGES = "changes"
GEN = "g"

P = ParamSpec("P")
R = TypeVar("R")


def guarded(method: Callable[P, R]) -> Callable[P, R]:
    """Turn kazoo's errors (lost connection, timeouts, closed client) into CoordinatorError."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        self = args[0]
        assert isinstance(self, ZooKeeperSession)
        try:
            return method(*args, **kwargs)
        except CoordinatorError:
            raise
        except NoAuthError as e:
            raise CoordinatorError(self._refused()) from e
        except timeouts() as e:
            raise CoordinatorError(
                f"ZooKeeper at {self.hosts} did not answer within {self.timeout:g}s "
                f"({self._state()})"
            ) from e
        except KazooException as e:
            raise CoordinatorError(
                f"ZooKeeper at {self.hosts}: {type(e).__name__} {e}".rstrip()
            ) from e

    return wrapper


def end_session(client: KazooClient) -> None:
    """Stop a client's threads and end its session (best effort: it may be gone)."""
    try:
        client.stop()
        client.close()
    except KazooException:
        log.debug("closing the ZooKeeper session failed", exc_info=True)


class ZooKeeperSession:
    """This process's kazoo client for the store under ``prefix``."""

    def __init__(self, hosts: str, prefix: str, timeout: float, auth: str | None = None) -> None:
        if not prefix.startswith("/"):
            raise CoordinatorError(f"ZooKeeper prefix must be an absolute path, not {prefix!r}")
        self.hosts = hosts
        self._auth = auth  # "user:password" (typhoon/coordinator/zk_auth.py), never logged
        self.prefix = prefix.rstrip("/")
        self.timeout = timeout
        self._kv = f"{self.prefix}/{KV}"
        self._changes = f"{self.prefix}/{CHANGES}"
        self._stale: list[KazooClient] = []
        self._watches: weakref.WeakSet[Watch] = weakref.WeakSet()
        self._client: KazooClient | None = None
        self._pid = -1
        self._closed = False

    # ----- connection ----------------------------------------------------------------------

    def _connect(self) -> None:
        """Open this process's session and make sure the layout exists."""
        self._lock = threading.Lock()
        self._gen = -1
        # (gen, czxid, cversion, entry numbers): the log listing, valid while cversion holds
        self._listing_cache: tuple[int, int, int, list[int]] | None = None
        self._entry_cache: dict[tuple[int, int], list[str]] = {}
        # reconnect attempts at most a second apart: an ensemble back up is used at once
        handler = session_handler()
        retry = KazooRetry(
            max_tries=-1, delay=0.1, backoff=2, max_delay=1.0, sleep_func=handler.sleep_func
        )
        secured: dict[str, Any] = {}
        if self._auth is not None:  # digest identity; every znode made: creator-only
            secured = {"auth_data": [("digest", self._auth)], "default_acl": CREATOR_ALL_ACL}
        client = KazooClient(
            hosts=self.hosts,
            timeout=self.timeout,
            connection_retry=retry,
            handler=handler,
            **secured,
        )
        try:
            client.start(timeout=self.timeout)
        except timeouts() as e:
            end_session(client)
            raise CoordinatorError(
                f"cannot reach ZooKeeper at {self.hosts} within {self.timeout:g}s"
            ) from e
        self._client, self._pid = client, os.getpid()
        try:
            parent = self.prefix.rsplit("/", 1)[0]
            if self._auth is not None and parent:
                # ancestors are not ours (/apps of /apps/typhoon): made open, as without
                # credentials; the prefix and everything under it are creator-only
                self._wait(client.ensure_path_async(parent, acl=OPEN_ACL_UNSAFE))
            self._wait(client.ensure_path_async(self._kv))
            self._wait(client.ensure_path_async(self._changes))
            if self._auth is not None:
                self._secure_tree(client)
            if not self._wait(client.get_children_async(self._changes)):
                try:
                    self._wait(client.create_async(f"{self._changes}/{GEN}{0:010d}"))
                except NodeExistsError:
                    pass  # another process initialised the store at the same time
            self._refresh_gen()
        except (KazooException, CoordinatorError) as e:
            self._client, self._pid = None, -1  # the next request tries again
            end_session(client)
            if isinstance(e, CoordinatorError):
                raise
            if isinstance(e, NoAuthError):
                raise CoordinatorError(self._refused()) from e
            raise CoordinatorError(
                f"cannot set up {self.prefix} on ZooKeeper at {self.hosts}: {e!r}"
            ) from e

    def _refused(self) -> str:
        how = (
            "its credentials are not the ones the store was made with"
            if self._auth is not None
            else "the store has ACLs: add ?auth_file=FILE to the coordinator URL"
        )
        return f"ZooKeeper at {self.hosts} refused access to {self.prefix}: {how}"

    def _secure_tree(self, client: KazooClient) -> None:
        """Give every znode under the prefix the creator-only ACL if the store was made
        open (before credentials were configured); a store made with them is left alone."""
        acls, _ = self._wait(client.get_acls_async(self.prefix))
        if not any(acl.id.scheme == "world" for acl in acls):
            return
        nodes = [path for path, _ in self._walk(self.prefix)]
        log.warning("ZooKeeper store %s had open ACLs: securing its %d znodes", self.prefix,
                    len(nodes))  # fmt: skip
        for path in nodes:
            try:
                self._wait(client.set_acls_async(path, CREATOR_ALL_ACL))
            except NoNodeError:
                continue  # deleted meanwhile

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
            end_session(client)

    # ----- paths ---------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return f"{self._kv}/{check_key(key)}"

    def _key(self, path: str) -> str:
        return path[len(self._kv) + 1 :]

    def _gen_path(self, gen: int) -> str:
        return f"{self._changes}/{GEN}{gen:010d}"

    def _refresh_gen(self) -> int:
        names = self._wait(self._zk().get_children_async(self._changes))
        gens = [int(n[len(GEN) :]) for n in names if n.startswith(GEN) and n[1:].isdigit()]
        if not gens:
            raise CoordinatorError(f"ZooKeeper store {self._changes} has no change log")
        with self._lock:
            self._gen = max(gens)
            return self._gen

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
