"""The linefab scenario's summary (benchmarks/scenarios/linefab.py) from made-up runs:
the transfer-time ratios, issue 33's target on the line (sdn within 1.2x of tcp on
the same fabric) judged both ways, and each transport's frame size in the note."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.scenario import Bench
from benchmarks.scenarios import linefab as scenario
from benchmarks.testbed import RunResult


def run(transport: str, span_s: float, frames: int) -> RunResult:
    """An ok run whose sink got 1,000 tuples from 10.0 s to 10.0 + ``span_s``."""
    sink = {
        "missing": 0,
        "duplicates": 0,
        "per_worker": [{"received": 1000, "first_s": 10.0, "last_s": 10.0 + span_s}],
    }
    report = {"ok": True, "elapsed_s": span_s + 0.3, "results": {"sink": sink}}
    return RunResult(transport, 4, "x", True, span_s + 1, report=report, frame_bytes=frames)


def summarise(tmp_path: Path, line_sdn_s: float) -> scenario.ScenarioResult:
    """Three rounds at batch 10: tcp 1.0 s everywhere, sdn ``line_sdn_s`` on the line's
    ends and 1.1 s elsewhere; sdn frames 64,000, tcp 9,000 and 64,000."""
    runs: dict[tuple[scenario.Point, str], list[RunResult]] = {}
    for shape in scenario.SHAPES:
        for placement in scenario.PLACEMENTS:
            p = scenario.Point(shape, placement, 10)
            sdn_s = line_sdn_s if (shape, placement) == ("line", "ends") else 1.1
            runs[(p, "sdn")] = [run("sdn", sdn_s, 64000) for _ in range(3)]
            runs[(p, "tcp")] = [run("tcp", 1.0, b) for b in (9000, 64000, 64000)]
    lf = scenario.LineFabric()
    bench = Bench(None, tmp_path, quick=True, repeats=3)  # type: ignore[arg-type]
    res = lf.result(bench)
    lf.describe(res, bench, runs, {}, lf.QUICK)
    return res


@pytest.mark.parametrize(("line_sdn_s", "met"), [(1.15, True), (1.25, False)])
def test_the_line_target_and_the_frames_note(tmp_path: Path, line_sdn_s: float, met: bool):
    res = summarise(tmp_path, line_sdn_s)
    ratios = {r.name: r for r in res.ratios}
    line = ratios["line ends batch 10: sdn/tcp transfer time (same fabric)"]
    assert line.value == pytest.approx(line_sdn_s)
    assert (line.target, line.met) == ("<= 1.2", met)
    mesh = ratios["mesh ends batch 10: sdn/tcp transfer time (same fabric)"]
    assert mesh.value == pytest.approx(1.1)
    assert (mesh.target, mesh.met) == ("", None)  # no target on the mesh
    table = res.tables[0]
    assert "Frames: sdn 64,000, tcp 9,000 / 64,000 bytes." in table.note
    (row,) = [r for r in table.rows if r[:3] == ["ends", "line", "10"]]
    assert row[5] == f"{line_sdn_s:.2f}"  # sdn/tcp
    assert (tmp_path / "linefab.png").exists()
