"""The benchmark package's pure parts: registry, operators, topologies, numbers, Markdown."""

from __future__ import annotations

import pytest

from benchmarks import measure
from benchmarks.operators import ACK_INIT_STREAM, Acker, AckingSource, BenchSink, latency_quantiles
from benchmarks.runner import render_markdown, select
from benchmarks.scenario import Ratio, ScenarioResult, Table, scenarios
from benchmarks.stats import geomean, median
from benchmarks.testbed import RunResult
from benchmarks.topologies import forwarding, one_to_many
from typhoon.operators.base import Context
from typhoon.report import build_report


def test_registry_has_the_papers_baseline_scenarios_in_order() -> None:
    names = [s.name for s in scenarios()]
    assert names[:3] == ["forwarding", "latency", "one_to_many"]
    assert len(names) == len(set(names))


def test_select_names_unknown_scenarios() -> None:
    assert [s.name for s in select(["one_to_many,forwarding"])] == ["forwarding", "one_to_many"]
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        select(["nope"])


def _context(node: str, fields: list[str]) -> Context:
    return Context("t", node, 1, 0, 1, input_fields=fields)


def test_acker_completes_every_tuple_the_sink_acked() -> None:
    src = AckingSource(count=50, size=100)
    src.open(_context("source", []))
    data, inits = [], []

    def emit(values: list, stream: str = "default") -> None:
        (inits if stream == ACK_INIT_STREAM else data).append(values)

    while src.next_batch(emit, 16):
        pass
    assert len(data) == len(inits) == 50
    assert all(len(t[3]) == 100 for t in data)  # the edge id rides inside the payload
    fields = ["src", "seq", "ts", "payload"]
    sink = BenchSink(ack=True)
    sink.open(_context("sink", fields))
    acks: list[list] = []
    for t in data:
        sink.process(t, lambda v, stream="default": acks.append(v))
    acker = Acker()
    acker.open(_context("acker", fields))
    for t in inits + acks[:-1]:  # the last tuple's ack never arrives
        acker.process(t, lambda *_: None)
    result = acker.result()
    assert (result["completed"], result["pending"]) == (49, 1)
    assert sink.result()["received"] == 50 and sink.result()["last_s"] >= sink.first


def test_latency_quantiles_span_the_samples() -> None:
    q = latency_quantiles([i / 1000 for i in range(2000)])
    assert len(q) == 1001 and q[0] == 0.0 and q[-1] == pytest.approx(1.999)
    assert measure.percentile(q, 0.5) == pytest.approx(1.0)
    assert latency_quantiles([]) == []


def test_topologies_load_and_the_report_checks_the_bench_sink() -> None:
    topo = forwarding("f", ack=True)
    assert set(topo.nodes) == {"source", "sink", "acker"}
    assert [s.name for s in topo.outputs_of("source")] == ["default", ACK_INIT_STREAM]
    bcast = one_to_many("b", 4)
    assert bcast.nodes["sink"].parallelism == 4
    assert bcast.streams[0].grouping.type == "all"

    plain = forwarding("p")
    sink = BenchSink()
    sink.open(_context("sink", ["src", "seq", "ts", "payload"]))
    for seq in range(10):
        if seq != 3:
            sink.process([1, seq, 0.0, b"x"], lambda *_: None)

    def worker(wid: int, node: str, result: dict) -> dict:
        metrics = {k: 0 for k in ("seq_gaps", "serializations", "frames_out", "credit_stalls")}
        metrics.update({"in": {}, "out": {}, "drops": {}})
        return {
            "worker": wid, "node": node, "index": 0, "host": "h1", "port": 0,
            "finished": True, "error": None, "cpu_s": 0.5, "metrics": metrics, "result": result,
        }  # fmt: skip

    report = build_report(
        plain, [worker(1, "source", {"emitted": 10, "src": 1}), worker(2, "sink", sink.result())]
    )
    assert report["results"]["sink"]["missing"] == 1
    assert report["results"]["sink"]["per_worker"][0]["received"] == 9
    run = RunResult("sdn", 1, "p", True, 1.0, report=report, workers=[])
    assert measure.lost(run, acker="") == 1
    assert measure.throughput(run) is not None


def test_statistics_skip_failed_runs() -> None:
    assert median([3.0, None, 1.0]) == 2.0
    assert median([None]) is None
    assert geomean([4.0, 1.0, None]) == pytest.approx(2.0)


def test_markdown_has_machine_ratios_and_tables() -> None:
    result = ScenarioResult(
        "forwarding",
        "Tuple forwarding",
        "Fig. 8a/b",
        "quick",
        tables=[Table("t", ["a", "b"], [["1", "2"]], note="n")],
        ratios=[Ratio.against("sdn/tcp", 0.5, at_least=1.0)],
        plots=["fig8a_forwarding.png"],
    )
    doc = {
        "written": "2025-01-01 00:00:00",
        "machine": {"cores": 2},
        "scenarios": {"forwarding": result.to_dict()},
    }
    md = render_markdown(doc)
    assert "| cores | 2 |" in md
    assert "| sdn/tcp | 0.50 | >= 1 | **no** |" in md
    assert "| 1 | 2 |" in md and "![fig8a_forwarding.png](fig8a_forwarding.png)" in md


class FakeBench:
    """Runs nothing: every run of every point gives the same synthetic result."""

    quick = True
    mode = "quick"
    repeats = 2

    def __init__(self, out_dir) -> None:  # noqa: ANN001 - a path
        self.out_dir = out_dir
        self.specs: list = []

    def interleaved(self, points, make_spec):  # noqa: ANN001, ANN201 - the Bench signature
        out = {}
        for p in points:
            for t in ("sdn", "tcp"):
                spec = make_spec(p, t)
                self.specs.append(spec)
                n = spec.topology.nodes["sink"].parallelism
                rate = (400_000 if t == "sdn" else 100_000) / n
                per = [{"received": 1000, "first_s": 0.0, "last_s": 1000 / rate}] * n
                report = {"results": {"sink": {"per_worker": per, "missing": 0, "duplicates": 0}}}
                workers = [{"node": "source", "cpu_s": 0.002, "result": {"emitted": 1000}}] + [
                    {"node": "sink", "cpu_s": 0.0005, "result": {"received": 1000}}
                ] * n
                run = RunResult(t, 3, spec.label, True, 1.0, report=report, workers=workers)
                run.ovs_cpu_s = 0.002
                out[(p, t)] = [run, run]
        return out


def test_one_to_many_reports_the_ceiling_reached_and_a_cheap_sink_series(tmp_path) -> None:  # noqa: ANN001
    from benchmarks.scenarios.one_to_many import OneToMany

    bench = FakeBench(tmp_path)
    res = OneToMany().run(bench)
    cheap = [s for s in bench.specs if "cheap" in s.label]
    assert cheap and all(s.topology.nodes["sink"].args == {"cheap": True} for s in cheap)
    assert len(res.tables) == 2
    header = res.tables[0].columns
    col = header.index("ceiling reached sdn / tcp")
    # 4 sinks: 2 + 0.5 * 4 + 2 ms CPU per 1000 tuples = 6 us per tuple; 2 cores: a
    # ceiling of 333k/s; sdn reached 100k/s per sink (30%), tcp 25k/s (7.5%)
    assert res.tables[0].rows[1][col] == "30% / 8%"
    ratios = {r.name: r.value for r in res.ratios}
    assert ratios["one-to-many, cheap sinks: sdn/tcp at 4 sinks"] == pytest.approx(4.0)
    assert res.summary["cheap_sinks"][1]["sdn_ceiling_reached"] == pytest.approx(0.3)


def test_a_failed_check_is_recorded_as_a_failed_run(tmp_path) -> None:  # noqa: ANN001
    """Bench.run applies the scenario's check (e.g. locality's exact counts) before
    the run is recorded, so results.json and the failure count show it."""
    import copy
    import functools

    from benchmarks.scenario import Bench
    from benchmarks.scenarios.locality import KEYS, Locality, Point, workload
    from benchmarks.testbed import RunSpec
    from typhoon.operators.pairs import expected_counts

    want_a, want_b = expected_counts(30, 2, KEYS, KEYS, 0.5, 1)
    right = {"ok": True, "results": {"a": {"counts": want_a}, "b": {"counts": want_b}}}
    wrong = copy.deepcopy(right)
    wrong["results"]["b"]["counts"]["b0"] = wrong["results"]["b"]["counts"].get("b0", 0) + 1

    class Stub:
        reports = [right, wrong]

        def run(self, spec):  # noqa: ANN001, ANN202 - the Testbed signature
            return RunResult("sdn", spec.hosts, spec.label, True, 1.0, report=self.reports.pop(0))

    bench = Bench(Stub(), tmp_path, quick=True, repeats=1)  # type: ignore[arg-type]
    check = functools.partial(Locality._check, count=30, sources=2, locality=0.5)
    spec = RunSpec("sdn", 2, workload(Point(2, 100, "hash", 0.5), 30, 0.0, 2), bw_mbit=20)
    assert spec.topology.nodes["source"].parallelism == 2
    assert bench.run(spec, check).ok
    bad = bench.run(spec, check)
    assert not bad.ok and bad.error == "counts differ from the generator's"
    records, failures = bench.take_records()
    assert [r["ok"] for r in records] == [True, False] and failures == 1
    with pytest.raises(ValueError, match="only the sdn transport"):
        RunSpec("tcp", 2, spec.topology, bw_mbit=20)


@pytest.mark.parametrize("mode", [[], ["--poll", "4", "--entries", "3"], ["--both"]])
def test_receive_path_delivers_every_tuple_in_each_mode(
    mode: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Straight to ``Framework.deliver``, or through ``Worker.handle`` a poll at a time
    (``one_round`` raises if a tuple did not reach the operator)."""
    from benchmarks import receive_path

    argv = ["--operator", "filter", "--tuples", "250", "--rows", "10", "--rounds", "1", *mode]
    assert receive_path.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("µs/tuple") == (2 if mode == ["--both"] else 1), out
    assert ("4 frames per poll" in out) == bool(mode and mode[0] == "--poll"), out
