"""``redis_stream_sink`` in this process against a real ``redis-server`` (the fixture starts
it on a free loopback port): epochs added only once their checkpoint completes and never
again after a rollback or a retried commit, batches without a guarantee, bad tuples counted
and dead-lettered, the server down at submit or restarted mid-write."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from typhoon.operators import BUILTINS, ConnectorError, preflight
from typhoon.operators.base import Context
from typhoon.operators.redis_sink import EPOCHS_PREFIX, RedisStreamSink

RECORD = f"{EPOCHS_PREFIX}job/sink/out/0"


def open_sink(server, guarantee="exactly_once", **args) -> RedisStreamSink:
    s = RedisStreamSink(url=server.url, stream="out", **args)
    s.open(Context("job", "sink", 4, 0, 1, input_fields=["w", "n"], guarantee=guarantee))
    return s


def entries(server, stream: str = "out") -> list[list[str]]:
    """The stream's entries as ``[w, n]`` text, in stream order."""
    return [[v[b"w"].decode(), v[b"n"].decode()] for _, v in server.client().xrange(stream)]


def test_an_epoch_is_added_once_its_checkpoint_completes_and_never_again(redis_server):
    r = redis_server.client()
    r.delete("out")
    r.set(RECORD, 99)  # a previous submission's record: a fresh one clears it
    assert BUILTINS["redis_stream_sink"] is RedisStreamSink
    s = open_sink(redis_server)
    s.process_batch([["a", 1], ["b", 1]], None)
    snap1 = s.snapshot()
    s.anchor_ready(1)
    assert r.get(RECORD) is None
    s.process_batch([["a", 2]], None)
    snap2 = s.snapshot()
    s.anchor_ready(2)
    assert entries(redis_server) == []  # pre-committed: in the checkpoint only
    s.checkpoint_complete(1)
    assert entries(redis_server) == [["a", "1"], ["b", "1"]] and r.get(RECORD) == b"1"
    s.process_batch([["c", 1]], None)
    s.abandon()  # a rollback to epoch 2: epoch 2 and later were never added
    assert entries(redis_server) == [["a", "1"], ["b", "1"]]
    again = open_sink(redis_server)
    again.restore(snap2)
    again.rewind(1, 2)
    assert again.closed == {2: [["a", 2]]}
    again.process_batch([["c", 1]], None)
    again.anchor_ready(3)
    again.checkpoint_complete(3)  # epochs 2 and 3 in one MULTI/EXEC with the record
    assert entries(redis_server) == [["a", "1"], ["b", "1"], ["a", "2"], ["c", "1"]]
    assert r.get(RECORD) == b"3"
    # from epoch 1 (committed already): nothing again, neither by rewind nor by commit
    third = open_sink(redis_server)
    third.restore(snap1)
    third.rewind(2, 1)
    assert third.closed == {} and third.commit({1: [["a", 1]]}) == 0
    third.job_complete()
    assert len(entries(redis_server)) == 4
    metrics = again.metrics()
    assert metrics["sink_commits"] == 1 and metrics["sink_written"] == 2
    assert 0 < metrics["sink_visible_s_p50"] <= metrics["sink_visible_s_max"]
    assert 0 < metrics["sink_commit_s_p50"] <= metrics["sink_commit_s_max"]
    for x in (s, again, third):
        x.close()


class LostAnswer(Exception):
    pass


def test_a_commit_whose_answer_was_lost_is_not_applied_twice(redis_server, monkeypatch):
    """The MULTI/EXEC goes through, then the connection fails before the answer: the
    retry finds the epoch recorded (WATCHed) and adds nothing."""
    import redis

    r = redis_server.client()
    r.delete("out", RECORD)
    s = open_sink(redis_server)
    s.process_batch([["a", 1], ["b", 1], ["c", 1]], None)
    s.anchor_ready(1)
    real = redis.client.Pipeline.execute
    calls = []

    def execute(pipe, *a, **k):
        out = real(pipe, *a, **k)
        calls.append(len(out))
        if len(calls) == 1:
            raise redis.ConnectionError("the answer was lost")
        return out

    monkeypatch.setattr(redis.client.Pipeline, "execute", execute)
    s.checkpoint_complete(1)
    assert len(calls) == 1  # the retry saw the record and did not send a transaction
    assert entries(redis_server) == [["a", "1"], ["b", "1"], ["c", "1"]]
    assert r.get(RECORD) == b"1"
    s.close()


def test_a_kill_before_exec_leaves_nothing_and_the_replacement_adds_it_once(redis_server):
    """MULTI and the XADDs sent, the worker dies before EXEC: Redis drops the queued
    commands with the connection, and the replacement commits the epoch once."""
    r = redis_server.client()
    r.delete("out", RECORD)
    s = open_sink(redis_server)
    s.process_batch([["a", 1], ["b", 1]], None)
    snap = s.snapshot()
    s.anchor_ready(1)
    conn = s.redis.connection_pool.get_connection()
    conn.send_command("MULTI")
    conn.read_response()
    for w in ("a", "b"):
        conn.send_command("XADD", "out", "*", "w", w, "n", "1")
        assert conn.read_response() == b"QUEUED"
    conn.disconnect()  # SIGKILL: no EXEC
    s.redis.close()
    assert entries(redis_server) == [] and r.get(RECORD) is None
    again = open_sink(redis_server)
    again.restore(snap)
    again.rewind(1, 1)
    assert again.closed == {1: [["a", 1], ["b", 1]]}
    again.checkpoint_complete(1)
    again.job_complete()
    assert entries(redis_server) == [["a", "1"], ["b", "1"]]
    again.close()


def test_without_a_guarantee_rows_go_in_batches_and_bad_ones_are_dead_lettered(redis_server):
    r = redis_server.client()
    r.delete("out", "dead")
    s = open_sink(redis_server, guarantee="none", dead_letter="dead", maxlen=1000)
    s.BATCH = 4
    s.process_batch([["a", 1], ["b", None], ["c", float("nan")], ["d", 2.5, "x"]], None)
    s.process_batch([["e", b"raw"], ["f", "ü"]], None)
    assert entries(redis_server) == []  # fewer than BATCH good rows so far
    s.process_batch([["g", 7]], None)
    assert entries(redis_server) == [["a", "1"], ["e", "raw"], ["f", "ü"], ["g", "7"]]
    s.process_batch([["h", 0.5], ["i", True]], None)
    s.close()  # the rest at the end
    assert entries(redis_server)[-1] == ["h", "0.5"]
    assert s.result() == {"written": 5, "dropped": {"wrong_type": 3, "wrong_fields": 1}}
    dead = [(v[b"_reason"].decode(), json.loads(v[b"_row"])) for _, v in r.xrange("dead")]
    assert dead == [
        ("wrong_type", ["b", None]),
        ("wrong_type", ["c", "nan"]),  # NaN has no JSON: its repr
        ("wrong_fields", ["d", 2.5, "x"]),
        ("wrong_type", ["i", True]),
    ]
    assert s.metrics()["sink_commits"] == 2 and "sink_visible_s_p50" not in s.metrics()


def test_the_server_down_at_submit_or_a_key_of_another_type_is_one_sentence(redis_server):
    with pytest.raises(ConnectorError) as e:
        preflight([("out", "redis_stream_sink", {"url": "redis://127.0.0.1:1/0", "stream": "o"})])
    (line,) = str(e.value).splitlines()
    assert line.startswith(
        "node 'out': redis_stream_sink: the Redis server at redis://127.0.0.1:1/0 does not answer"
    ), line
    redis_server.client().set("plain", "x")
    with pytest.raises(ConnectorError, match="the key 'plain' at redis://.* is a string, not a"):
        preflight([("out", "redis_stream_sink", {"url": redis_server.url, "stream": "plain"})])
    preflight([("out", "redis_stream_sink", {"url": redis_server.url, "stream": "new"})])
    with pytest.raises(ConnectorError, match="does not answer"):
        open_sink(type(redis_server)(1, redis_server.workdir))


def test_a_server_restart_mid_write_holds_the_worker_and_loses_nothing(redis_server, caplog):
    """The server stops while a batch is written and comes back: the write waits
    (retries with backoff: the worker blocks, its memory does not grow), then goes in."""
    s = open_sink(redis_server, guarantee="at_least_once")
    s.redis.delete("out")
    redis_server.stop()
    done = threading.Event()
    writer = threading.Thread(target=lambda: (s.write([["a", 1], ["b", 2]]), done.set()))
    with caplog.at_level(logging.WARNING, logger="typhoon.operators.connectors"):
        writer.start()
        deadline = time.monotonic() + 30
        while not any("retrying in" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline and writer.is_alive()
            time.sleep(0.02)
        assert not done.is_set()  # blocked: the server is down
        redis_server.start()  # from this thread: the server dies with the thread that forked it
        writer.join(60)
    assert done.is_set()
    assert entries(redis_server) == [["a", "1"], ["b", "2"]]
    s.close()
