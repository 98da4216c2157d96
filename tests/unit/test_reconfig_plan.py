"""The dynamic topology manager's planner: requests -> stable-update steps, without a switch."""

from __future__ import annotations

import pytest

from typhoon.reconfig import (
    Insert,
    ReconfigError,
    Remove,
    Reroute,
    Scale,
    Swap,
    parse_request,
    plan,
)
from typhoon.topology import load_topology_text, schedule
from typhoon.topology.routing import routes_for, upstream_of

HOSTS = ["h1", "h2", "h3"]

FORWARD = """
name: fwd
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: sink
    operator: sequence_check
streams:
  - {from: source, to: sink, grouping: shuffle}
"""

WORDCOUNT = """
name: wc
spouts:
  - id: source
    operator: sentence_source
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: count
    operator: count_by_key
    args: {key: word}
    parallelism: 4
    stateful: true
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: count, grouping: {type: fields, fields: [word]}}
"""

ADS = """
name: ads
spouts:
  - id: events
    operator: ad_event_source
bolts:
  - id: parse
    operator: parse_json
    args: {keys: [ad_id, event_type, event_time]}
  - id: filter
    operator: filter
    args: {field: event_type, equals: view}
    parallelism: 2
  - id: project
    operator: project
    args: {fields: [event_type, event_time]}
  - id: sink
    operator: collect
streams:
  - {from: events, to: parse, grouping: shuffle}
  - {from: parse, to: filter, grouping: shuffle}
  - {from: filter, to: project, grouping: shuffle}
  - {from: project, to: sink, grouping: global}
"""


def deployed(text: str):
    t = load_topology_text(text)
    return t, schedule(t, HOSTS, 7, first_port=100)


def actions(p) -> list[str]:
    return [s.action if s.action != "control" else s.control for s in p.steps]


def test_scale_up_stateless_launches_then_flows_then_routing():
    t, phys = deployed(FORWARD)
    p = plan(Scale("sink", 3), t, phys, HOSTS, 100)
    assert actions(p) == [
        "keep_rules", "write", "wait_attached", "wait_rules", "ROUTING", "commit",
        "drop_rules", "wait_rules",
    ]  # fmt: skip
    assert len(p.added) == 2 and p.removed == []
    routing = next(s for s in p.steps if s.control == "ROUTING")
    ((src, body),) = routing.bodies
    assert src == phys.of_node("source")[0].worker_id
    assert body["next_hops"] == [w.worker_id for w in p.physical.of_node("sink")]
    assert "version" not in body  # the executor numbers every control tuple itself
    # new workers sit on ports no old worker used, above every old worker ID
    old_ports = {(w.host, w.port) for w in phys.workers}
    for w in p.added:
        a = p.physical.by_id(w)
        assert (a.host, a.port) not in old_ports and w > max(x.worker_id for x in phys.workers)


def test_scale_down_routes_around_then_releases_then_drains():
    t, phys = deployed(FORWARD)
    up = plan(Scale("sink", 3), t, phys, HOSTS, 100)
    p = plan(Scale("sink", 1), up.topology, up.final, HOSTS, 100)
    assert actions(p) == [
        "keep_rules", "write", "wait_rules", "ROUTING", "commit", "ROUTING", "drain",
        "write_final", "wait_stopped", "drop_rules", "wait_rules",
    ]  # fmt: skip
    assert p.removed == up.added and p.added == []
    # during the update the removed workers are draining: rules stay, routes avoid them
    assert {w.worker_id for w in p.physical.draining()} == set(p.removed)
    src = p.physical.of_node("source")[0].worker_id
    (route,) = routes_for(p.topology, p.physical, src)
    assert set(route.next_hops).isdisjoint(p.removed)
    first, release = (s for s in p.steps if s.control == "ROUTING")
    assert "release" not in first.bodies[0][1]
    assert release.bodies[0][1]["release"] == sorted(p.removed)
    assert {w.worker_id for w in p.final.workers} == {w.worker_id for w in phys.workers}
    assert p.final.version == p.physical.version + 1 == up.final.version + 2


ALL_AT_ONCE = "    stateful: true\n    config: {migration_step: 0}\n"


def test_keyed_scale_moves_key_groups_and_flushes_only_if_asked():
    t, phys = deployed(WORDCOUNT.replace("    stateful: true\n", ALL_AT_ONCE))
    p = plan(Scale("count", 6), t, phys, HOSTS, 100)
    # count asks for the Listing-2 flush (stateful: true); its state moves all the same
    assert actions(p)[4:10] == ["SIGNAL", "KEYGROUPS", "ROUTING", "KEYGROUPS", "SIGNAL", "commit"]
    t2, phys2 = deployed(
        WORDCOUNT.replace("    stateful: true\n", "    config: {migration_step: 0}\n")
    )
    p2 = plan(Scale("count", 6), t2, phys2, HOSTS, 100)
    assert actions(p2)[4:8] == ["KEYGROUPS", "ROUTING", "KEYGROUPS", "commit"]
    prepare, finish = (s for s in p.steps if s.control == "KEYGROUPS")
    old = {w.worker_id for w in phys.of_node("count")}
    # groups move only from old workers to the new ones, each old worker awaits every split
    outs = {w: b for w, b in prepare.bodies if b["out"]}
    ins = {w: b for w, b in prepare.bodies if b["in"]}
    assert set(outs) <= old and set(ins) == set(p.added)
    splits = [w.worker_id for w in phys.of_node("split")]
    assert all(sorted(s for s, _ in b["expect"]) == splits for b in outs.values())
    assert sum(len(b["out"]) for b in outs.values()) == sum(len(b["in"]) for b in ins.values())
    assert sorted(w for w, _ in finish.bodies) == sorted(w for w, _ in prepare.bodies)
    routing = next(s for s in p.steps if s.control == "ROUTING")
    assert all(b["handoff"] == p.physical.version for _, b in routing.bodies)
    assert p.final.key_groups["count"] == p.physical.key_groups["count"]
    assert sorted(set(p.final.key_groups["count"])) == list(range(6))


def test_stateful_scale_flushes_before_and_after_the_remap():
    t, phys = deployed(
        WORDCOUNT.replace("operator: count_by_key\n    args: {key: word}", "operator: collect")
    )
    p = plan(Scale("count", 6), t, phys, HOSTS, 100)
    assert actions(p)[4:8] == ["SIGNAL", "ROUTING", "SIGNAL", "commit"]
    old_counts = [w.worker_id for w in phys.of_node("count")]
    before, after = (s for s in p.steps if s.control == "SIGNAL")
    assert before.workers == old_counts and after.workers == old_counts
    splits = [w.worker_id for w in phys.of_node("split")]
    assert sorted({w for w, _ in next(s for s in p.steps if s.control == "ROUTING").bodies}) == (
        splits
    )


def test_swap_replaces_every_worker_and_tells_successors_first():
    t, phys = deployed(ADS)
    p = plan(Swap("filter", "filter", {"field": "event_type", "values": ["view", "click"]}),
             t, phys, HOSTS, 100)  # fmt: skip
    old = [w.worker_id for w in phys.of_node("filter")]
    assert sorted(p.removed) == old and len(p.added) == 2
    assert p.topology.nodes["filter"].args["values"] == ["view", "click"]
    assert actions(p)[4:6] == ["UPSTREAM", "ROUTING"]  # before any old filter is released
    up = next(s for s in p.steps if s.control == "UPSTREAM")
    project = phys.of_node("project")[0].worker_id
    assert up.bodies == [(project, {"add": sorted(p.added), "remove": []})]
    # new filters wait for the parse worker's end of stream, never for a draining one
    for w in p.added:
        assert set(upstream_of(p.topology, p.physical, w)[2]) == {
            x.worker_id for x in phys.of_node("parse")
        }


def test_insert_and_remove_keep_the_senders_stream_id():
    t, phys = deployed(FORWARD)
    p = plan(Insert("mid", "identity", "source", "sink", parallelism=2), t, phys, HOSTS, 100)
    assert [(s.id, s.src, s.dst) for s in p.topology.streams] == [
        (1, "source", "mid"),
        (2, "mid", "sink"),
    ]
    assert p.topology.nodes["mid"].output_fields == t.nodes["source"].output_fields
    assert actions(p)[4:8] == ["UPSTREAM", "ROUTING", "commit", "ROUTING"]
    release = [s for s in p.steps if s.control == "ROUTING"][-1]
    assert release.bodies[0][1]["release"] == [phys.of_node("sink")[0].worker_id]

    back = plan(Remove("mid"), p.topology, p.final, HOSTS, 100)
    assert [(s.id, s.src, s.dst) for s in back.topology.streams] == [(1, "source", "sink")]
    assert sorted(back.removed) == sorted(p.added)
    assert actions(back)[3:8] == ["UPSTREAM", "ROUTING", "commit", "ROUTING", "drain"]


def test_a_keyed_nodes_input_cannot_lose_its_key_while_it_runs():
    t, phys = deployed(WORDCOUNT)
    with pytest.raises(ReconfigError, match="keeps keyed state") as e:
        plan(Reroute("split:count", "shuffle"), t, phys, HOSTS, 100)
    assert e.value.status == 409


def test_reroute_changes_only_the_senders_route():
    t, phys = deployed(
        WORDCOUNT.replace("operator: count_by_key\n    args: {key: word}", "operator: collect")
    )
    p = plan(Reroute("split:count", "shuffle"), t, phys, HOSTS, 100)
    assert p.added == [] and p.removed == []
    assert p.topology.streams[1].grouping.type == "shuffle"
    assert "SIGNAL" in actions(p)  # count is stateful: its cache is flushed around the change
    p2 = plan(Reroute(2, "fields", ("word",)), p.topology, p.final, HOSTS, 100)
    assert p2.topology.streams[1].grouping.fields == ("word",)


def test_finished_senders_get_no_control_and_new_workers_do_not_wait_for_them():
    t, phys = deployed(FORWARD)
    src = phys.of_node("source")[0].worker_id
    p = plan(Scale("sink", 2), t, phys, HOSTS, 100, exited={src})
    assert "ROUTING" not in actions(p)
    forget = next(s for s in p.steps if s.control == "UPSTREAM")
    assert forget.bodies == [(p.added[0], {"add": [], "remove": [src]})]


def test_ids_are_never_reused():
    t, phys = deployed(FORWARD)
    p = plan(Scale("sink", 2), t, phys, HOSTS, 100, min_id=50)
    assert p.added == [50]


@pytest.mark.parametrize(
    ("request_", "status", "words"),
    [
        (Scale("source", 2), 400, "spout"),
        (Scale("nope", 2), 404, "no node named 'nope'"),
        (Scale("sink", 1), 400, "already has parallelism 1"),
        (Reroute(9, "shuffle"), 404, "no stream 9"),
        (Reroute(1, "fields", ("nope",)), 400, "not valid"),
        (Reroute(1, "fields"), 400, "needs 'fields'"),
        (Reroute(1, "random"), 400, "unknown policy"),
        (Swap("sink", "count_by_key", {"key": "nope"}), 400, "not one of the input fields"),
        (Swap("sink", "nope"), 400, "unknown operator"),
        (Swap("sink", "os:system"), 400, "would import code"),
        (Swap("sink", "sequence_check", {"bogus": 1}), 400, "no argument 'bogus'"),
        (Insert("mid", "identity", "sink", "source"), 400, "no stream from 'sink'"),
        (Insert("sink", "identity", "source", "sink"), 400, "already has a node"),
        (Remove("sink"), 400, "one of each"),
    ],
)
def test_bad_requests_are_refused_with_a_sentence(request_, status, words):
    t, phys = deployed(FORWARD)
    with pytest.raises(ReconfigError) as e:
        plan(request_, t, phys, HOSTS, 100)
    assert e.value.status == status and words in e.value.message, e.value.message


def test_swap_checks_argument_values_by_building_the_operator():
    t, phys = deployed(ADS)
    with pytest.raises(ReconfigError, match="exactly one of"):
        plan(Swap("filter", "filter", {"field": "event_type", "equals": "a", "values": ["b"]}),
             t, phys, HOSTS, 100)  # fmt: skip


def test_a_plan_with_draining_workers_left_is_refused():
    t, phys = deployed(FORWARD)
    p = plan(Scale("sink", 2), t, phys, HOSTS, 100)
    down = plan(Scale("sink", 1), p.topology, p.final, HOSTS, 100)
    with pytest.raises(ReconfigError, match="draining") as e:
        plan(Scale("sink", 3), down.topology, down.physical, HOSTS, 100)
    assert e.value.status == 409


@pytest.mark.parametrize(
    ("kind", "body", "words"),
    [
        ("scale", [], "JSON object"),
        ("scale", {"node": "sink"}, "'parallelism' is missing"),
        ("scale", {"node": "sink", "parallelism": 0}, "from 1 to"),
        ("scale", {"node": "sink", "parallelism": True}, "integer"),
        ("scale", {"node": 3, "parallelism": 2}, "node name"),
        ("scale", {"node": "sink", "parallelism": 2, "x": 1}, "unknown field(s) x"),
        ("route", {"stream": 1.5, "policy": "shuffle"}, "stream ID"),
        ("route", {"stream": 1, "policy": "fields", "fields": "word"}, "list of field names"),
        ("swap", {"node": "sink", "operator": "identity", "args": [1]}, "JSON object"),
        ("teleport", {}, "unknown reconfiguration"),
    ],
)
def test_parse_request_says_what_is_wrong(kind, body, words):
    with pytest.raises(ReconfigError) as e:
        parse_request(kind, body)
    assert words in e.value.message


def test_parse_request_builds_each_kind():
    assert parse_request("scale", {"node": "a", "parallelism": 3}) == Scale("a", 3)
    assert parse_request("route", {"stream": "a->b", "policy": "fields", "fields": ["k"]}) == (
        Reroute("a->b", "fields", ("k",))
    )
    assert parse_request("swap", {"node": "a", "operator": "identity"}) == Swap("a", "identity")
    assert parse_request("remove", {"node": "a"}) == Remove("a")
    ins = parse_request("insert", {"node": "m", "operator": "identity", "from": "a", "to": "b"})
    assert (ins.src, ins.dst, ins.parallelism, ins.grouping) == ("a", "b", 1, "shuffle")


def test_a_scale_after_a_region_failover_keeps_each_regions_generation():
    """Two independent pipelines; the second was rolled back as generation 1 from epoch 3.
    A scale of the first keeps every worker in its own region's generation (the core
    would otherwise roll the first pipeline back to the start), and a worker it adds
    starts empty in its node's region."""
    from typhoon.checkpoint.regions import roll_back

    t, phys = deployed(
        """
name: two
spouts:
  - {id: a_src, operator: sequence_source}
  - {id: b_src, operator: sequence_source}
bolts:
  - {id: a_sink, operator: sequence_check}
  - {id: b_sink, operator: sequence_check}
streams:
  - {from: a_src, to: a_sink, grouping: shuffle}
  - {from: b_src, to: b_sink, grouping: shuffle}
"""
    )
    b = [w.worker_id for w in phys.workers if w.node.startswith("b_")]
    rolled = roll_back(phys, b, 1, 3)
    p = plan(Scale("a_sink", 2), t, rolled, HOSTS, 100)
    (added,) = p.added
    for physical in (p.physical, p.final):
        for w in physical.workers:
            want = (1, 3) if w.worker_id in b else (0, None)
            assert physical.generation_of(w.worker_id) == want, (w, physical.worker_generations)
    assert p.final.generation_of(added) == (0, None)
