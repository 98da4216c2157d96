"""The run report's verdict: both ends of every link compared, losses named."""

from __future__ import annotations

from typing import Any

from typhoon.report import build_report, link_problems, result_problems
from typhoon.topology import load_topology_text

FAN_IN = """
name: fan
spouts:
  - id: source
    operator: sequence_source
    args: {count: 10}
    parallelism: 2
bolts:
  - id: sink
    operator: sequence_check
streams:
  - {from: source, to: sink, grouping: shuffle}
"""


def worker(wid: int, node: str, index: int, links: dict[str, Any] | None, result=None):
    return {
        "worker": wid,
        "node": node,
        "index": index,
        "host": "h1",
        "port": 100 + wid,
        "finished": True,
        "error": None,
        "metrics": {
            "in": {},
            "out": {},
            "drops": {},
            "seq_gaps": 0,
            "serializations": 0,
            "frames_out": 0,
            "credit_stalls": 0,
        },
        "links": links,
        "result": result,
    }


def links(out=None, inn=None, balanced=None, transport=None) -> dict[str, Any]:
    return {
        "out": out or {},
        "in": inn or {},
        "balanced_out": balanced or {},
        "transport": transport or {},
    }


def test_matching_ends_are_no_problem():
    ws = [
        worker(1, "source", 0, links(out={"3:1": 10})),
        worker(2, "source", 1, links(out={"3:1": 10})),
        worker(3, "sink", 0, links(inn={"1:1": 10, "2:1": 10})),
    ]
    assert link_problems(ws) == []


def test_a_missing_tuple_names_the_link_and_the_count():
    ws = [
        worker(1, "source", 0, links(out={"3:1": 10})),
        worker(2, "source", 1, links(out={"3:1": 10})),
        worker(3, "sink", 0, links(inn={"1:1": 10, "2:1": 7})),
    ]
    assert link_problems(ws) == [
        "worker 2 (source[1]) -> worker 3 (sink[0]) stream 1: 10 tuples sent, 7 received "
        "(3 missing)"
    ]


def test_a_duplicate_and_transport_write_offs_are_problems():
    ws = [
        worker(
            1,
            "source",
            0,
            links(
                out={"3:1": 10},
                transport={"lost_to": {"3": 2}, "unconfirmed": {"3": 1}, "open_gaps": 4},
            ),
        ),
        worker(3, "sink", 0, links(inn={"1:1": 11})),
    ]
    got = link_problems(ws)
    assert "worker 1 (source[0]) -> worker 3 (sink[0]): 2 frames written off" in got[0]
    assert "1 frames never confirmed" in got[1]
    assert got[2] == "worker 1 (source[0]): 4 frames still missing at the end"
    assert got[3].endswith("10 tuples sent, 11 received (1 duplicated)")


def test_balanced_tuples_are_checked_per_sender_and_stream():
    ws = [
        worker(1, "source", 0, links(balanced={"1": 10})),
        worker(3, "sink", 0, links(inn={"1:1": 6})),
        worker(4, "sink", 1, links(inn={"1:1": 3})),
    ]
    assert link_problems(ws) == [
        "worker 1 (source[0]) -> stream 1 (balanced): 10 tuples sent, 9 received (1 missing)"
    ]


def test_a_worker_without_a_report_is_left_to_the_failed_run():
    ws = [worker(1, "source", 0, links(out={"3:1": 10}))]
    assert link_problems(ws) == []


def test_sink_results_with_loss_are_problems():
    results = {
        "a": {"duplicates": 0, "missing": 3, "expected": 30},
        "b": {"duplicates": 2, "missing": 0},
        "c": {"duplicates": 0, "missing": None},  # nothing known to expect
    }
    assert result_problems(results) == [
        "sink a: 3 tuples missing of 30",
        "sink b: 2 tuples duplicated",
    ]


def test_the_verdict_is_false_when_anything_is_wrong_even_if_every_worker_exited_0():
    topo = load_topology_text(FAN_IN, "fan.yaml")
    src = {"src": 0, "emitted": 10}
    ws = [
        worker(1, "source", 0, links(out={"3:1": 10}), {**src, "src": 1}),
        worker(2, "source", 1, links(out={"3:1": 10}), {**src, "src": 2}),
        worker(3, "sink", 0, links(inn={"1:1": 10, "2:1": 10}), None),
    ]
    ok = build_report(topo, ws, ok=True)
    assert ok["ok"] and ok["problems"] == []
    bad = build_report(topo, ws, ok=True, switch_problems=["switch s1: 1 frames (60 bytes) ..."])
    assert not bad["ok"] and bad["problems"] == ["switch s1: 1 frames (60 bytes) ..."]
    assert "switch_problems" not in bad


def test_exact_results_after_a_handled_incident_are_ok_and_list_it():
    """A recovered worker (a guarantee): its incident is listed, with the frames its
    senders still wrote to its address, and the run is ok when every link is exact."""
    topo = load_topology_text(FAN_IN, "fan.yaml")
    src = {"src": 0, "emitted": 10}
    ws = [
        worker(1, "source", 0, links(out={"3:1": 10}), {**src, "src": 1}),
        worker(2, "source", 1, links(out={"3:1": 10}), {**src, "src": 2}),
        worker(3, "sink", 0, links(inn={"1:1": 10, "2:1": 10}), None),
    ]
    incident = {
        "worker": 4,
        "node": "sink",
        "state": "rejoined",
        "restore_epoch": 1000001,
        "rolled_back": [1, 2],
        "dropped": ["switch s1: 40 frames (1520 bytes) met drop rule priority=20,dl_dst=..."],
    }
    report = build_report(topo, ws, ok=True, recovered=[4], incidents=[incident])
    assert report["ok"] and report["problems"] == []
    assert report["incidents"] == [incident]
    # a loss that no incident explains still fails the run
    short = [*ws[:2], worker(3, "sink", 0, links(inn={"1:1": 9, "2:1": 10}), None)]
    lossy = build_report(topo, short, ok=True, recovered=[4], incidents=[incident])
    assert not lossy["ok"]
    assert lossy["problems"] == [
        "worker 1 (source[0]) -> worker 3 (sink[0]) stream 1: 10 tuples sent, 9 received "
        "(1 missing)"
    ]
    # so does a drop rule no incident owns
    stray = ["switch s1: 1 frames (60 bytes) met drop rule priority=10,in_port=101"]
    assert not build_report(topo, ws, ok=True, incidents=[incident], switch_problems=stray)["ok"]


def test_an_incident_that_did_not_end_in_a_recovery_fails_the_run():
    topo = load_topology_text(FAN_IN, "fan.yaml")
    src = {"src": 0, "emitted": 10}
    ws = [
        worker(1, "source", 0, links(out={"3:1": 10}), {**src, "src": 1}),
        worker(2, "source", 1, links(out={"3:1": 10}), {**src, "src": 2}),
        worker(3, "sink", 0, links(inn={"1:1": 10, "2:1": 10}), None),
    ]
    failed = {
        "worker": 4,
        "node": "sink",
        "reason": "port h1/104 deleted",
        "state": "failed",
        "detail": "replacement 5 not attached in 30.0 s",
    }
    report = build_report(topo, ws, ok=True, incidents=[failed])
    assert not report["ok"]
    assert report["problems"] == [
        "worker 4 (sink) died (port h1/104 deleted) and was not recovered (state failed): "
        "replacement 5 not attached in 30.0 s"
    ]
    midway = {**failed, "state": "replacing", "detail": ""}
    assert not build_report(topo, ws, ok=True, incidents=[midway])["ok"]
