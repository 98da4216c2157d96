"""The columnar benchmark scenario (benchmarks/scenarios/columnar.py) on a stub testbed:
rows and columns on both transports, 1 and 2 hosts, rounds alternated; the table
reports the sink rates and the 3M target is judged on the best sdn columns run."""

from __future__ import annotations

from benchmarks.scenario import Bench, scenarios
from benchmarks.scenarios import columnar as scenario
from benchmarks.testbed import RunResult

# tuples/s at the sink a stub run reports, by (form, transport)
RATES = {("rows", "sdn"): 1.2e6, ("rows", "tcp"): 1.0e6, ("columns", "sdn"): 3.5e6,
         ("columns", "tcp"): 2.0e6}  # fmt: skip


class Stub:
    def __init__(self) -> None:
        self.specs: list = []

    def run(self, spec):  # noqa: ANN001, ANN201 - the Testbed signature
        self.specs.append(spec)
        rate = RATES[(spec.label.split()[-1], spec.transport)]
        sink = {
            "missing": 0,
            "duplicates": 0,
            "per_worker": [{"received": int(rate * 2), "first_s": 10.0, "last_s": 12.0}],
        }
        report = {"ok": True, "results": {"sink": sink}}
        frames = {"sdn": 64000, "tcp": 9000}[spec.transport]
        return RunResult(
            spec.transport, spec.hosts, spec.label, True, 3.0, report=report, frame_bytes=frames
        )


def test_rows_and_columns_on_both_transports_and_the_target(tmp_path):
    assert "columnar" in [s.name for s in scenarios()]
    stub = Stub()
    res = scenario.Columnar().run(Bench(stub, tmp_path, quick=True, repeats=2))  # type: ignore[arg-type]
    assert len(stub.specs) == 2 * 2 * 2 * 2  # placements x forms x transports x rounds
    columnar = {s.topology.nodes["source"].operator for s in stub.specs if "columns" in s.label}
    assert columnar == {"sequence_columns"}
    assert all(s.topology.streams[0].columns for s in stub.specs if "columns" in s.label)
    assert not any(s.topology.streams[0].columns for s in stub.specs if "rows" in s.label)
    assert {s.hosts for s in stub.specs} == {1, 2}
    (table,) = res.tables
    assert [r[:3] for r in table.rows] == [
        ["LOCAL", "rows", "1,200,000"], ["LOCAL", "columns", "3,500,000"],
        ["REMOTE", "rows", "1,200,000"], ["REMOTE", "columns", "3,500,000"],
    ]  # fmt: skip
    assert "Frames: sdn 64,000, tcp 9,000 bytes." in table.note  # what the runs used
    assert res.summary["frame_bytes"] == {"sdn": "64,000", "tcp": "9,000"}
    assert all(p["reached_target"] == (p["form"] == "columns") for p in res.summary["points"])
    met = [r.met for r in res.ratios if "3M" in r.name]
    assert met == [True, True]
    assert (tmp_path / "columnar.png").exists()
