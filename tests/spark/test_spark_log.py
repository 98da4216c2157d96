"""The Spark engine's pieces that need no Spark: offset log, outbox, worker-side bolt, ad data."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from pyspark_bridge import bolt_for, plan
from pyspark_bridge.log import OffsetLog, commit_offset, read_json, read_range, segments
from pyspark_bridge.outbox import OutboxReader, owner_of, publish, replays, stage_rows
from typhoon.operators import OperatorError, resolve_operator
from typhoon.operators.ads import (
    campaign_table,
    generate_ad_events,
    read_campaign_table,
    reference_window_counts,
)
from typhoon.operators.base import Context
from typhoon.topology import load_topology, schedule

REPO = Path(__file__).resolve().parents[2]
AD_YAML = REPO / "topologies" / "ad_analytics.yaml"


def records(data: bytes) -> list:
    return list(msgpack.Unpacker(__import__("io").BytesIO(data), raw=False))


def test_log_ranges_roll_trim_and_reopen(tmp_path: Path) -> None:
    log = OffsetLog(tmp_path / "w1", segment_bytes=100)
    offsets = [log.offset()]
    for batch in range(5):
        for i in range(10):
            log.append(msgpack.packb([batch, i, "x" * 5]))
        log.flush()
        offsets.append(log.offset())
    assert read_json(tmp_path / "w1" / "head") == offsets[-1]
    assert len(segments(tmp_path / "w1")) > 2  # rolled
    # any range between two offsets reads exactly those records, across segments
    got = records(read_range(tmp_path / "w1", offsets[1]["pos"], offsets[4]["pos"]))
    assert got == [[b, i, "xxxxx"] for b in (1, 2, 3) for i in range(10)]
    # trimming removes only closed segments below what Spark committed
    commit_offset(tmp_path / "w1", offsets[3])
    commit_offset(tmp_path / "w1", offsets[2])  # never moves back
    assert log.trim() > 0
    assert segments(tmp_path / "w1")[0] <= offsets[3]["pos"]
    assert records(read_range(tmp_path / "w1", offsets[3]["pos"], offsets[5]["pos"]))[0] == [
        3,
        0,
        "xxxxx",
    ]
    with pytest.raises(FileNotFoundError):
        read_range(tmp_path / "w1", 0, offsets[5]["pos"])
    # a torn tail (written after the last head) is dropped when the worker reopens its log
    log.append(msgpack.packb(["lost"]))
    log.file.write(b"\x93garbage")
    log.file.close()
    again = OffsetLog(tmp_path / "w1", segment_bytes=100)
    assert again.offset() == offsets[5]
    again.append(msgpack.packb(["next"]))
    again.flush()
    assert records(read_range(tmp_path / "w1", offsets[5]["pos"], again.pos)) == [["next"]]


def test_outbox_publishes_once_per_batch_and_routes_by_partition(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = [stage_rows(out, p, [[p, k] for k in range(3)]) for p in range(4)]
    assert publish(out, 0, first, owners=[10, 11])
    replay = [stage_rows(out, p, [[p, 99]]) for p in range(4)]
    assert not publish(out, 0, replay, owners=[10, 11])  # a replay: dropped, recorded
    assert replays(out) == 1
    assert not list((out / "staging").iterdir())
    readers = [OutboxReader(out, worker_id=10 + i) for i in range(2)]
    got: list[list] = [[], []]
    for i, r in enumerate(readers):
        assert r.poll(got[i].append) == 6
        assert r.poll(got[i].append) == 0  # never twice
    assert sorted(row[0] for row in got[0]) == [0, 0, 0, 2, 2, 2]
    assert sorted(row[0] for row in got[1]) == [1, 1, 1, 3, 3, 3]
    # a restarted worker continues after the last batch it routed
    assert OutboxReader(out, worker_id=10).next == 1
    # every worker routed batch 0: publishing batch 1 keeps 0's manifest (a replay checks it)
    assert publish(out, 1, [stage_rows(out, 0, [["b1"]])], owners=[10, 11])
    assert (out / f"{0:020d}.json").exists()
    for r in readers:
        r.poll(lambda row: None)
    publish(out, 2, [], owners=[10, 11])
    assert not (out / f"{0:020d}.json").exists()
    # a worker added later (a scale-up) owns nothing: it skips what was collected, routes
    # no row of the owners' parts, and finishes with them
    added = OutboxReader(out, worker_id=12)
    assert added.poll(got[0].append) == 0 and added.next == 3
    (out / "done").write_text(json.dumps({"batch": 2}))
    assert added.finished() and not readers[0].finished()
    assert readers[0].poll(lambda row: None) == 0 and readers[0].finished()
    with pytest.raises(ValueError, match="owner"):
        publish(out, 3, [], owners=[])


def test_outbox_owner_of_a_part_comes_from_the_manifest(tmp_path: Path) -> None:
    """Workers of different shapes agree: the manifest's owners decide, not each worker."""
    out = tmp_path / "out"
    publish(out, 0, [stage_rows(out, p, [[p]]) for p in range(3)], owners=[7])
    publish(out, 1, [stage_rows(out, p, [[10 + p]]) for p in range(3)], owners=[7, 9])
    got = {w: [] for w in (7, 9)}
    for w in got:
        OutboxReader(out, worker_id=w).poll(got[w].append)
    assert sorted(got[7]) == [[0], [1], [2], [10], [12]] and got[9] == [[11]]
    assert [owner_of(p, [7, 9]) for p in range(4)] == [7, 9, 7, 9]


def test_a_spark_worker_stopped_early_marks_its_end_and_a_reopened_log_clears_it(
    tmp_path: Path,
) -> None:
    """A worker stopped before its input ended (a rolled-back scale-up) must not leave the
    driver waiting for its end of input; a worker that starts again takes input again."""
    bolt = bolt_for("pyspark_bridge.examples:costly_enrichment")(dir=str(tmp_path))
    bolt.open(Context("t", "n", 8, 1, 2, ["src", "seq", "ts", "payload"]))
    bolt.process([1, 0, 0.5, b"x"], FakeEmit())
    bolt.close()
    assert read_json(tmp_path / "in" / "w8" / "eos") == {"pos": bolt.log.pos, "seq": 1}
    again = OffsetLog(tmp_path / "in" / "w8")
    assert again.offset()["seq"] == 1 and not (tmp_path / "in" / "w8" / "eos").exists()


class FakeEmit:
    def __init__(self) -> None:
        self.rows: list[list] = []

    def __call__(self, values: list, stream: str = "default") -> None:
        self.rows.append(values)


def test_spark_bolt_logs_input_and_finishes_only_after_the_last_batch(tmp_path: Path) -> None:
    cls = bolt_for("pyspark_bridge.examples:campaign_window_counts")
    assert resolve_operator("pyspark_bridge.examples:campaign_window_counts") is cls
    assert resolve_operator("pyspark_bridge.examples:campaign_window_counts", "spark") is cls
    with pytest.raises(OperatorError, match="function"):
        resolve_operator("pyspark_bridge.examples:campaign_window_counts", "python")
    with pytest.raises(OperatorError):
        resolve_operator("collect", "spark")
    bolt = cls(dir=str(tmp_path), output_mode="update")
    bolt.open(Context("t", "n", 5, 0, 1, ["ad_id", "event_time", "ts"]))
    emit = FakeEmit()
    bolt.process(["a", 1, 0.5], emit)
    assert bolt.pump(emit, False) is False
    assert read_json(tmp_path / "in" / "w5" / "head")["seq"] == 1
    out = tmp_path / "out"
    publish(out, 0, [stage_rows(out, 0, [["c", 0, 10, 1, 0.5]])], owners=[5])
    assert bolt.pump(emit, True) is True  # input ended, but Spark has not said it is done
    assert read_json(tmp_path / "in" / "w5" / "eos") == bolt.log.offset()
    assert emit.rows == [["c", 0, 10, 1, 0.5]]
    (out / "done").write_text(json.dumps({"batch": 1}))
    assert bolt.pump(emit, True) is True  # batch 1 not routed yet
    publish(out, 1, [], owners=[5])
    assert bolt.pump(emit, True) is False
    assert bolt.result()["rows_out"] == 1


def test_ad_topology_loads_and_plans_one_driver(tmp_path: Path) -> None:
    topo = load_topology(AD_YAML)
    node = topo.nodes["campaign_counts"]
    assert node.engine == "spark"
    assert node.output_fields == ("campaign_id", "window_start", "window_end", "count", "ts")
    physical = schedule(topo, ["h1", "h2"], 7)
    planned, services = plan(topo, physical, tmp_path)
    assert [s.name for s in services] == [f"spark-driver-{physical.of_node(node.name)[0].host}"]
    doc = json.loads(Path(services[0].argv[-1]).read_text())
    spec = doc["nodes"][0]
    assert doc["conf"]["spark.master"] == "local[*]"
    assert spec["schema"] == "`ad_id` string, `event_time` bigint, `ts` double"
    assert spec["sql_conf"] == {"spark.sql.shuffle.partitions": "2"}
    assert planned.nodes[node.name].args["dir"] == spec["dir"]
    assert "dir" not in node.args  # the loaded topology is not changed


def test_campaign_table_file_and_reference(tmp_path: Path) -> None:
    shipped = read_campaign_table(REPO / "topologies" / "data" / "campaigns.csv")
    assert shipped == dict(campaign_table(100, 10))
    assert len(set(shipped.values())) == 100
    events = list(generate_ad_events(12000, seed=3))
    assert {e["event_type"] for e in events} == {"view", "click", "purchase"}
    assert events[0]["event_time"] + 11999 == events[-1]["event_time"]
    ref = reference_window_counts(12000, seed=3)
    assert sum(ref.values()) == sum(e["event_type"] == "view" for e in events)
    assert {w for _, w in ref} == {1_700_000_000_000, 1_700_000_000_000 + 10_000}
