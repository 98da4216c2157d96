"""Fixtures for the Spark engine tests: a real local Spark session, shared per module.

A local session takes seconds to start (tens of seconds on a loaded machine),
so modules that need one share it; the whole-run tests start their own Spark
driver process, as a real run does.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).parents and "spark" in item.fixturenames:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local[2] session with the ``typhoon`` data source registered."""
    if shutil.which("java") is None:
        pytest.fail("Java is not installed: the Spark engine needs a JDK (make setup)")
    from pyspark_bridge.driver import build_session

    session = build_session(
        {
            "app": "tests",
            "host": "local",
            "conf": {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2"},
        }
    )
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()
