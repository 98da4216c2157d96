"""Fixtures shared by every test directory: a real ZooKeeper server.

``zookeeper_server`` starts one server per test session, on first use only
(SQLite-only runs never start a JVM), and always stops it; see ``zkserver.py``.

The suite does not depend on how it was started: a shell starts a background
job (CI, ``make test &``) with SIGINT ignored, and an ignored signal stays
ignored in every child, so a child a test stops with SIGINT would never stop.
A handled signal is reset to its default on exec: the session handles SIGINT
as Python does by default, and every child starts with the default.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from zkserver import ZooKeeperServer, start_zookeeper


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def tcp_jobs_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """tcp runs' entries (typhoon/tcp_jobs.py: `typhoon run --transport tcp` registers its
    control endpoint by the job's name) in the session's own directory, not the home's."""
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("tcp-jobs")
        mp.setenv("TYPHOON_TCP_JOBS", str(path))
        yield path


# Every Spark driver JVM a test starts (in-process sessions, `typhoon run`, the agents'
# drivers: they inherit the environment) compiles with C1 only.  A test's Spark work is
# seconds of cold code, where C2's compiler threads cost more CPU than they save: a local
# session plus three micro-batches took 38 CPU-s instead of 67 here (docs/testing.md).
SPARK_TEST_JAVA_OPTS = "-XX:TieredStopAtLevel=1"


@pytest.fixture(scope="session", autouse=True)
def spark_driver_java_opts() -> Iterator[str]:
    """``SPARK_SUBMIT_OPTS`` (read by spark-submit for the driver's JVM) with C1 only."""
    with pytest.MonkeyPatch.context() as mp:
        opts = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {SPARK_TEST_JAVA_OPTS}".strip()
        mp.setenv("SPARK_SUBMIT_OPTS", opts)
        yield opts


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
