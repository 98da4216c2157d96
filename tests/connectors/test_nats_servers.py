"""``nats_source`` and ``nats_sink`` in this process against a real ``nats-server -js``
(started by the fixture on a free loopback port with a temporary store): positions per
subject, replays, bad messages, two-phase commits with rollbacks, a commit cut short, the
server down at open, a server restart mid-read, and no thread left behind."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import nats
import pytest

from typhoon.operators import ConnectorError, preflight
from typhoon.operators.base import Context
from typhoon.operators.nats_client import NatsConnection
from typhoon.operators.nats_sink import EPOCHS_BUCKET, NatsSink
from typhoon.operators.nats_source import NatsSource


def admin(server, work):
    """``work(js)`` on a client of the test's own."""

    async def go():
        nc = await nats.connect(server.url)
        try:
            return await work(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(go())


def fresh_stream(server, name: str, subjects: list[str]) -> None:
    async def work(js):
        try:
            await js.delete_stream(name)
        except nats.js.errors.NotFoundError:
            pass
        await js.add_stream(name=name, subjects=subjects)

    admin(server, work)


def publish(server, items: list[tuple[str, bytes]]) -> list[int]:
    async def work(js):
        return [(await js.publish(s, p)).seq for s, p in items]

    return admin(server, work)


def stored(server, stream: str) -> list[tuple[str, bytes, dict]]:
    """Every message of ``stream``: (subject, payload, headers)."""

    async def work(js):
        last = (await js.stream_info(stream)).state.last_seq
        out = []
        for seq in range(1, last + 1):
            m = await js.get_msg(stream, seq)
            out.append((m.subject, m.data, m.headers or {}))
        return out

    return admin(server, work)


def drain(src: NatsSource, max_count: int = 3) -> list:
    out: list = []
    while src.next_batch(lambda v, stream="default": out.append(v), max_count):
        pass
    return out


def nats_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("nats ")]


def test_source_positions_per_subject_replay_bad_messages_and_from(nats_server):
    fresh_stream(nats_server, "EV", ["ev.a", "ev.b"])
    fresh_stream(nats_server, "DEAD", ["dead"])
    seqs = publish(
        nats_server,
        [("ev.a", b'["x", 1]'), ("ev.b", b'["y", 2]'), ("ev.a", b"\xff\xfe"),
         ("ev.a", b'["x", 3]'), ("ev.b", b"[1]"), ("ev.b", b'["y", 4]'), ("ev.a", b"{")],
    )  # fmt: skip
    args = dict(url=nats_server.url, stream="EV", subject=["ev.a", "ev.b"], fields=["k", "v"],
                format="json", until="end", dead_letter="dead")  # fmt: skip
    src = NatsSource(**args)
    src.open(Context("t", "src", 1, 0, 1))
    first: list = []
    src.next_batch(lambda v, stream="default": first.append(v), 1)
    saved = src.offset()
    rest = drain(src)
    assert sorted(first + rest) == [["x", 1], ["x", 3], ["y", 2], ["y", 4]]
    assert src.result() == {
        "emitted": 4,
        "dropped": {"not_utf8": 1, "wrong_fields": 1, "not_json": 1},
    }
    dead = stored(nats_server, "DEAD")
    assert sorted(h["Typhoon-Reason"] for _, _, h in dead) == [
        "not_json", "not_utf8", "wrong_fields"]  # fmt: skip
    assert {h["Typhoon-Seq"] for _, _, h in dead} == {str(seqs[2]), str(seqs[4]), str(seqs[6])}
    assert [d for _, d, h in dead if h["Typhoon-Reason"] == "not_utf8"] == [b"\xff\xfe"]
    # a message after the start: past until=end, for a replacement too
    publish(nats_server, [("ev.a", b'["late", 9]')])
    again = NatsSource(**{**args, "dead_letter": None})
    again.open(Context("t", "src", 1, 0, 1))
    again.seek(saved)
    replay = drain(again)
    assert sorted(replay) == sorted(rest) and ["late", 9] not in replay
    for split in ("x", "y"):  # each subject's order is kept
        assert [r for r in replay if r[0] == split] == [r for r in rest if r[0] == split]
    # from a sequence, worker 0 of 2 (its subject: ev.a), text format without an end
    after = NatsSource(url=nats_server.url, stream="EV", subject=["ev.a", "ev.b"],
                       fields=["line"], **{"from": seqs[3]})  # fmt: skip
    after.open(Context("t", "src", 1, 0, 2))
    got: list = []
    for _ in range(50):
        after.next_batch(lambda v, stream="default": got.append(v[0]), 10)
        if got and got[-1] == '["late", 9]':
            break
    assert after.splits == ["ev.a"] and got == ["{", '["late", 9]']
    for s in (src, again, after):
        s.close()
    assert nats_threads() == [] and NatsConnection.THREADS == 0


def test_server_down_or_stream_missing_is_one_sentence(nats_server, caplog):
    with pytest.raises(ConnectorError) as e:
        NatsSource(url="nats://127.0.0.1:1", stream="EV").open(Context("t", "src", 1, 0, 1))
    # the failed attempts of the first connection are in the sentence, not warnings too
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    (line,) = str(e.value).splitlines()
    assert line.startswith("nats_source: the NATS server at nats://127.0.0.1:1 does not answer (")
    assert "refused" in line.lower() or "failed" in line.lower(), line
    with pytest.raises(ConnectorError, match="^node 'sink': nats_sink: the NATS server at"):
        preflight([("sink", "nats_sink", {"url": "nats://127.0.0.1:1", "subject": "out"})])
    with pytest.raises(ConnectorError, match="there is no stream 'NOPE' at nats://"):
        preflight([("src", "nats_source", {"url": nats_server.url, "stream": "NOPE"})])
    with pytest.raises(ConnectorError, match="captures the subject 'nowhere'"):
        sink = NatsSink(url=nats_server.url, subject="nowhere")
        sink.open(Context("t", "sink", 2, 0, 1, input_fields=["a"]))
    assert nats_threads() == [] and NatsConnection.THREADS == 0


class Died(Exception):
    """The worker is killed here (not an error the sink retries)."""


def open_sink(server, guarantee="exactly_once", **args) -> NatsSink:
    s = NatsSink(url=server.url, subject="out", **args)
    s.open(Context("job", "sink", 4, 0, 1, input_fields=["w", "n"], guarantee=guarantee))
    return s


def rows_in(server) -> list:
    return [json.loads(d) for _, d, _ in stored(server, "OUT")]


def test_sink_publishes_an_epoch_only_once_its_checkpoint_completes(nats_server):
    fresh_stream(nats_server, "OUT", ["out"])
    s = open_sink(nats_server)
    s.process_batch([["a", 1], ["b", 1]], None)
    snap1 = s.snapshot()
    s.anchor_ready(1)
    s.process_batch([["a", 2]], None)
    snap2 = s.snapshot()
    s.anchor_ready(2)
    assert rows_in(nats_server) == []  # pre-committed: in the checkpoint only
    s.checkpoint_complete(1)
    assert rows_in(nats_server) == [["a", 1], ["b", 1]]
    s.process_batch([["c", 1]], None)
    s.abandon()  # a rollback to epoch 2: epoch 2 and later were never published
    assert rows_in(nats_server) == [["a", 1], ["b", 1]]
    again = NatsSink(url=nats_server.url, subject="out")
    again.open(Context("job", "sink", 4, 0, 1, input_fields=["w", "n"], guarantee="exactly_once"))
    again.restore(snap2)
    again.rewind(1, 2)
    assert again.closed == {2: [["a", 2]]}
    again.process_batch([["c", 1]], None)
    again.anchor_ready(3)
    again.checkpoint_complete(3)
    assert rows_in(nats_server) == [["a", 1], ["b", 1], ["a", 2], ["c", 1]]
    # from epoch 1 (committed already): nothing again
    third = NatsSink(url=nats_server.url, subject="out")
    third.open(Context("job", "sink", 4, 0, 1, input_fields=["w", "n"], guarantee="exactly_once"))
    third.restore(snap1)
    third.rewind(2, 1)
    assert third.closed == {} and third.commit({1: [["a", 1]]}) == 0
    third.job_complete()
    assert rows_in(nats_server) == [["a", 1], ["b", 1], ["a", 2], ["c", 1]]
    for x in (s, again, third):
        x.close()
    assert nats_threads() == [] and NatsConnection.THREADS == 0


def test_a_commit_cut_short_before_its_record_is_not_published_twice(nats_server):
    fresh_stream(nats_server, "OUT", ["out"])
    s = open_sink(nats_server)
    s.process_batch([["a", 1], ["b", 1]], None)
    snap = s.snapshot()
    s.anchor_ready(1)

    class Lost:  # the messages go out, then the worker dies before the epoch is recorded
        def __init__(self, kv):
            self.get = kv.get

        async def put(self, key, value):
            raise Died

    real, s.kv = s.kv, Lost(s.kv)
    with pytest.raises(Died):
        s.checkpoint_complete(1)
    s.kv = real
    assert rows_in(nats_server) == [["a", 1], ["b", 1]]
    again = NatsSink(url=nats_server.url, subject="out")
    again.open(Context("job", "sink", 4, 0, 1, input_fields=["w", "n"], guarantee="exactly_once"))
    again.CHUNK = 1  # acks awaited one message at a time: the same ids either way
    again.restore(snap)
    again.rewind(1, 1)
    assert again.committed_epoch() is None and again.closed == {1: [["a", 1], ["b", 1]]}
    again.checkpoint_complete(1)  # the same message ids: the stream drops them
    assert rows_in(nats_server) == [["a", 1], ["b", 1]]
    assert again.result()["duplicates"] == 2 and again.committed_epoch() == 1

    async def record(js):
        kv = await js.key_value(EPOCHS_BUCKET)
        return (await kv.get(f"job.sink.0.{again.run}")).value

    assert admin(nats_server, record) == b"1"
    for x in (s, again):
        x.close()


def test_a_replacement_without_exactly_once_publishes_under_a_run_of_its_own(nats_server):
    """Its batches count from 1 again: under the dead instance's run id the stream
    would drop them as sent before (message ids within the duplicate window)."""
    fresh_stream(nats_server, "OUT", ["out"])
    s = open_sink(nats_server, guarantee="at_least_once")
    snap = s.snapshot()
    s.process_batch([["a", 1]], None)
    s.on_signal(None)  # the first instance's batch 1
    s.close()
    again = open_sink(nats_server, guarantee="at_least_once")
    again.restore(snap)
    assert again.run != s.run
    again.process_batch([["b", 1]], None)
    again.on_signal(None)  # the replacement's batch 1
    assert rows_in(nats_server) == [["a", 1], ["b", 1]]
    assert again.result()["duplicates"] == 0
    again.close()


def test_sink_without_a_guarantee_batches_and_dead_letters_bad_rows(nats_server):
    fresh_stream(nats_server, "OUT", ["out"])
    fresh_stream(nats_server, "DEAD", ["dead"])
    s = open_sink(nats_server, guarantee="none", dead_letter="dead")
    s.BATCH = 4
    s.process_batch([["a", 1], ["b", b"\xff"], ["c", float("inf")]], None)
    s.process_batch([["d", 1], ["e", 1]], None)
    assert rows_in(nats_server) == []  # fewer than BATCH good rows so far
    s.process_batch([["f", 1]], None)
    assert rows_in(nats_server) == [["a", 1], ["d", 1], ["e", 1], ["f", 1]]
    s.process_batch([["g", 1]], None)
    s.close()  # the rest at the end
    assert rows_in(nats_server) == [["a", 1], ["d", 1], ["e", 1], ["f", 1], ["g", 1]]
    assert s.result() == {"written": 5, "dropped": {"not_json": 2}, "duplicates": 0}
    dead = [json.loads(d) for _, d, _ in stored(nats_server, "DEAD")]
    assert [d["reason"] for d in dead] == ["not_json", "not_json"]
    assert dead[0]["row"] == ["b", repr(b"\xff")]
    assert nats_threads() == [] and NatsConnection.THREADS == 0


def test_a_server_restart_mid_read_costs_nothing(nats_server):
    """The server stops while the source reads and comes back (same store, same port):
    the pull waits (retry with backoff) and the source goes on where it was."""
    fresh_stream(nats_server, "RS", ["rs"])
    publish(nats_server, [("rs", f"m{i}".encode()) for i in range(30)])
    src = NatsSource(url=nats_server.url, stream="RS", fields=["line"], until="end")
    src.open(Context("t", "src", 1, 0, 1))
    got: list = []
    src.next_batch(lambda v, stream="default": got.append(v[0]), 10)
    nats_server.stop()
    rest: list = []
    reader = threading.Thread(target=lambda: rest.extend(v[0] for v in drain(src, 10)))
    reader.start()
    deadline = time.monotonic() + 30
    while not src.conn.errors:  # the client has tried to reconnect: the source waits
        assert time.monotonic() < deadline and reader.is_alive()
        time.sleep(0.02)
    nats_server.start()  # from this thread: the server dies with the thread that forked it
    reader.join(120)
    got += rest
    assert got == [f"m{i}" for i in range(30)]
    src.close()
    assert nats_threads() == [] and NatsConnection.THREADS == 0
