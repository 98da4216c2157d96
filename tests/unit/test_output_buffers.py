"""Output buffers of upstream backup (``typhoon/checkpoint/output_buffers.py``) and the
transport that records into them (``typhoon/runtime/upstream_backup.py``)."""

from __future__ import annotations

import pytest

from typhoon.checkpoint.output_buffers import START, OutputBuffers
from typhoon.runtime import checkpoints as ck
from typhoon.runtime.transport import EOS_STREAM
from typhoon.runtime.upstream_backup import BackedTransport, UpstreamBackup, backup_limit
from typhoon.wire import encode_rows


def fill(b: OutputBuffers, dst: int, script: str) -> None:
    """``d3`` data entry b"3", ``a5`` anchor of epoch 5, ``e`` end of stream."""
    for tok in script.split():
        if tok[0] == "d":
            b.record(dst, 1, tok[1:].encode())
        elif tok[0] == "a":
            b.record(dst, EOS_STREAM, ck.anchor_payload(int(tok[1:])), anchor=int(tok[1:]))
        else:
            b.record(dst, EOS_STREAM, b"eos", eos=True)


def data(entries: list[tuple[int, bytes]]) -> list[str]:
    return [p.decode() if s == 1 else ("eos" if p == b"eos" else "anchor") for s, p in entries]


def test_after_an_epoch_is_exactly_what_followed_its_anchor_on_the_link():
    b = OutputBuffers(1 << 20)
    fill(b, 7, "d1 d2 a1 d3 a2 d4 d5")
    fill(b, 8, "d9 a1 a2")
    assert data(b.after(7, None)) == ["1", "2", "anchor", "3", "anchor", "4", "5"]
    assert data(b.after(7, 1)) == ["3", "anchor", "4", "5"]
    assert data(b.after(7, 2)) == ["4", "5"]
    assert b.after(8, 2) == []
    assert not b.covers(7, 3)  # no anchor 3 went out: nobody can have checkpointed it
    with pytest.raises(ValueError):
        b.after(7, 3)
    assert b.replayed == 7 + 4 + 2


def test_purge_drops_through_the_completed_anchor_and_moves_the_coverage():
    b = OutputBuffers(1 << 20)
    fill(b, 7, "d1 a1 d2 a2 d3")
    assert b.coverage() == START
    b.purge(1)
    assert not b.covers(7, None) and b.covers(7, 1) and b.covers(7, 2)
    assert data(b.after(7, 1)) == ["2", "anchor", "3"]
    assert b.purged == 2 and b.coverage() == 1
    b.purge(2)
    assert data(b.after(7, 2)) == ["3"] and b.nbytes == 1
    b.purge(1)  # an older completion changes nothing
    assert data(b.after(7, 2)) == ["3"]
    fill(b, 9, "d4")  # a link first used after the purge starts there
    assert b.covers(9, 2) and not b.covers(9, 1)


def test_a_link_that_ended_before_the_anchor_replays_only_its_end_of_stream():
    """The receiver checkpointed epoch 3 after our end of stream: its state holds all
    we sent, and a rollback makes it wait for our end of stream again."""
    b = OutputBuffers(1 << 20)
    fill(b, 7, "d1 a1 d2 e")
    assert data(b.after(7, 3)) == ["eos"]
    assert data(b.after(7, 1)) == ["2", "eos"]


def test_trim_gives_up_the_oldest_epoch_then_everything_until_the_next_anchor():
    b = OutputBuffers(10)
    fill(b, 7, "d1 d2 a1 d3")  # 1 + 1 + anchor payload + 1 bytes > 10
    assert b.full
    b.trim()
    assert b.nbytes <= 10 and b.trimmed == 3
    assert not b.covers(7, None) and b.covers(7, 1)
    fill(b, 7, "d44444444444")
    b.trim()
    assert b.nbytes == 0 and b.coverage() is None and not b.covers(7, 1)
    fill(b, 7, "d5")  # not covered anyway: not kept
    assert b.nbytes == 0
    fill(b, 7, "a2 d6")  # the next anchor starts a stretch that is
    assert b.covers(7, 2) and data(b.after(7, 2)) == ["6"] and b.coverage() == 2


def test_a_reset_starts_every_link_at_the_restored_epoch():
    b = OutputBuffers(1 << 20)
    fill(b, 7, "d1 a1 d2")
    b.reset(4)
    assert b.nbytes == 0 and b.coverage() == 4 and b.covers(7, 4) and not b.covers(7, 1)
    fill(b, 7, "d3 a5 d4")
    assert data(b.after(7, 4)) == ["3", "anchor", "4"]


class Wire:
    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.awaited: list[int] = []  # generations whose peers were waited for
        self.on_urgent = None

    def await_generation(self, generation):
        self.awaited.append(generation)

    def send(self, dst, stream, payloads):
        self.sent.append(("send", dst, stream, list(payloads)))

    def send_group(self, group, dsts, payloads, stream=None):
        self.sent.append(("group", tuple(dsts), stream, list(payloads)))

    def send_balanced(self, stream, lb_node, slot, payloads):
        self.sent.append(("lb", stream, list(payloads)))


def test_the_backed_transport_records_in_link_order_without_marks():
    inner, b = Wire(), OutputBuffers(1 << 20)
    io = BackedTransport(inner, b, waits=False)
    io.on_urgent = print  # attributes go to the transport it wraps
    assert inner.on_urgent is print and io.sent is inner.sent
    io.send(7, 1, [b"x", b"y"])
    io.send(7, EOS_STREAM, [ck.mark_payload(3, 1)])
    io.send(7, EOS_STREAM, [ck.anchor_payload(4)])
    io.send_group(2, [7, 8], [b"z"])
    io.send(7, EOS_STREAM, [ck.LEAVING_PAYLOAD])
    assert [p for _, p in b.after(7, None)] == [b"x", b"y", ck.anchor_payload(4), b"z",
                                                 ck.LEAVING_PAYLOAD]  # fmt: skip
    assert [(s, p) for s, p in b.after(7, 4)] == [(2, b"z"), (EOS_STREAM, ck.LEAVING_PAYLOAD)]
    assert [p for _, p in b.after(8, None)] == [b"z"]
    assert len(inner.sent) == 5
    io.resend(7, 1, [b"x"])  # a replay is not recorded twice
    assert len(b.after(7, None)) == 5 and inner.sent[-1] == ("send", 7, 1, [b"x"])
    io.send_balanced(1, 0, 0, [b"w"])  # the switch picks the receiver: no link can tell
    assert b.coverage() is None and not b.covers(7, 4)


def test_a_bolt_trims_as_it_records_and_a_source_waits():
    bolt, source = OutputBuffers(4), OutputBuffers(4)
    BackedTransport(Wire(), bolt, waits=False).send(7, 1, [b"12345", b"6"])
    BackedTransport(Wire(), source, waits=True).send(7, 1, [b"12345", b"6"])
    assert bolt.nbytes <= 4 and bolt.trimmed and bolt.coverage() is None
    assert source.full and source.nbytes == 6 and source.coverage() == START


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        ({}, 0),
        ({"upstream_backup_mb": 8}, 0),  # without partial rollback: no buffers
        ({"partial_rollback": True}, 64 << 20),
        ({"partial_rollback": True, "upstream_backup_mb": 0}, 0),
        ({"partial_rollback": True, "upstream_backup_mb": 0.5}, 1 << 19),
    ],
)
def test_backup_limit_from_the_topology_config(config, limit):
    class Topo:
        pass

    t = Topo()
    t.config = config
    assert backup_limit(t) == limit


@pytest.mark.parametrize("bad", [-1, True, "2"])
def test_a_bad_backup_limit_is_refused(bad):
    class Topo:
        config = {"partial_rollback": True, "upstream_backup_mb": bad}

    with pytest.raises(ValueError, match="upstream_backup_mb"):
        backup_limit(Topo())


class Stats:
    def __init__(self) -> None:
        self.drops: dict[str, int] = {}

    def drop(self, what: str, n: int = 1) -> None:
        self.drops[what] = self.drops.get(what, 0) + n


class Sender(UpstreamBackup):
    """The state ``UpstreamBackup.replay`` uses, without a whole framework."""

    def __init__(self) -> None:
        self.wire = Wire()
        self.wire.stats = Stats()
        self.backup = OutputBuffers(1 << 20)
        self.io = BackedTransport(self.wire, self.backup, waits=False)
        self.gen, self.worker_id, self.backup_refused = 0, 1, 0
        self.replayed_gen: dict[int, int] = {}
        self.sent_to: dict[tuple[int, int], int] = {}
        self.pushed = 0
        self.tuples_replayed: dict[int, int] = {}

    def push(self) -> None:
        self.pushed += 1

    def _broadcast_punctuation(self, payload: bytes, targets: list[int]) -> None:
        for dst in targets:
            self.io.send(dst, EOS_STREAM, [payload])


def rows(*values: int) -> bytes:
    return encode_rows([[v] for v in values])


def test_a_replay_is_a_mark_then_what_followed_the_anchor():
    s = Sender()
    s.io.send(5, 2, [rows(1, 2)])
    s.io.send(5, EOS_STREAM, [ck.anchor_payload(3)])
    s.io.send(5, 2, [rows(3)])
    s.sent_to[(5, 2)] = 3
    s.wire.sent.clear()
    assert s.replay(7, 3, [5]) and s.pushed == 1
    assert s.wire.awaited == [7]  # the generation's peers before its mark (tcp)
    assert s.wire.sent == [
        ("send", 5, EOS_STREAM, [ck.mark_payload(7, 3)]),
        ("send", 5, 2, [rows(3)]),
    ]
    assert s.sent_to == {(5, 2): 1}  # the link counts from the receiver's rollback
    assert s.tuples_replayed == {7: 1}
    s.wire.sent.clear()
    assert s.replay(7, 3, [5]) and s.wire.sent == []  # told this generation already
    assert s.replay(6, 3, [5]) and s.wire.sent == []  # an older one: superseded


def test_a_replacement_gets_its_predecessors_link_then_what_went_to_it_since():
    s = Sender()
    s.io.send(5, 2, [rows(1)])
    s.io.send(5, EOS_STREAM, [ck.anchor_payload(3)])
    s.io.send(5, 2, [rows(2)])  # lost with the dead worker 5
    s.io.send(9, 2, [rows(4)])  # after the reroute: dropped by 9, waiting for the mark
    s.wire.sent.clear()
    assert s.replay(7, 3, [9], [5])
    assert s.wire.sent == [
        ("send", 9, EOS_STREAM, [ck.mark_payload(7, 3)]),
        ("send", 9, 2, [rows(2), rows(4)]),  # consecutive entries of a stream: one call
    ]
    assert s.sent_to == {(9, 2): 2}


def test_a_replay_that_cannot_be_exact_is_refused_and_sends_nothing():
    s = Sender()
    s.io.send(5, EOS_STREAM, [ck.anchor_payload(3)])
    s.io.send(5, 2, [rows(2)])
    s.wire.sent.clear()
    assert not s.replay(7, 2, [5])  # anchor 2 is not in the buffer
    s.io.send(9, EOS_STREAM, [ck.anchor_payload(4)])
    s.io.send(9, 2, [rows(4)])
    s.backup.purge(4)  # what went to the replacement is partly gone
    s.wire.sent.clear()
    assert not s.replay(7, 3, [9], [5])
    assert not s.replay(7, 3, [9, 5], [5])  # one link per receiver, or none
    assert s.wire.sent == [] and s.backup_refused == 2 and s.wire.awaited == []
    assert s.wire.stats.drops == {"malformed_replay": 1}


def test_a_source_waits_for_a_purge_at_most_ten_intervals():
    s = Sender()
    s.backup = OutputBuffers(8)
    s.io = BackedTransport(s.wire, s.backup, waits=True)
    s.now, s.interval, s.full_since = 0.0, 0.5, None
    s.io.send(5, EOS_STREAM, [ck.anchor_payload(1)])
    s.io.send(5, 2, [b"12345678"])
    assert s.backup_full()
    s.now = 4.9
    assert s.backup_full()  # still waiting for the purge
    s.now = 5.0
    assert not s.backup_full() and s.backup.trimmed and s.backup.coverage() is None
    assert not s.backup_full() and s.full_since is None


def test_the_purge_reads_the_newest_epoch_with_every_part_listed(tmp_path):
    from typhoon.checkpoint.store import CheckpointStore
    from typhoon.runtime.upstream_backup import newest_written

    store = CheckpointStore.local(str(tmp_path), "app")
    assert newest_written(store, {"a-0", "b-0"}) is None
    store.write(3, "a-0", b"x")
    store.write(3, "b-0", b"y")
    store.write(4, "a-0", b"x")  # b-0 has not written 4 yet
    assert newest_written(store, {"a-0", "b-0"}) == 3
    assert newest_written(store, {"a-0"}) == 4
