"""Fixtures shared by every test directory: a real ZooKeeper server.

``zookeeper_server`` starts one server per test session, on first use only
(SQLite-only runs never start a JVM), and always stops it; see ``zkserver.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from zkserver import ZooKeeperServer, start_zookeeper


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One ZooKeeper server for the whole session (started on first use)."""
    server = start_zookeeper(tmp_path_factory.mktemp("zookeeper"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A server of the test's own, for tests that stop or break it (the session one is shared)."""
    server = start_zookeeper(tmp_path / "zookeeper")
    try:
        yield server
    finally:
        server.stop()
