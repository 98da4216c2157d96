"""Debug sessions without a controller: requests, ports, ring buffers, timeouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.debugging.debugger import (
    DebugError,
    DebugSessions,
    Limits,
    observed_fields,
    resolve_worker,
)
from typhoon.topology.loader import load_topology
from typhoon.topology.scheduler import schedule

FIXTURES = Path(__file__).parent / "fixtures" / "topologies" / "good"
APP = 7


@pytest.fixture
def wc():
    topology = load_topology(FIXTURES / "wordcount.yaml")
    return topology, schedule(topology, ["h1", "h2", "h3"], APP, 100)


def attach(sessions, wc, request, sid="a1b2c3", now=0.0, used=frozenset()):
    topology, physical = wc
    w = resolve_worker(physical, request.get("worker"))
    return sessions.plan("wc", topology, physical, w, 1, set(used), request, sid, "k" * 32, now)


def test_worker_by_id_or_node_index(wc):
    _, physical = wc
    split1 = physical.of_node("split")[1]
    for text in (split1.worker_id, str(split1.worker_id), "split[1]", "split:1", " split[1] "):
        assert resolve_worker(physical, text) == split1
    assert resolve_worker(physical, "source") == physical.of_node("source")[0]
    for text, status, message in [
        ("split", 400, "has 2 workers"),
        ("split[5]", 404, "no worker with index 5"),
        ("nope[0]", 404, "no node named 'nope'"),
        (999, 404, "no worker 999"),
        (None, 400, "worker id or NODE"),
        ("a b", 400, "worker id or NODE"),
    ]:
        with pytest.raises(DebugError, match=message) as e:
            resolve_worker(physical, text)
        assert e.value.status == status


def test_plan_builds_the_spec_the_debug_worker_needs(wc):
    _, physical = wc
    sessions = DebugSessions(Limits(report_url="http://c/typhoon/debug"))
    s = attach(sessions, wc, {"worker": "split[0]", "filter": "word in a,b", "sample": 50})
    split0 = physical.of_node("split")[0]
    spec = s.spec
    assert (spec.app, spec.app_id, spec.worker, spec.host) == ("wc", APP, split0.worker_id, "h1")
    assert (spec.direction, spec.filter, spec.sample, spec.port) == (
        "out",
        "word in a,b",
        50,
        65000,
    )
    assert spec.tap == "tdbga1b2c3" and spec.key == "k" * 32
    assert spec.workers[split0.worker_id] == ("split", 0)
    assert spec.fields["split"] == ["word"] and spec.fields["source"] == ["sentence"]
    assert s.state == "starting" and s.ring_size == 1000
    assert "key" not in s.to_dict()
    assert spec.rate == Limits().mirror_rate and s.tap(9).rate == spec.rate


def test_a_session_asks_its_rate_and_shows_the_switch_counters(wc):
    sessions = DebugSessions(Limits())
    s = attach(sessions, wc, {"worker": "split[0]", "rate": 25})
    assert s.spec.rate == 25 and s.tap(9).meter.rate == 25
    s.stats = {"frames": 10, "seq_gaps": 90}
    s.switch = {"switch_sampled": 88, "switch_dropped": 0}
    assert s.to_dict()["stats"] == {
        "frames": 10, "seq_gaps": 90, "switch_sampled": 88, "switch_dropped": 0
    } and s.to_dict()["rate"] == 25  # fmt: skip


def test_rate_all_copies_every_frame_and_the_port_counters_say_what_was_copied(wc):
    sessions = DebugSessions(Limits())
    s = attach(sessions, wc, {"worker": "split[0]", "rate": "all"})
    assert s.spec.rate is None and s.tap(9).meter is None and s.to_dict()["rate"] == "all"
    s.port_counted(tx_packets=500, tx_dropped=7)  # no meter: the port says it all
    assert s.switch == {"switch_dropped": 7, "switch_copied": 507, "switch_sampled": 0}
    sampled = attach(sessions, wc, {"worker": "split[0]", "rate": 25}, sid="d4e5f6")
    sampled.meter_counted(packets_in=100, left_out=60)
    sampled.port_counted(tx_packets=40, tx_dropped=1)  # the meter's counters stand
    assert sampled.switch == {"switch_copied": 40, "switch_sampled": 60, "switch_dropped": 1}
    # an operator may forbid it
    with pytest.raises(DebugError, match="allow_every_frame") as e:
        attach(DebugSessions(Limits(allow_every_frame=False)), wc, {"worker": 1, "rate": "all"})
    assert e.value.status == 403


@pytest.mark.parametrize(
    ("request_", "status", "message"),
    [
        ({"worker": "split[0]", "rate": "ALL"}, 400, "or 'all' for every frame"),
        ({"worker": "split[0]", "direction": "up"}, 400, "'direction' must be one of"),
        ({"worker": "split[0]", "filter": "wrod=a"}, 400, "unknown field.s. wrod"),
        ({"worker": "split[0]", "filter": "sentence=a"}, 400, "unknown field"),  # that is input
        ({"worker": "split[0]", "filter": "word="}, 400, "bad filter: expected a value"),
        ({"worker": "split[0]", "filter": 3}, 400, "'filter' must be a string"),
        ({"worker": "split[0]", "sample": 0}, 400, "percentage"),
        ({"worker": "split[0]", "sample": True}, 400, "percentage"),
        ({"worker": "split[0]", "last": 0}, 400, "'last' must be"),
        ({"worker": "split[0]", "last": 10**9}, 400, "'last' must be"),
        ({"worker": "split[0]", "colour": "red"}, 400, "unknown field.s.: colour"),
        ({"worker": "split[0]", "rate": 0}, 400, "'rate' must be an integer number of frames"),
        ({"worker": "split[0]", "rate": 10**6}, 400, "1..10000 .max_mirror_rate."),
        ({"worker": "split[0]", "rate": 2.5}, 400, "'rate' must be"),
        ({"worker": "split[0]", "rate": True}, 400, "'rate' must be"),
    ],
)
def test_plan_refuses_bad_requests(wc, request_, status, message):
    sessions = DebugSessions(Limits())
    with pytest.raises(DebugError, match=message) as e:
        attach(sessions, wc, request_)
    assert e.value.status == status
    assert not sessions.sessions


def test_input_filters_use_the_upstream_fields(wc):
    topology, _ = wc
    # what a session on split sees: its input is source's sentences, its output words
    assert observed_fields(topology, "split", "in") == {"sentence"}
    assert observed_fields(topology, "split", "out") == {"word"}
    assert observed_fields(topology, "split", "both") == {"sentence", "word"}
    sessions = DebugSessions(Limits(max_sessions=10))
    s = attach(sessions, wc, {"worker": "split[0]", "direction": "in", "filter": "sentence=x"})
    assert (s.spec.direction, s.spec.filter) == ("in", "sentence=x")
    for sid, text in (("d2", "word=x"), ("d3", "sentence=x")):
        both = attach(
            sessions, wc, {"worker": "split[0]", "direction": "both", "filter": text}, sid
        )
        assert (both.spec.direction, both.spec.filter) == ("both", text)
    # an input session cannot filter on split's own output field
    with pytest.raises(DebugError, match="unknown field") as e:
        attach(sessions, wc, {"worker": "split[0]", "direction": "in", "filter": "word=x"}, "d4")
    assert e.value.status == 400


def test_ports_skip_workers_and_other_sessions_and_run_out(wc):
    sessions = DebugSessions(Limits(port_base=0xFEFD, max_sessions=10))
    worker_port = {0xFEFD}
    a = attach(sessions, wc, {"worker": "split[0]"}, "s1", used=worker_port)
    b = attach(sessions, wc, {"worker": "split[0]"}, "s2", used=worker_port)
    assert (a.spec.port, b.spec.port) == (0xFEFE, 0xFEFF)
    with pytest.raises(DebugError, match="no free debug port") as e:
        attach(sessions, wc, {"worker": "split[0]"}, "s3", used=worker_port)
    assert e.value.status == 503
    sessions.end(a, "done", 1.0)
    assert attach(sessions, wc, {"worker": "split[0]"}, "s4", used=worker_port).spec.port == 0xFEFE


def test_max_sessions(wc):
    sessions = DebugSessions(Limits(max_sessions=1))
    first = attach(sessions, wc, {"worker": "split[0]"}, "s1")
    with pytest.raises(DebugError, match="max_sessions") as e:
        attach(sessions, wc, {"worker": "split[1]"}, "s2")
    assert e.value.status == 429
    sessions.end(first, "done", 1.0)
    attach(sessions, wc, {"worker": "split[1]"}, "s2")


def test_ring_keeps_the_last_n_and_says_what_was_skipped(wc):
    sessions = DebugSessions(Limits())
    s = attach(sessions, wc, {"worker": "split[0]", "last": 3})
    assert s.read(0, 10) | {"records": None} == {
        "session": "a1b2c3",
        "state": "starting",
        "reason": "",
        "records": None,
        "next": 0,
        "skipped": 0,
        "received": 0,
    }
    s.ingest([{"v": i} for i in range(1, 6)])  # numbered 1..5, the ring holds 3..5
    page = s.read(0, 10)
    assert [r["n"] for r in page["records"]] == [3, 4, 5] and page["skipped"] == 2
    assert [r["v"] for r in page["records"]] == [3, 4, 5]
    page = s.read(3, 1)
    assert [r["n"] for r in page["records"]] == [4] and page["next"] == 4 and not page["skipped"]
    assert s.read(5, 10)["records"] == [] and s.read(5, 10)["next"] == 5
    assert s.read(0, 0)["received"] == 5


def test_timeouts_and_purge(wc):
    lim = Limits(start_timeout=10, idle_timeout=30, keep_ended=5, silent_timeout=0)
    sessions = DebugSessions(lim)
    slow = attach(sessions, wc, {"worker": "split[0]"}, "s1", now=0)
    idle = attach(sessions, wc, {"worker": "split[1]"}, "s2", now=0)
    idle.state = "live"
    assert sessions.expired(9) == []
    assert [(s.id, "did not come up" in why) for s, why in sessions.expired(11)] == [("s1", True)]
    sessions.end(slow, "debug worker did not come up", 11)
    idle.last_read = 20
    assert sessions.expired(49) == []
    [(s, why)] = sessions.expired(51)
    assert s is idle and "no client read" in why
    assert sessions.purge(15) == [] and [s.id for s in sessions.purge(17)] == ["s1"]
    assert "s1" not in sessions.sessions and sessions.get("wc", "s2") is idle
    with pytest.raises(DebugError, match="no debug session") as e:
        sessions.get("other", "s2")
    assert e.value.status == 404


def test_a_live_session_whose_debug_worker_is_silent_ends_saying_where_to_look(wc):
    sessions = DebugSessions(Limits(silent_timeout=10, idle_timeout=0))
    s = attach(sessions, wc, {"worker": "split[0]"}, "s1", now=0)
    assert sessions.expired(50) == [(s, "debug worker did not come up within 20 s")]
    s.state = "live"
    assert sessions.expired(9) == []
    [(ended, why)] = sessions.expired(11)
    assert ended is s and why == (
        f"the debug worker on {s.spec.host} sent nothing for 10 s: see its log on "
        f"{s.spec.host} (WORKDIR/debug/s1.log of the agent)"
    )
    s.heard = 8  # a batch (statistics at least) every HEARTBEAT seconds keeps it
    assert sessions.expired(17) == [] and sessions.expired(19) != []


def test_mirrors_only_for_sessions_whose_port_is_up_and_worker_present(wc):
    _, physical = wc
    sessions = DebugSessions(Limits())
    s = attach(sessions, wc, {"worker": "split[0]", "direction": "in"})
    w = physical.of_node("split")[0]
    ports = {("wc", w.worker_id): w.port}
    assert sessions.mirrors(ports) == []
    s.state = "mirroring"
    [(session, tap)] = sessions.mirrors(ports)
    assert session is s and s.spec.host == "h1"
    assert (tap.worker_id, tap.worker_port, tap.direction, tap.debug_port) == (
        w.worker_id,
        w.port,
        "in",
        65000,
    )
    assert sessions.mirrors({}) == []  # the worker is gone: nothing to copy
    assert sessions.at_port(1, 65000) is s and sessions.at_port(2, 65000) is None


def test_an_operator_goes_through_the_import_gate(wc):
    sessions = DebugSessions(Limits())
    s = attach(sessions, wc, {"worker": "split[0]", "operator": "split_words"}, sid="op0001")
    assert s.spec.operator == "split_words" and s.to_dict()["operator"] == "split_words"
    assert attach(sessions, wc, {"worker": "split[0]"}, sid="op0002").spec.operator == ""
    for request, status, message in [
        ({"operator": "typhoon.debug.examples:Tally"}, 403, "would import code"),
        ({"operator": "os:system"}, 403, "allow_imports = true"),
        ({"operator": "nope"}, 400, "unknown operator 'nope'"),
        ({"operator": "sentence_source"}, 400, "is a spout, not a bolt"),
        ({"operator": 5}, 400, "'operator' must be an operator name"),
    ]:
        with pytest.raises(DebugError, match=message) as e:
            attach(sessions, wc, {"worker": "split[0]", **request}, sid="op0003")
        assert e.value.status == status
    # the controller's own config may allow any module:Class (the debug worker imports it)
    allowed = DebugSessions(Limits(allow_imports=True))
    name = "typhoon.debug.examples:Tally"
    assert attach(allowed, wc, {"worker": "split[0]", "operator": name}).spec.operator == name


def test_the_applications_own_operators_pass_the_gate(wc):
    topology, physical = wc
    topology.nodes["count"].operator = "typhoon.debug.examples:Tally"  # as if the file said so
    s = attach(
        DebugSessions(Limits()),
        wc,
        {"worker": "split[0]", "operator": "typhoon.debug.examples:Tally"},
    )
    assert s.spec.operator == "typhoon.debug.examples:Tally"
