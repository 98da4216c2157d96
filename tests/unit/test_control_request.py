"""What ``POST …/control`` sends and refuses (controller/control_request.py), and what a
bolt's worker does with a spout's control tuple (issue 34, items 3 and 4)."""

from __future__ import annotations

import itertools

import pytest

from controller.control_request import (
    PROTOCOL_STEPS,
    ControlRequestError,
    parse_control,
)
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import Control

TOPO = """
name: three
spouts:
  - id: source
    operator: sequence_source
    parallelism: 2
bolts:
  - id: mid
    operator: identity
    parallelism: 2
  - id: sink
    operator: sequence_check
streams:
  - {from: source, to: mid, grouping: shuffle}
  - {from: mid, to: sink, grouping: global}
"""


@pytest.fixture
def app():
    topo = load_topology_text(TOPO)
    return topo, schedule(topo, ["h1", "h2"], 7, first_port=100)


def parse(app, body):
    topo, physical = app
    return parse_control(body, "three", topo, physical, itertools.count(500).__next__)


def ids(app, node):
    return [w.worker_id for w in app[1].of_node(node)]


def test_a_forced_swap_names_a_built_in_operator_or_one_the_topology_runs(app):
    body = {"version": 9, "operator": "busy", "args": {}}
    request = {"type": "SWAP", "body": body, "node": "source", "force": True}
    assert parse(app, request).tuple.body["operator"] == "busy"
    with pytest.raises(ControlRequestError, match="would import code") as e:
        parse(app, {**request, "body": {**body, "operator": "os.path:join"}})
    assert e.value.status == 400


@pytest.mark.parametrize("ctype", sorted(c.name for c in PROTOCOL_STEPS))
def test_protocol_steps_are_refused_unless_forced(app, ctype):
    bodies = {
        "ROUTING": {"stream": 1, "policy": "shuffle", "next_hops": [3], "version": 9},
        "UPSTREAM": {"version": 9},
        "DRAIN": {"version": 9},
        "ROLLBACK": {"generation": 2, "epoch": -1},
        "KEYGROUPS": {"version": 9, "migration": 1, "phase": "finish"},
        "CHAIN": {"version": 9, "receiver": 3, "chained": False},
        "SWAP": {"version": 9, "operator": "busy", "args": {"cost_us": 1}},
    }
    request = {"type": ctype, "body": bodies[ctype], "node": "source"}
    with pytest.raises(ControlRequestError) as e:
        parse(app, request)
    assert e.value.status == 400
    assert e.value.message.startswith(f"{ctype} is a step of a protocol")
    assert "typhoon " in e.value.message or "recovery" in e.value.message
    assert e.value.message.endswith('give "force": true to send it anyway')
    forced = parse(app, {**request, "force": True})
    assert forced.tuple.type == Control[ctype] and forced.workers == ids(app, "source")


def test_the_route_and_drain_refusals_point_at_the_verbs(app):
    with pytest.raises(ControlRequestError, match="use `typhoon route`|with `typhoon route`"):
        parse(app, {"type": "ROUTING", "body": {}})
    with pytest.raises(ControlRequestError, match="`typhoon scale` or `typhoon remove`"):
        parse(app, {"type": "DRAIN", "body": {"version": 1}})


@pytest.mark.parametrize(
    ("ctype", "body"),
    [("INPUT_RATE", {"rate": 10.0}), ("ACTIVATE", {}), ("DEACTIVATE", {})],
)
def test_spout_kinds_are_refused_for_bolts_with_a_reason(app, ctype, body):
    with pytest.raises(ControlRequestError) as e:
        parse(app, {"type": ctype, "body": body, "node": "mid"})
    assert e.value.status == 400
    assert f"{ctype} " in e.value.message and "'mid' is a bolt" in e.value.message
    assert "pace or stop the spouts that feed it" in e.value.message
    # a worker list with one bolt among spouts: refused as a whole, naming the bolt
    with pytest.raises(ControlRequestError, match="'sink' is a bolt"):
        parse(
            app, {"type": ctype, "body": body, "workers": [*ids(app, "source"), *ids(app, "sink")]}
        )
    # no target: the spouts' workers, never the bolts'
    assert parse(app, {"type": ctype, "body": body}).workers == sorted(ids(app, "source"))
    assert parse(app, {"type": ctype, "body": body, "node": "source"}).workers == ids(app, "source")


def test_table_2_kinds_reach_any_node(app):
    size = parse(app, {"type": "BATCH_SIZE", "body": {"size": 3, "max_delay_ms": 1}, "node": "mid"})
    assert size.workers == ids(app, "mid") and size.tuple.body["size"] == 3
    sig = parse(app, {"type": "signal", "body": {"version": 4}})
    assert sig.tuple.type == Control.SIGNAL and sig.workers == sorted(
        w.worker_id for w in app[1].workers
    )


def test_a_metric_req_gets_a_request_id_unless_it_has_one(app):
    first = parse(app, {"type": "METRIC_REQ", "node": "sink"})
    assert first.request_id == 500 and first.tuple.body == {"request_id": 500}
    assert first.reply(1) == {"sent": 1, "workers": ids(app, "sink"), "type": "METRIC_REQ",
                              "request_id": 500}  # fmt: skip
    given = parse(app, {"type": "METRIC_REQ", "body": {"request_id": 77}})
    assert given.request_id == 77
    assert "request_id" not in parse(app, {"type": "ACTIVATE"}).reply(2)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ([], 400, "the body must be a JSON object"),
        ({"type": "NOPE"}, 400, "'type' must be one of ROUTING, SIGNAL"),
        ({"type": "METRIC_RESP"}, 400, "METRIC_RESP is sent by workers, not to them"),
        ({"type": "ACTIVATE", "force": "yes"}, 400, "'force' must be true or false"),
        ({"type": "ACTIVATE", "extra": 1}, 400, "unknown field(s): extra"),
        ({"type": "ACTIVATE", "node": "ghost"}, 404, "no node named 'ghost' in 'three'"),
        ({"type": "ACTIVATE", "node": 3}, 404, "no node named '3' in 'three'"),
        ({"type": "SIGNAL", "body": {"version": 1}, "workers": [99]}, 404, "no worker(s) [99]"),
        ({"type": "SIGNAL", "body": {"version": 1}, "workers": [True]}, 400, "'workers' must be"),
        (
            {"type": "SIGNAL", "body": {"version": 1}, "workers": [1], "node": "mid"},
            400,
            "give 'workers' or 'node', not both",
        ),  # fmt: skip
        ({"type": "INPUT_RATE", "body": {"rate": -1}}, 400, "bad INPUT_RATE body: INPUT_RATE.rate"),
        ({"type": "BATCH_SIZE", "body": {"size": 0, "max_delay_ms": 1}}, 400, "bad BATCH_SIZE"),
        ({"type": "SIGNAL", "body": []}, 400, "'body' must be a JSON object"),
    ],
)
def test_malformed_requests_get_one_sentence(app, body, status, message):
    with pytest.raises(ControlRequestError) as e:
        parse(app, body)
    assert e.value.status == status and e.value.message.startswith(message), e.value.message
