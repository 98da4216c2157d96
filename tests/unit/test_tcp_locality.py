"""``typhoon run --transport tcp --locality AT`` (typhoon_cli/tcp_locality.py): the
locality router's job of sdn (``controller/locality/job.py``) driven by the tcp run loop,
its reroutes run by the tcp executor against a fake tcp cluster whose workers ack every
control tuple (the real processes: tests/runtime/test_guaranteed_rescale_tcp.py)."""

from __future__ import annotations

from typing import Any

import pytest
from test_tcp_reconfig import RUNNING, FakeCluster

import typhoon_cli
from controller.locality.job import RouterSettings
from typhoon.tcp_reconfig import Rescaler
from typhoon.topology import load_topology_text
from typhoon_cli import UsageError, locality_run
from typhoon_cli.tcp_locality import TcpLocality, check_locality, parse_locality_option

COUNTING = RUNNING.replace("name: rm\n", "name: rm\nconfig: {locality: {pairs: 1000, sample: 1}}\n")


def topo(text: str = COUNTING, **config: Any):
    t = load_topology_text(text, "t.yaml")
    t.config.update(config)
    return t


class Cluster(FakeCluster):
    """The fake tcp cluster with what the locality job reads: metrics and connections."""

    def __init__(self, t) -> None:
        super().__init__(t)
        self.conns = {w: None for w in self.procs}
        self.metrics: dict[int, dict[str, Any]] = {}
        self.rescaler = Rescaler(self)
        self.clock = 0.0

    def answer(self) -> None:
        """Every count worker's METRIC_RESP: word -> key pairs (the same word), and the
        tuples it sent to each max worker."""
        self.clock += 1.0
        maxes = [w.worker_id for w in self.physical.active_of_node("max")]
        for w in self.physical.active_of_node("count"):
            words = [f"w{w.index}-{i}" for i in range(40)]
            self.metrics[w.worker_id] = {
                "time": self.clock,
                "pairs": {k: {k: 30} for k in words},
                "sent_to": {f"{m}:3": 100 * (w.index + 1) for m in maxes},
            }


def test_the_option_is_seconds():
    assert parse_locality_option("2.5") == 2.5 and parse_locality_option("0") == 0.0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ValueError, match="number of seconds >= 0"):
            parse_locality_option(bad)


def test_a_job_that_counts_no_pairs_is_refused_before_the_run():
    assert check_locality(topo()) is None
    sentence = check_locality(topo(RUNNING))
    assert sentence is not None and "does not count key pairs" in sentence
    with pytest.raises(UsageError, match="--locality 3: 'rm' does not count key pairs"):
        locality_run(topo(RUNNING), "3")
    with pytest.raises(UsageError, match="number of seconds"):
        locality_run(topo(), "x")
    assert locality_run(topo(), None) is None
    assert locality_run(topo(), "3").at == 3.0


@pytest.mark.parametrize("guarantee", ["none", "exactly_once"])
def test_the_locality_job_runs_its_two_direct_reroutes_through_the_tcp_executor(guarantee):
    c = Cluster(topo(guarantee=guarantee))
    driver = TcpLocality(2.0, RouterSettings(min_pairs=100))
    driver(c, 1.0)
    assert driver.job is None and driver.report()["phase"] == "not started"
    driver(c, 2.0)  # begins: asks the count workers for fresh statistics
    counts = [w.worker_id for w in c.physical.active_of_node("count")]
    asked = [w for kind, w in c.log if kind == "METRIC_REQ"]
    assert sorted(asked) == counts and driver.job.phase == "collecting"
    c.answer()
    for turn in range(20):  # the run loop: the hook, then the rescaler's turn
        driver(c, 3.0 + turn)
        assert c.rescaler.turn(3.0 + turn)
        if driver.job.phase == "measuring":
            c.answer()
        if not driver.job.running:
            break
    report = driver.report()
    assert report["phase"] == "done", report
    assert report["node"] == "count" and report["reconfigurations"] == [1, 2]
    recs = c.rescaler.records
    assert [r.state for r in recs] == ["done", "done"]
    assert [r.to_dict()["request"] for r in recs] == [
        "route stream 2 by direct on word",
        "route stream 3 by direct on key",
    ]
    # pinned keys moved with their state: KEYGROUPS steps, and both streams route by table
    assert all(any(s["what"].startswith("KEYGROUPS") for s in r.steps) for r in recs)
    assert [s.grouping.type for s in c.topology.streams[1:]] == ["direct", "direct"]
    assert set(report["crossing"]) == {"before", "after"}


def test_a_locality_job_with_too_few_pairs_is_skipped_and_changes_nothing():
    c = Cluster(topo())
    driver = TcpLocality(0.0)  # min_pairs 1000 by default
    driver(c, 0.0)
    c.answer()
    for key in c.metrics:
        c.metrics[key]["pairs"] = {"a": {"a": 1}}
    driver(c, 1.0)
    assert driver.report()["phase"] == "skipped" and not c.rescaler.records


# ----- the command line ----------------------------------------------------------------------


def cli(monkeypatch, capsys, tmp_path, text: str, *argv: str, phase: str = "done"):
    """``typhoon run`` with ``run_tcp`` replaced: the options it got, and the exit code."""
    import typhoon.tcp_cluster
    from typhoon.report import build_report

    path = tmp_path / "job.yaml"
    path.write_text(text)
    seen: dict[str, Any] = {}

    def fake_run_tcp(topology, options):
        seen["options"] = options

        class Job:  # how the locality job ended in the run
            def report(self, core):
                return {"phase": phase, "reason": "the reroute's record is gone"}

        options.on_turn[0].job = Job()
        return {**build_report(topology, []), "elapsed_s": 0.5}

    monkeypatch.setattr(typhoon.tcp_cluster, "run_tcp", fake_run_tcp)
    code = typhoon_cli.main(["run", str(path), "-q", "--report", str(tmp_path / "r.json"), *argv])
    capsys.readouterr()
    return code, seen


def test_the_cli_refuses_locality_where_it_cannot_run(monkeypatch, capsys, tmp_path):
    code, seen = cli(monkeypatch, capsys, tmp_path, RUNNING, "--locality", "3")
    assert code == 2 and not seen  # refused before the run: no counting node
    code, seen = cli(monkeypatch, capsys, tmp_path, COUNTING, "--locality", "3",
                     "--transport", "sdn")  # fmt: skip
    assert code == 2 and not seen


@pytest.mark.parametrize(("phase", "code"), [("done", 0), ("skipped", 0), ("failed", 1)])
def test_the_cli_hooks_the_locality_run_and_reports_it(monkeypatch, capsys, tmp_path, phase, code):
    import json

    got, seen = cli(monkeypatch, capsys, tmp_path, COUNTING, "--locality", "2.5", phase=phase)
    (hook,) = seen["options"].on_turn
    assert isinstance(hook, TcpLocality) and hook.at == 2.5
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["locality"]["phase"] == phase and got == code
    if phase == "failed":
        assert "locality move: the reroute's record is gone" in report["problems"]
