"""The locality analysis on a real Spark session: exact pair counts over a window, and
tables that keep correlated keys together (pyspark_bridge/locality.py)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from pyspark_bridge.locality import analyse, main
from typhoon.locality.partition import Slot

A = [Slot(1, "h1"), Slot(2, "h2"), Slot(3, "h3")]
B = [Slot(4, "h1"), Slot(5, "h2"), Slot(6, "h3")]


def sample(path, n=6000, locality=0.8, keys=40, seed=3):
    """Tuples (tag, loc, ts): with probability ``locality`` loc is the tag's partner."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        t = rng.randrange(keys)
        loc = t if rng.random() < locality else rng.randrange(keys)
        rows.append({"tag": f"t{t}", "loc": f"l{loc}", "ts": float(i)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_pairs_counted_exactly_in_the_window_and_tables_keep_them_local(spark, tmp_path):
    rows = sample(tmp_path / "p.jsonl")
    pairs, plan = analyse(spark, tmp_path / "p.jsonl", "tag", "loc", A, B, ts="ts", window_s=2999)
    want = Counter((r["tag"], r["loc"]) for r in rows if r["ts"] >= 6000 - 1 - 2999)
    assert pairs == dict(want)
    assert plan.local_fraction >= 0.8, plan.local_fraction
    assert plan.imbalance(plan.load_a) <= 1.2 and plan.imbalance(plan.load_b) <= 1.2


def test_bad_field_is_a_clear_error(spark, tmp_path):
    sample(tmp_path / "p.jsonl", n=10)
    with pytest.raises(ValueError, match="no field 'hashtag'"):
        analyse(spark, tmp_path / "p.jsonl", "hashtag", "loc", A, B)


def test_command_line_writes_the_tables(tmp_path, capsys):
    sample(tmp_path / "p.jsonl", n=3000)
    (tmp_path / "w.json").write_text(
        json.dumps({"a": [[s.worker, s.host] for s in A], "b": [[s.worker, s.host] for s in B]})
    )
    out = tmp_path / "t.json"
    code = main(["--pairs", str(tmp_path / "p.jsonl"), "--a", "tag", "--b", "loc",
                 "--workers", str(tmp_path / "w.json"), "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr()
    doc = json.loads(out.read_text())
    assert set(doc["table_a"].values()) <= {1, 2, 3} and doc["local_fraction"] >= 0.8
    (tmp_path / "w.json").write_text(json.dumps({"a": "nope"}))
    assert main(["--pairs", "x", "--a", "t", "--b", "l", "--workers", str(tmp_path / "w.json"),
                 "--out", str(out)]) == 2  # fmt: skip
    assert "workers file" in capsys.readouterr().err
