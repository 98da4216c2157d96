"""The connectors benchmark scenario (benchmarks/scenarios/connectors.py) on a stub testbed
and stub servers: every guarantee in every round on sdn, the example job pointed at the
servers, rows/s and commit latency from the runs' reports, a run whose table differs from
the reference failed; the headline is exactly_once over none."""

from __future__ import annotations

from collections import Counter

from benchmarks.scenario import Bench, scenarios
from benchmarks.scenarios import connectors as scenario
from benchmarks.testbed import RunResult

WANT = Counter({"a": 3, "b": 2})  # the reference: rows (a,1) (a,2) (a,3) (b,1) (b,2)
ROWS = [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]
ELAPSED = {"none": 1.0, "at_least_once": 1.25, "exactly_once": 1.6}


class StubServers:
    """Servers that are a list: ``prepare`` says the reference, a run writes ``ROWS``
    into the table (the stub testbed does), twice for the runs named in ``wrong``."""

    redis_url = "redis://127.0.0.1:7/0"
    pg_dsn = "postgresql://postgres@127.0.0.1:8/postgres"

    def __init__(self) -> None:
        self.table: list = []
        self.prepared: list = []
        self.cleared = 0
        self.closed = False

    def prepare(self, sentences, seed):  # noqa: ANN001, ANN201
        self.prepared.append((sentences, seed))
        return WANT

    def clear(self) -> None:
        self.cleared += 1
        self.table = []

    def rows(self):  # noqa: ANN201
        return list(self.table)

    def close(self) -> None:
        self.closed = True


class StubTestbed:
    """Runs nothing: each run 'writes' the reference rows into the stub table (plus one
    row again for the ``wrong`` (guarantee, round) pairs) and reports a run time by
    guarantee and a sink worker's commit timings."""

    def __init__(self, servers: StubServers, wrong: set[tuple[str, int]]) -> None:
        self.servers, self.wrong = servers, wrong
        self.specs: list = []

    def run(self, spec):  # noqa: ANN001, ANN201 - the Testbed signature
        self.specs.append(spec)
        guarantee = spec.topology.config["guarantee"]
        rnd = sum(s.topology.config["guarantee"] == guarantee for s in self.specs) - 1
        self.servers.table = ROWS + ([ROWS[0]] if (guarantee, rnd) in self.wrong else [])
        metrics = {"sink_commit_s_p50": 0.004, "sink_commit_s_p95": 0.01}
        if guarantee == "exactly_once":
            metrics |= {"sink_visible_s_p50": 0.3, "sink_visible_s_p95": 0.5}
        workers = [{"node": "sink", "metrics": metrics}, {"node": "count", "metrics": {}}]
        report = {"ok": True, "elapsed_s": ELAPSED[guarantee], "results": {"sink": {"written": 5}}}
        return RunResult(spec.transport, spec.hosts, spec.label, True, 1.0, "", report, workers)


class Stubbed(scenario.Connectors):
    QUICK = 50

    def __init__(self, servers: StubServers) -> None:
        self.servers = servers

    def start_servers(self) -> StubServers:
        return self.servers


def test_each_guarantee_every_round_checked_against_the_reference(tmp_path):
    assert "connectors" in [s.name for s in scenarios()]
    servers = StubServers()
    testbed = StubTestbed(servers, wrong={("at_least_once", 1)})
    bench = Bench(testbed, tmp_path, quick=True, repeats=3)  # type: ignore[arg-type]
    res = Stubbed(servers).run(bench)
    assert servers.prepared == [(50, scenario.Connectors.SEED)] and servers.closed
    assert servers.cleared == 9  # an empty table before every run
    order = [s.topology.config["guarantee"] for s in testbed.specs]
    assert order == [
        "none", "at_least_once", "exactly_once",
        "at_least_once", "exactly_once", "none",
        "exactly_once", "none", "at_least_once",
    ]  # fmt: skip
    for spec in testbed.specs:
        t = spec.topology
        assert spec.transport == "sdn" and spec.hosts == 3 and t.config["placement"] == "spread"
        assert t.nodes["source"].args["url"] == servers.redis_url
        assert t.nodes["source"].args["until"] == "end" and t.nodes["source"].args["rate"] == 0
        assert t.nodes["sink"].args["dsn"] == servers.pg_dsn
    records, failures = bench.take_records()
    assert failures == 1
    (bad,) = [r for r in records if not r["ok"]]
    assert bad["error"] == "the table differs from the reference (0 missing, 1 twice, 0 extra)"
    by = {v["guarantee"]: v for v in res.summary["variants"]}
    assert by["none"]["rows_s"] == 5.0 and by["exactly_once"]["rows_s"] == 5 / 1.6
    assert by["at_least_once"]["runs_rows_s"] == [4.0, None, 4.0]
    assert by["at_least_once"]["failed"] == 1
    assert by["exactly_once"]["over_none"] == 1 / 1.6
    assert by["none"]["visible_s_p50"] is None and by["exactly_once"]["visible_s_p50"] == 0.3
    assert by["exactly_once"]["commit_s_p95"] == 0.01
    (ratio,) = res.ratios
    assert ratio.value == 1 / 1.6 and ratio.met is False and ratio.target == ">= 0.8"
    (table,) = res.tables
    assert [row[0] for row in table.rows] == list(scenario.VARIANTS)
    assert table.rows[2][1:7] == ["3", "0.62×", "4.0", "10.0", "300.0", "500.0"]
    assert res.plots == ["connectors.png", "connectors_latency.png"]
    assert (tmp_path / "connectors.png").exists() and (tmp_path / "connectors_latency.png").exists()


def test_the_table_check_names_what_differs():
    assert scenario.table_problem(ROWS, WANT) == ""
    assert scenario.table_problem(ROWS[1:], WANT) == (
        "the table differs from the reference (1 missing, 0 twice, 0 extra)"
    )
    assert scenario.table_problem([*ROWS, ("c", 1)], WANT).endswith("(0 missing, 0 twice, 1 extra)")
