"""The connectors against their real servers, in this process: what the tcp and sdn runs
cannot easily show (a bad tuple at the sink, a commit whose answer was lost, a replay
after the commit, positions of several streams)."""

from __future__ import annotations

from typhoon.operators.base import Context
from typhoon.operators.postgres_sink import EPOCHS_TABLE, PostgresSink
from typhoon.operators.redis_source import RedisStreamSource


def sink(postgres_server, **args) -> PostgresSink:
    s = PostgresSink(dsn=postgres_server.dsn, table="kv", **args)
    s.open(Context("t", "sink", 9, 0, 1, input_fields=["k", "v"], guarantee="exactly_once"))
    return s


def rows(postgres_server) -> list:
    with postgres_server.connect() as c:
        return c.execute("SELECT k, v FROM kv ORDER BY k, v").fetchall()


def test_postgres_upsert_counts_bad_tuples_and_never_writes_an_epoch_twice(postgres_server):
    with postgres_server.connect() as c:
        c.execute("DROP TABLE IF EXISTS kv")
        c.execute("CREATE TABLE kv (k text PRIMARY KEY, v bigint)")
    s = sink(postgres_server, key=["k"])
    s.process_batch([["a", 1], ["b", 1], ["a", 2], ["short"]], None)
    snap = s.snapshot()
    s.anchor_ready(1)
    s.checkpoint_complete(1)
    assert rows(postgres_server) == [("a", 2), ("b", 1)]
    assert s.result() == {"written": 3, "dropped": {"wrong_fields": 1}}
    # a commit retried after its answer was lost finds the epoch recorded: nothing again
    assert s.commit({1: [["a", 99]]}) == 0
    # a replacement restored from the checkpoint of epoch 1 (its rows committed already)
    again = PostgresSink(dsn=postgres_server.dsn, table="kv", key=["k"])
    again.open(Context("t", "sink", 9, 0, 1, input_fields=["k", "v"], guarantee="exactly_once"))
    again.restore(snap)
    again.rewind(1, 1)
    again.process_batch([["c", 5]], None)
    again.job_complete()
    assert rows(postgres_server) == [("a", 2), ("b", 1), ("c", 5)]
    with postgres_server.connect() as c:
        recorded = c.execute(f"SELECT sink, part, epoch FROM {EPOCHS_TABLE}").fetchall()
    assert recorded == [("t/sink/kv", "0", 2)]
    again.close()
    # a new submission (no restore) forgets the old record before its epoch 1
    fresh = sink(postgres_server, key=["k"])
    fresh.process_batch([["d", 1]], None)
    fresh.anchor_ready(1)
    fresh.checkpoint_complete(1)
    assert ("d", 1) in rows(postgres_server)
    fresh.close()
    s.close()


def test_redis_source_reads_several_streams_from_an_id_and_seeks_back(redis_server):
    r = redis_server.client()
    r.delete("s1", "s2")
    ids = [r.xadd("s1", {"x": str(i)}).decode() for i in range(5)]
    for i in range(3):
        r.xadd("s2", {"x": f"b{i}"})
    src = RedisStreamSource(url=redis_server.url, stream=["s1", "s2"], fields=["x"], until="end")
    src.open(Context("t", "src", 1, 0, 1))
    out: list = []
    src.next_batch(lambda v, stream="default": out.append(v[0]), 2)
    saved = src.offset()
    rest: list = []
    while src.next_batch(lambda v, stream="default": rest.append(v[0]), 2):
        pass
    assert sorted(out + rest) == ["0", "1", "2", "3", "4", "b0", "b1", "b2"]
    r.xadd("s1", {"x": "late"})  # after the start: past until=end, also for a replacement
    again = RedisStreamSource(url=redis_server.url, stream=["s1", "s2"], fields=["x"], until="end")
    again.open(Context("t", "src", 1, 0, 1))
    again.seek(saved)
    replay: list = []
    while again.next_batch(lambda v, stream="default": replay.append(v[0]), 2):
        pass
    assert sorted(replay) == sorted(rest)
    assert "late" not in replay
    # from an entry ID: the entries after it; worker 0 of 2 reads only its stream, s1
    after = RedisStreamSource(
        url=redis_server.url, stream=["s1", "s2"], fields=["x"], until="end", **{"from": ids[2]}
    )
    after.open(Context("t", "src", 1, 0, 2))
    got: list = []
    while after.next_batch(lambda v, stream="default": got.append(v[0]), 10):
        pass
    assert after.splits == ["s1"] and got == ["3", "4", "late"]
    for s in (src, again, after):
        s.close()


def open_at_once(postgres_server, n: int) -> list[str]:
    """``n`` sinks of one node open together (a barrier): the errors they raised."""
    import threading

    start, errors, sinks = threading.Barrier(n), [], []

    def one(index: int) -> None:
        s = PostgresSink(dsn=postgres_server.dsn, table="kv", key=["k"])
        ctx = Context("t", "sink", 9 + index, index, n, input_fields=["k", "v"],
                      guarantee="exactly_once")  # fmt: skip
        start.wait()
        try:
            s.open(ctx)
            sinks.append(s)
        except Exception as e:  # noqa: BLE001 - the failure under test
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in sinks:
        s.close()
    return errors


def test_sinks_opening_at_once_on_a_new_database_all_start(postgres_server):
    """Run A here: two sink workers of a fresh job ran ``CREATE TABLE IF NOT EXISTS`` for
    the epoch record at the same moment; PostgreSQL let one of them fail on its catalog's
    unique index (``pg_type_typname_nsp_index``) and that worker exited with 1."""
    with postgres_server.connect() as c:
        c.execute("DROP TABLE IF EXISTS kv")
        c.execute("CREATE TABLE kv (k text PRIMARY KEY, v bigint)")
    for _ in range(5):  # the race is a window of microseconds: several rounds of 8
        with postgres_server.connect() as c:
            c.execute(f"DROP TABLE IF EXISTS {EPOCHS_TABLE}")
        assert open_at_once(postgres_server, 8) == []


def test_the_minute_counts_example_in_this_process_equals_the_reference(
    redis_server, postgres_server, monkeypatch
):
    """``topologies/redis_minute_counts.yaml``'s operators, built from the file's args and
    chained here (no workers): Redis events -> counts per key per minute -> upserts.
    The tcp run of the file is tests/connectors/test_redis_minute_counts_tcp.py."""
    import random
    from collections import Counter
    from pathlib import Path

    from typhoon.operators import BUILTINS
    from typhoon.runtime.keyed_state import KeyedStates
    from typhoon.topology import load_topology

    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("PG_DSN", postgres_server.dsn)
    t = load_topology(Path(__file__).resolve().parents[2] / "topologies/redis_minute_counts.yaml")
    r = redis_server.client()
    r.delete("events", "events_dead")
    rng, ts, want = random.Random(2), 1_764_201_600_000, Counter()
    r.xadd("events", {"key": "k0", "ts": "not a time"})
    for _ in range(3000):
        ts += rng.randint(0, 90)
        late = max(1_764_201_600_000, ts - rng.randint(0, 3000))  # within out_of_order_ms
        key = f"k{rng.randint(0, 4)}"
        r.xadd("events", {"key": key, "ts": str(late)})
        want[(key, late // 60_000 * 60_000)] += 1
    with postgres_server.connect() as c:
        c.execute("DROP TABLE IF EXISTS minute_counts")
        c.execute(
            "CREATE TABLE minute_counts (key text NOT NULL, minute bigint NOT NULL,"
            " minute_end bigint NOT NULL, n bigint NOT NULL, PRIMARY KEY (key, minute))"
        )
    node = t.nodes
    src = BUILTINS["redis_stream_source"](**{**node["source"].args, "until": "end"})
    src.open(Context("ex", "source", 1, 0, 1))
    window = BUILTINS["window_aggregate"](**node["window"].args)
    keyed = KeyedStates("window_aggregate", "window", 2, [0], 1, {0})
    window.open(
        Context("ex", "window", 2, 0, 1, input_fields=["key", "ts"], operator="window_aggregate",
                keyed=keyed, keyed_declared=True)
    )  # fmt: skip
    sink = BUILTINS["postgres_sink"](**node["sink"].args)
    sink.open(
        Context("ex", "sink", 3, 0, 1, input_fields=list(window.fields), guarantee="exactly_once")
    )
    lag = t.nodes["source"].watermark["out_of_order_ms"]
    epoch, newest = 0, float("-inf")
    events: list = []
    out: list = []

    def to_window(v, stream="default"):
        events.append(v)

    def to_sink(v, stream="default"):
        out.append(v)

    while True:
        events.clear()
        out.clear()
        more = src.next_batch(to_window, 200)
        for e in events:
            newest = max(newest, e[1])
            window.process(e, to_sink)
        if not more:
            window.on_watermark(float("inf"), to_sink)
        elif events:
            window.on_watermark(newest - lag, to_sink)
        sink.process_batch(list(out), None)
        epoch += 1
        sink.anchor_ready(epoch)
        sink.checkpoint_complete(epoch)
        if not more:
            break
    sink.job_complete()
    with postgres_server.connect() as c:
        rows = c.execute("SELECT key, minute, minute_end, n FROM minute_counts").fetchall()
    assert {(k, m): n for k, m, _, n in rows} == dict(want)
    assert all(end - m == 60_000 for _, m, end, _ in rows)
    assert src.result()["dropped"] == {"bad_value": 1} and window.late == 0
    for op in (src, sink):
        op.close()
