"""The Nexmark benchmark scenario (benchmarks/scenarios/nexmark.py) on a stub testbed: every
query on both transports, runs whose sinks match the reference give events/s, one that does
not is a failed run; the checked tuples leave the records."""

from __future__ import annotations

from benchmarks.scenario import Bench, scenarios
from benchmarks.scenarios import nexmark as scenario
from benchmarks.testbed import RunResult
from typhoon.operators import nexmark_reference as ref
from typhoon.operators.nexmark import kind_count

COUNT = 3000


def sink_rows(query: str, sink: str, want) -> list[list]:  # noqa: ANN001 - a Counter or a map
    """Tuples a sink holding exactly ``want`` reports."""
    if sink in ref.WINDOW_SINKS.get(query, ()):
        return [[k, s, e, v] for (k, s, e), v in want.items()]
    return [list(t) for t in want.elements()]


class Stub:
    """A testbed that runs nothing: each run reports the reference's sinks, the kinds'
    events emitted, and a run time (sdn 1 s, tcp 2 s); ``wrong`` runs (by label and
    transport) report one tuple too few."""

    def __init__(self, wrong: set[tuple[str, str]]) -> None:
        self.wrong = wrong
        self.specs: list = []

    def run(self, spec):  # noqa: ANN001, ANN201 - the Testbed signature
        self.specs.append(spec)
        query = spec.label.split()[0]
        topo = spec.topology
        args = {n: node.args for n, node in topo.nodes.items()}
        results = {}
        for sink, want in ref.expected(query, args).items():
            rows = sink_rows(query, sink, want)
            if (query, spec.transport) in self.wrong and sink == "results":
                rows = rows[1:]
            results[sink] = {"count": len(rows), "tuples": rows}
        for n in scenario.sources(topo):
            results[n] = {"emitted": kind_count(args[n]["kind"], args[n]["count"])}
        elapsed = 1.0 if spec.transport == "sdn" else 2.0
        report = {"ok": True, "elapsed_s": elapsed, "results": results}
        return RunResult(spec.transport, spec.hosts, spec.label, True, elapsed, report=report)


def test_every_query_on_both_transports_checked_against_the_reference(tmp_path):
    assert "nexmark" in [s.name for s in scenarios()]
    stub = Stub(wrong={("q7", "tcp")})
    bench = Bench(stub, tmp_path, quick=True, repeats=2)  # type: ignore[arg-type]
    nexmark = scenario.Nexmark()
    nexmark.QUICK = COUNT
    res = nexmark.run(bench)
    # 8 queries x 2 transports x 2 rounds, spread over 3 hosts, sources unthrottled
    assert len(stub.specs) == 32
    assert {(s.label.split()[0], s.transport) for s in stub.specs} == {
        (q, t) for q in ref.QUERIES for t in ("sdn", "tcp")
    }
    for spec in stub.specs:
        assert spec.topology.config["placement"] == "spread" and spec.hosts == 3
        assert all(
            spec.topology.nodes[n].args["rate"] == 0 for n in scenario.sources(spec.topology)
        )
    records, failures = bench.take_records()
    assert failures == 2  # q7 on tcp, both rounds
    bad = [r for r in records if not r["ok"]]
    assert {r["label"] for r in bad} == {"q7 3,000 events"}
    assert all(r["error"] == "sink 'results' differs from the reference" for r in bad)
    # the checked sinks keep their counts, not their tuples
    ok = [r for r in records if r["ok"]]
    assert all("tuples" not in v for r in ok for v in r["results"].values())
    by_query = {p["query"]: p for p in res.summary["queries"]}
    q0 = by_query["q0"]
    assert q0["events"] == 2760  # the bids of 3,000 events
    assert q0["sdn_events_s"] == 2760 and q0["tcp_events_s"] == 1380 and q0["sdn_over_tcp"] == 2
    assert by_query["q3"]["events"] == 60 + 180  # persons and auctions
    assert by_query["q7"]["tcp_events_s"] is None and by_query["q7"]["failed"] == {
        "sdn": 0, "tcp": 2}  # fmt: skip
    assert res.ratios[0].value == 2.0
    (table,) = res.tables
    assert [row[0] for row in table.rows] == list(ref.QUERIES)
    assert table.rows[0][2:5] == ["2,760", "1,380", "2.00×"]
    assert (tmp_path / "nexmark.png").exists()
