"""Fixtures of the connector tests: a Redis, a PostgreSQL and a NATS server of their own per test
module, on free loopback ports with temporary data directories (``tests/dbservers.py``).
A missing server binary fails the test with a sentence; it is never skipped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dbservers import (
    NatsServer,
    PostgresServer,
    RedisServer,
    remove,
    start_nats,
    start_postgres,
    start_redis,
)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    try:
        yield server
    finally:
        remove(server)


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[PostgresServer]:
    server = start_postgres()
    try:
        yield server
    finally:
        remove(server)


@pytest.fixture(scope="module")
def nats_server() -> Iterator[NatsServer]:
    server = start_nats()
    try:
        yield server
    finally:
        remove(server)
