"""The servers ``typhoon bench --only connectors`` starts (benchmarks/connector_servers.py),
for real: a Redis and a PostgreSQL on loopback ports, the stream of generated sentences,
the wordcount table, and nothing left after ``close()``."""

from __future__ import annotations

from collections import Counter

import psycopg
import redis

from benchmarks.connector_servers import STREAM, TABLE, LocalServers
from benchmarks.scenarios.connectors import table_problem
from typhoon.operators.sources import generate_sentences


def test_local_servers_hold_the_workload_and_go_away():
    servers = LocalServers()
    try:
        want = servers.prepare(300, seed=4)
        assert want == Counter(
            w for s in generate_sentences(300, seed=4, words=6) for w in s.split()
        )
        client = redis.Redis.from_url(servers.redis_url)
        assert client.xlen(STREAM) == 300
        first = client.xrange(STREAM, count=1)[0][1]
        assert list(first) == [b"line"]
        client.close()
        assert servers.rows() == []
        rows = [(w, i) for w, n in want.items() for i in range(1, n + 1)]
        with psycopg.connect(servers.pg_dsn, autocommit=True) as c:
            c.cursor().executemany(f"INSERT INTO {TABLE} VALUES (%s, %s)", rows)
        assert table_problem(servers.rows(), want) == ""
        servers.clear()
        assert servers.rows() == []
        again = servers.prepare(10, seed=5)  # a second prepare starts over
        assert sum(again.values()) == 60
    finally:
        servers.close()
    assert not servers.dir.exists() and not servers.pg_dir.exists()
    assert servers.redis_proc is not None and servers.redis_proc.poll() is not None
    try:
        psycopg.connect(servers.pg_dsn, connect_timeout=2).close()
        raise AssertionError("PostgreSQL still answers after close()")
    except psycopg.OperationalError:
        pass
