"""The recovery scenario's size axis (benchmarks/recovery_size.py) without a cluster: the
jobs it submits, and its table, headline ratios and plots from given runs."""

from __future__ import annotations

import pytest

from benchmarks.recovery_size import SIZES, VARIANTS, SizeAxis, SizeRun, pipelines_yaml
from benchmarks.scenario import Bench, ScenarioResult
from typhoon.checkpoint.regions import failover_regions
from typhoon.topology import schedule
from typhoon.topology.loader import load_topology_text


def test_the_jobs_are_n_pipelines_with_each_recovery_setting():
    partial = load_topology_text(pipelines_yaml(4, "p", "partial", "/tmp/x", count=10, rate=5))
    assert partial.config["partial_rollback"] is True and "failover" not in partial.config
    assert partial.nodes["source_3"].args["count"] == 10
    physical = schedule(partial, ["h1", "h2", "h3"], 0x42, first_port=10)
    assert len(physical.workers) == 20 and len(failover_regions(partial, physical)) == 4
    whole = load_topology_text(pipelines_yaml(4, "g", "global", "/tmp/x"))
    assert len(failover_regions(whole, schedule(whole, ["h1"], 0x42, first_port=10))) == 1


def run(n: int, v: str, recovery: float, untouched: float | None) -> SizeRun:
    r = SizeRun(n, v, ok=True, workers=5 * n, killed=100.0, recovery_s=recovery)
    r.incident = {"region": list(range(3 if v == "partial" else 5 * n)), "detected_wall": 100.01,
                  "rolled_back_ms": 900.0, "back_at_80_ms": 1000.0}  # fmt: skip
    r.p1_lowest, r.untouched_lowest = 0.4, untouched
    r.untouched_new_lowest = None if untouched is None else untouched - 0.1
    r.series = {1: [(-1.0, 2400.0), (0.0, 900.0)], 2: [(-1.0, 2400.0), (0.0, 2300.0)]}
    return r


def test_the_report_holds_each_size_side_by_side_and_judges_the_targets(tmp_path):
    runs = {
        (n, v): [run(n, v, 1.0 * (n if v == "global" else 1), None if n == 1 else 0.95)]
        for n in SIZES
        for v in VARIANTS
    }
    runs[(2, "global")][0].untouched_lowest = 0.5
    res = ScenarioResult("recovery", "t", "f", "quick")
    SizeAxis().describe_sizes(Bench(None, tmp_path, quick=True, repeats=1), res, runs)  # type: ignore[arg-type]
    (table,) = res.tables
    assert [row[:4] for row in table.rows[:2]] == [
        ["1", "partial", "5", "3"],
        ["1", "global", "5", "5"],
    ]
    assert table.rows[-1][3] == "20" and table.rows[0][9] == "–"
    met = {r.name: r.met for r in res.ratios}
    assert met["recovery size: recovery time, 4 pipelines - 1 pipeline, partial (s)"] is True
    assert met["recovery size: recovery time, 4 pipelines - 1 pipeline, global (s)"] is False
    worst = [r for r in res.ratios if r.name.startswith("recovery size: untouched")]
    assert [r.value for r in worst] == pytest.approx([0.95, 0.85, 0.5, 0.85])
    assert [r.met for r in worst] == [True, False, False, False]
    assert res.plots == ["recovery_size.png", "recovery_size_timeline.png"]
    assert (tmp_path / "recovery_size.png").exists()
