"""Spark nodes in the global checkpoint, the pure parts: anchors, cuts, caps, and the rewind of
a Spark checkpoint directory, an outbox and the offset logs (no Spark needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from pyspark_bridge import anchors, rewind
from pyspark_bridge.log import OffsetLog, read_json, read_range, worker_dir, write_json
from pyspark_bridge.outbox import OutboxReader, manifest_path, publish, stage_rows


def off(pos: int, seq: int | None = None) -> dict[str, int]:
    return {"pos": pos, "seq": pos // 10 if seq is None else seq}


def test_anchor_file_keeps_whole_lines_and_forgets_later_epochs(tmp_path: Path) -> None:
    anchors.append_anchor(tmp_path, 1, off(0))
    anchors.append_anchor(tmp_path, 2, off(40))
    anchors.append_anchor(tmp_path, 3, off(90))
    with open(tmp_path / anchors.ANCHORS, "a") as f:
        f.write('{"epoch": 4, "pos"')  # torn by a crash
    assert anchors.read_anchors(tmp_path) == {1: off(0), 2: off(40), 3: off(90)}
    anchors.keep_anchors(tmp_path, 2)
    assert anchors.read_anchors(tmp_path) == {1: off(0), 2: off(40)}
    anchors.keep_anchors(tmp_path, None)
    assert anchors.read_anchors(tmp_path) == {}


def test_cut_takes_the_end_of_input_of_a_finished_worker() -> None:
    found = {"1": {5: off(50)}, "2": {}, "3": {}}
    eos = {"1": None, "2": off(70), "3": None}
    assert anchors.cut(5, found, eos) == {"1": off(50), "2": off(70), "3": None}


def test_reached_and_crosses() -> None:
    c = {"1": off(50), "2": off(70)}
    assert anchors.reached({"1": off(50), "2": off(70)}, c)
    assert not anchors.reached({"1": off(50), "2": off(60)}, c)
    assert not anchors.reached({"1": off(90), "2": off(90)}, {**c, "3": None})  # unknown part
    assert not anchors.crosses({"1": off(50), "2": off(70)}, c)
    assert anchors.crosses({"1": off(51)}, c)  # a worker missing from ends is at 0
    # a worker whose anchor is unknown cannot have been read past it
    assert not anchors.crosses({"1": off(40), "3": off(999)}, {**c, "3": None})


def test_cap_stops_every_batch_at_the_oldest_cut_not_reached() -> None:
    heads = {"1": off(100), "2": off(100)}
    found = {"1": {1: off(30), 2: off(60)}, "2": {1: off(20), 2: off(80)}}
    eos = {"1": None, "2": None}
    assert anchors.cap(heads, {}, found, eos) == {"1": off(30), "2": off(20)}
    assert anchors.cap(heads, {"1": off(30), "2": off(20)}, found, eos) == {
        "1": off(60),
        "2": off(80),
    }
    assert anchors.cap(heads, {"1": off(60), "2": off(80)}, found, eos) == heads
    # worker 2 has not checkpointed epoch 3 yet: its head (read before the anchors) is below it
    found["1"][3] = off(90)
    assert anchors.cap(heads, {"1": off(60), "2": off(80)}, found, eos) == {
        "1": off(90),
        "2": off(100),
    }
    # no anchors at all (no guarantee): the heads
    assert anchors.cap(heads, {}, {"1": {}, "2": {}}, eos) == heads


def test_cap_never_moves_a_worker_back_below_its_start() -> None:
    heads = {"1": off(100), "2": off(50)}
    found = {"1": {1: off(30)}, "2": {1: off(50)}}
    start = {"1": off(10), "2": off(50)}
    capped = anchors.cap(heads, start, found, {"1": None, "2": None})
    assert capped == {"1": off(30), "2": off(50)}
    assert all(capped[w]["pos"] >= start[w]["pos"] for w in capped)


# ----- rewinding a Spark checkpoint directory ----------------------------------------------


def spark_checkpoint(root: Path, ends: list[dict[str, dict[str, int]]], committed: int) -> Path:
    """The layout Spark 4 writes (seen on a real query): offsets/commits with checksum twins,
    HDFS state store deltas per version with Spark's and Hadoop's checksums."""
    cp = root / "checkpoint"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    write_json(cp / "metadata", {"id": "q"})
    for b, end in enumerate(ends):
        meta = json.dumps({"batchWatermarkMs": 0, "conf": {}})
        (cp / "offsets" / str(b)).write_text(f"v1\n{meta}\n{json.dumps(end)}")
        (cp / "offsets" / f".{b}.crc").write_text("x")
        if b <= committed:
            (cp / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}')
            (cp / "commits" / f".{b}.crc").write_text("x")
            for part in (0, 1):
                d = cp / "state" / "0" / str(part)
                d.mkdir(parents=True, exist_ok=True)
                v = b + 1
                for name in (
                    f"{v}.delta",
                    f"{v}.delta.crc",
                    f".{v}.delta.crc",
                    f".{v}.delta.crc.crc",
                ):
                    (d / name).write_text("x")
    meta = cp / "state" / "0" / "_metadata"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "metadata").write_text("x")
    (cp / "state" / "0" / "0" / "_metadata").mkdir(exist_ok=True)
    (cp / "state" / "0" / "0" / "_metadata" / "schema").write_text("x")
    return cp


ENDS = [
    {"1": off(10), "2": off(5)},
    {"1": off(30), "2": off(20)},  # reaches the cut below exactly
    {"1": off(30), "2": off(20)},  # a no-data batch after it
    {"1": off(60), "2": off(70)},
]


def test_rewind_batch_is_the_first_reaching_or_the_last_below(tmp_path: Path) -> None:
    cp = spark_checkpoint(tmp_path, ENDS, committed=3)
    assert rewind.rewind_batch(cp, {"1": off(30), "2": off(20)}) == 1
    assert rewind.rewind_batch(cp, {"1": off(40), "2": off(25)}) == 2  # batch 3 crosses it
    assert rewind.rewind_batch(cp, {"1": off(40), "2": off(10)}) == 0  # 1 crosses for worker 2
    assert rewind.rewind_batch(cp, {"1": off(5), "2": off(0)}) == -1
    assert rewind.rewind_batch(cp, {"1": off(99), "2": off(99)}) == 3
    assert rewind.latest_end(cp) == ENDS[3]


def test_rewind_checkpoint_drops_later_batches_and_state_versions(tmp_path: Path) -> None:
    cp = spark_checkpoint(tmp_path, ENDS, committed=3)
    rewind.rewind_checkpoint(cp, 1)
    names = {str(p.relative_to(cp)) for p in cp.rglob("*") if p.is_file()}
    assert {n for n in names if n.startswith(("offsets", "commits"))} == {
        "offsets/0",
        "offsets/.0.crc",
        "offsets/1",
        "offsets/.1.crc",
        "commits/0",
        "commits/.0.crc",
        "commits/1",
        "commits/.1.crc",
    }
    state = sorted(n for n in names if n.startswith("state/0/0/") and "_metadata" not in n)
    assert state == [
        f"state/0/0/{n}"
        for n in sorted(
            [".1.delta.crc", ".1.delta.crc.crc", "1.delta", "1.delta.crc"]
            + [".2.delta.crc", ".2.delta.crc.crc", "2.delta", "2.delta.crc"]
        )
    ]
    assert {"metadata", "state/0/_metadata/metadata", "state/0/0/_metadata/schema"} <= names
    rewind.rewind_checkpoint(cp, -1)
    assert not cp.exists()


# ----- outbox and logs --------------------------------------------------------------------


def published(out: Path, batches: int) -> None:
    for b in range(batches):
        staged = [stage_rows(out, p, [[f"b{b}p{p}", b]]) for p in (0, 1)]
        publish(out, b, staged, [1, 2], ENDS[b])


def test_rewind_outbox_republishes_and_reroutes_after_the_batch(tmp_path: Path) -> None:
    out = tmp_path / "out"
    published(out, 4)
    rows: dict[int, list] = {1: [], 2: []}
    readers = {w: OutboxReader(out, w) for w in (1, 2)}
    for w, r in readers.items():
        r.poll(rows[w].append)
    assert readers[1].ends == ENDS[3]
    write_json(out / "done", {"batch": 3})
    write_json(out / "collected", {"below": 3})  # as the garbage collection at batch 4 would
    rewind.rewind_outbox(out, 1, ENDS[1])
    assert not (out / "done").exists()
    assert not manifest_path(out, 2).exists() and manifest_path(out, 1).exists()
    assert read_json(out / "collected")["below"] == 2
    again = {w: OutboxReader(out, w) for w in (1, 2)}
    assert again[1].next == 2 and again[1].ends == ENDS[1]
    # the query publishes batch 2 again: it is routed, not dropped as a replay
    publish(out, 2, [stage_rows(out, 0, [["again", 2]])], [1, 2], ENDS[2])
    got: list = []
    again[1].poll(got.append)
    assert got == [["again", 2]]


def test_poll_holds_before_the_batch_an_anchor_goes_before(tmp_path: Path) -> None:
    out = tmp_path / "out"
    published(out, 4)
    r = OutboxReader(out, 1)
    cut = {"1": off(40), "2": off(25)}
    rows: list = []
    r.poll(rows.append, lambda m: anchors.crosses(m["ends"], cut))
    assert [x[1] for x in rows] == [0, 1, 2] and r.next == 3  # batch 3 crosses the cut
    r.poll(rows.append)
    assert r.next == 4


def test_truncate_log_cuts_segments_head_commit_anchors_and_eos(tmp_path: Path) -> None:
    d = worker_dir(tmp_path, 1)
    log = OffsetLog(d, segment_bytes=30)
    records = [msgpack.packb([f"w{i:02d}"]) for i in range(20)]  # 5 bytes each
    for i, r in enumerate(records):
        log.append(r)
        if i % 3 == 2:
            log.flush()
        if i == 8:
            anchors.append_anchor(d, 7, log.offset())
    log.mark_eos()
    log.close()
    anchors.append_anchor(d, 8, off(95, 19))
    write_json(d / "commit", off(90, 18))
    head = log.offset()
    rewind.truncate_log(d, off(45, 9), off(30, 6), 7)
    assert read_json(d / "head") == off(45, 9)
    assert read_json(d / "commit") == off(30, 6)
    assert not (d / "eos").exists()
    assert anchors.read_anchors(d) == {7: off(45, 9)}
    assert read_range(d, 0, 45) == b"".join(records[:9])
    again = OffsetLog(d, segment_bytes=30)  # the worker continues at the cut
    assert again.offset() == off(45, 9)
    again.append(records[0])
    again.flush()
    assert read_range(d, 0, 50) == b"".join(records[:9]) + records[0]
    assert head["pos"] == 100
    with pytest.raises(rewind.RewindError, match="before the cut"):
        rewind.truncate_log(d, off(80, 16), off(30, 6), 7)


def test_truncate_log_refuses_when_what_spark_must_reread_was_trimmed(tmp_path: Path) -> None:
    d = worker_dir(tmp_path, 1)
    log = OffsetLog(d, segment_bytes=10)
    for i in range(10):
        log.append(msgpack.packb([f"w{i:02d}"]))
        log.flush()
    write_json(d / "commit", off(40, 8))
    log.trim()
    with pytest.raises(rewind.RewindError, match="trimmed"):
        rewind.truncate_log(d, off(45, 9), off(10, 2), None)


def test_rewind_node_waits_for_every_worker_of_the_generation(tmp_path: Path) -> None:
    node = tmp_path / "node"
    cp = spark_checkpoint(node, ENDS, committed=3)
    published(node / "out", 4)
    for w in ("1", "2"):
        log = OffsetLog(worker_dir(node, w))
        log.append(b"\x91\xa1x" * 40)  # 40 records of 3 bytes: head 120
        log.close()
    anchors.write_request(node, "1", {"generation": 2, "epoch": 5, **off(40)})
    assert rewind.ready_cut(node, ["1", "2"], -1) is None
    anchors.write_request(node, "2", {"generation": 1, "epoch": 4, **off(20)})
    assert rewind.ready_cut(node, ["1", "2"], -1) is None  # worker 2 is a generation behind
    anchors.write_request(node, "2", {"generation": 2, "epoch": 5, **off(30)})
    gen, epoch, cut = rewind.ready_cut(node, ["1", "2"], -1)  # type: ignore[misc]
    assert (gen, epoch, cut) == (2, 5, {"1": off(40), "2": off(30)})
    assert rewind.ready_cut(node, ["1", "2"], 2) is None  # already done
    assert rewind.rewind_node(node, cut, epoch) == 2
    assert rewind.latest_end(cp) == ENDS[2]
    assert read_json(worker_dir(node, "1") / "head") == off(40)
    assert read_json(worker_dir(node, "2") / "head") == off(30)


# ----- the worker side (SparkBolt) without Spark ---------------------------------------------


def bolt(node: Path, wid: int) -> Any:
    from pyspark_bridge import bolt_for
    from typhoon.operators.base import Context

    b = bolt_for("pyspark_bridge.examples:running_counts")(
        dir=str(node), guarantee="exactly_once", fields=["key", "count"]
    )
    b.open(Context("t", "counts", wid, wid - 1, 2, ["word"], ["key", "count"]))
    return b


def spark_batch(node: Path, batch: int, ends: dict[str, dict[str, int]], rows: list) -> None:
    """What the driver's sink does for one micro-batch (worker 1 routes partition 0)."""
    out = node / "out"
    publish(out, batch, [stage_rows(out, 0, rows)], [1, 2], ends)


def test_worker_holds_the_anchor_until_the_batch_at_the_cut_is_routed(tmp_path: Path) -> None:
    node = tmp_path / "node"
    w1, w2 = bolt(node, 1), bolt(node, 2)
    emitted: list = []
    for b in (w1, w2):
        b.process(["a"], emitted.append)
        b.pump(emitted.append, False)
    s1, s2 = w1.snapshot(), w2.snapshot()
    assert s1 == {"log": 1, "pos": 3, "seq": 1} and s2["log"] == 2
    assert not w1.anchor_ready(7)  # nothing of Spark's is routed yet; worker 2 has no anchor
    assert anchors.read_anchors(worker_dir(node, 1)) == {7: {"pos": 3, "seq": 1}}
    w1.process(["b"], emitted.append)  # after the anchor: logged, Spark may read it
    w1.pump(emitted.append, False)
    assert not w2.anchor_ready(7)
    spark_batch(node, 0, {"1": off(3, 1)}, [["a", 1]])  # worker 2's part not read yet
    spark_batch(node, 1, {"1": off(6, 2), "2": off(3, 1)}, [["a", 2]])  # crosses worker 1's
    w1.pump(emitted.append, False)
    assert emitted == [["a", 1]]  # batch 1 waits behind the anchor
    assert w1.anchor_ready(7)  # batch 0 is B_E: the anchor goes before batch 1
    w1.pump(emitted.append, False)
    assert emitted == [["a", 1], ["a", 2]]
    assert w1.outbox.next == 2


def test_worker_rolls_back_with_the_driver_and_keeps_what_arrives(tmp_path: Path) -> None:
    node = tmp_path / "node"
    cp = spark_checkpoint(node, [{"1": off(3, 1)}, {"1": off(9, 3)}], committed=1)
    old = bolt(node, 1)
    emitted: list = []
    for word in ("a", "b", "c"):
        old.process([word], emitted.append)
    old.pump(emitted.append, False)
    old.abandon()  # a rollback drops it: no end of input is written
    assert not (worker_dir(node, 1) / "eos").exists()
    new = bolt(node, 1)
    new.restore({"log": 1, "pos": 3, "seq": 1})
    new.rewind(3, 4)
    assert rewind.requests(node)["1"]["generation"] == 3
    new.process(["d"], emitted.append)  # the new generation's input, kept in memory
    assert new.pump(emitted.append, False)  # busy: waiting for the driver
    assert new.snapshot() == {"log": 1, "pos": 6, "seq": 2}
    assert not new.anchor_ready(3_000_001)
    gen, epoch, cut = rewind.ready_cut(node, ["1"], -1)  # type: ignore[misc]
    assert rewind.rewind_node(node, cut, epoch) == 0
    assert rewind.latest_end(cp) == {"1": off(3, 1)}
    write_json(node / "rollback" / "ack", {"generation": gen})
    new.pump(emitted.append, False)
    assert read_range(worker_dir(node, 1), 0, 6) == msgpack.packb(["a"]) + msgpack.packb(["d"])
    assert anchors.read_anchors(worker_dir(node, 1)) == {3_000_001: {"pos": 6, "seq": 2}}
    new.close()
    assert (worker_dir(node, 1) / "closed").exists()


def test_a_replacement_continues_the_dead_workers_log(tmp_path: Path) -> None:
    node = tmp_path / "node"
    dead = bolt(node, 1)
    dead.process(["a"], print)
    dead.snapshot()
    repl = bolt(node, 9)  # sdn gives it a new worker ID
    repl.restore({"log": 1, "pos": 3, "seq": 1})
    repl.rewind(1, 5)
    assert sorted(p.name for p in (node / "in").iterdir()) == ["w1"]
    assert set(rewind.requests(node)) == {"1"}
    write_json(node / "rollback" / "ack", {"generation": 1})
    repl.pump(print, False)
    assert repl.outbox.worker_id == 1 and repl.log.dir == worker_dir(node, 1)
