"""A columnar source under ``exactly_once`` on tcp, its workers SIGKILLed mid-run.

``topologies/keyed_columns.yaml``: ``keyed_columns`` sends numpy columns as column blocks
(``emit_columns``), a fields grouping on its int ``key`` deals them to ``max_and_prev``
(keyed state that is not a sum: the largest and the last value per key, both emitted
with each tuple) and ``digest`` checksums every output.  Once a global checkpoint is
complete and the source sent a quarter of its tuples, workers are SIGKILLed; the job
rolls back, the source replays from its checkpointed offset and the upstream backups
resend blocks.  The per-key maxima and last values and the digest of every output must
equal ``keyed_columns_reference``'s (0 lost, 0 duplicated, each output as computed).
The second variant keys on two fields, an int and a str, which column blocks are dealt
by too; the last test runs a str key as blocks and as rows and finds each worker given
as many tuples and keys both ways.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import msgpack
import pytest
from keyed_columns_reference import check, reference
from midrun_kill import kill_once_checkpointed
from test_tcp_runs import run_report

from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.long]


@pytest.mark.parametrize(
    ("victims", "fields"),
    [(["peak"], ["key"]), (["source", "peak", "sink"], ["key", "name"])],
    ids=["peak", "all-two-fields"],
)
def test_a_columnar_keyed_job_is_exact_after_killed_workers(
    tmp_path: Path, victims: list[str], fields: list[str]
) -> None:
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "keyed_columns.yaml"))
    t.name = "colkill"
    (edge,) = [s for s in t.streams if s.dst == "peak"]
    edge.grouping = dataclasses.replace(edge.grouping, fields=tuple(fields))
    args = t.nodes["source"].args
    args.update(count=60_000, rate=20_000)
    run = kill_once_checkpointed(tmp_path, t, victims)
    report, cluster = run.report, run.cluster
    assert run.sent_at_kill >= args["count"] // 4, run.sent_at_kill  # mid-run, not on a timeout
    assert sorted(cluster.recovered) == sorted(
        cluster.physical.of_node(n)[0].worker_id for n in victims
    ), cluster.recovered
    check(report, reference(args, tuple(fields)))
    assert report["ok"], report["problems"]
    epochs = [e for w in report["workers"] for e in w["restored_epochs"]]
    assert epochs and min(epochs) >= run.checkpoint_at_kill >= 1, (run.checkpoint_at_kill, epochs)
    workers = {w["node"]: w for w in report["workers"]}
    source = workers["source"]
    saved = msgpack.unpackb(
        run.store.read(source["restored_epochs"][-1], "source-0"), raw=False, strict_map_key=False
    )
    assert source["replayed_from"] == saved["offset"], (source["replayed_from"], saved)
    assert 0 < source["replayed_from"]["emitted"] < args["count"], source["replayed_from"]
    # the source's tuples left as blocks, none as rows (the keys are dealt with numpy);
    # a relaunched source counts from its replay on
    since = source["replayed_from"]["emitted"] if "source" in victims else 0
    assert source["columns_out"] >= args["count"] - since, source
    assert "columns_as_rows" not in source, source
    assert all(w["columns_in"] for w in report["workers"] if w["node"] == "peak")


def test_a_str_key_splits_blocks_as_it_splits_rows(tmp_path: Path) -> None:
    """Fields grouping on the str ``name``: with ``columns:`` on the stream the source's
    tuples go as blocks, without it as rows; each ``peak`` worker gets the same number
    of tuples and keys both ways (each key on the worker the row path's hash names),
    and the results equal the reference both ways."""
    text = (ROOT / "topologies" / "keyed_columns.yaml").read_text()
    text = text.replace("fields: [key]}", "fields: [name]}")
    declared = "    columns: {key: int64, name: str, seq: int64, value: int64}\n"
    assert declared in text
    split = {}
    for kind, body in (("blocks", text), ("rows", text.replace(declared, ""))):
        file = tmp_path / f"{kind}.yaml"
        file.write_text(body)
        r = run_report(tmp_path, file, "--arg", "source.count=20000")
        assert r["ok"], r["problems"]
        check(r, reference({"count": 20_000, "keys": 64, "seed": 5}, ("name",)))
        workers = {(w["node"], w["index"]): w for w in r["workers"]}
        source = workers[("source", 0)]
        if kind == "blocks":
            assert source["columns_out"] == 20_000 and "columns_as_rows" not in source, source
        else:
            assert source["columns_as_rows"] == {"no_layout": 20_000}, source
        split[kind] = {
            i: (workers[("peak", i)]["in"], workers[("peak", i)]["keyed"]) for i in range(3)
        }
    assert split["blocks"] == split["rows"]
    assert all(keyed["keys"] for _, keyed in split["rows"].values())  # spread over all three
