"""The coordinator (paper Table 1): one interface, an SQLite and a ZooKeeper backend.

``open_coordinator(url)`` picks the backend from a URL so every process of a
deployment is configured by one string (``--coordinator`` or the environment
variable ``TYPHOON_COORDINATOR``):

* ``sqlite:///var/lib/typhoon/coordinator.db`` or a plain path: SQLite file
  (one machine, the default);
* ``zk://host1:2181,host2:2181/typhoon``: ZooKeeper ensemble, keys under the
  path prefix (default ``/typhoon``); ``?auth_file=/etc/typhoon/zk-auth`` turns
  on digest authentication and creator-only ACLs (``zk_auth.py``).
"""

from __future__ import annotations

import os

from .base import (
    WORKER_STATES,
    AgentState,
    Coordinator,
    CoordinatorError,
    Watch,
    WorkerStatus,
)
from .sqlite import ENV_VAR, SqliteCoordinator, default_path
from .zk_auth import ZkUrl, split_query

__all__ = [
    "ENV_VAR",
    "WORKER_STATES",
    "AgentState",
    "Coordinator",
    "CoordinatorError",
    "SqliteCoordinator",
    "Watch",
    "WorkerStatus",
    "coordinator_url",
    "open_coordinator",
    "parse_zk_url",
    "zk_url",
]

DEFAULT_ZK_PREFIX = "/typhoon"


def parse_zk_url(url: str) -> tuple[str, str]:
    """``zk://h1:2181,h2:2181/prefix`` -> (kazoo hosts string, znode prefix)."""
    parsed = zk_url(url)
    return parsed.hosts, parsed.prefix


def zk_url(url: str) -> ZkUrl:
    """``zk://h1:2181,h2:2181/prefix?auth_file=FILE`` taken apart (the file is not read)."""
    url, params = split_query(url)
    rest = url[len("zk://") :]
    hosts, slash, path = rest.partition("/")
    if not hosts:
        raise CoordinatorError(f"coordinator URL {url!r} names no ZooKeeper host")
    prefix = "/" + path.strip("/") if slash and path.strip("/") else DEFAULT_ZK_PREFIX
    return ZkUrl(hosts, prefix, params.get("auth_file"))


def coordinator_url(url: str | None = None) -> str:
    """``url``, else ``TYPHOON_COORDINATOR``, else the default SQLite path."""
    return url or os.environ.get(ENV_VAR, "").strip() or default_path()


def open_coordinator(url: str | None = None) -> Coordinator:
    """The coordinator named by ``url`` (default: ``TYPHOON_COORDINATOR``, else SQLite)."""
    url = coordinator_url(url)
    if url.startswith("zk://"):
        parsed = zk_url(url)
        try:
            from .zookeeper import ZooKeeperCoordinator  # type: ignore[import-not-found]
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.zookeeper":
                raise CoordinatorError(
                    f"ZooKeeper coordinator ({url}) is not implemented yet; "
                    "use an SQLite path or sqlite:///PATH"
                ) from e
            raise CoordinatorError(
                f"ZooKeeper coordinator needs {e.name}: pip install kazoo"
            ) from e
        return ZooKeeperCoordinator(parsed.hosts, parsed.prefix, auth=parsed.credentials())
    if url.startswith("sqlite://"):
        return SqliteCoordinator(url[len("sqlite://") :])
    if "://" in url:
        raise CoordinatorError(f"unknown coordinator URL {url!r}: use sqlite:///PATH or zk://HOST")
    return SqliteCoordinator(url)
