"""Operator chaining: the plan (pure), the forward grouping, and a chain's process in memory."""

from __future__ import annotations

import pytest
from test_framework import Recorder

from typhoon.runtime.chain import ChainLinks, ChainWorker
from typhoon.runtime.policies import Router
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import EOS_STREAM, Inbound
from typhoon.runtime.worker import Worker
from typhoon.topology import TopologyError, load_topology_text, schedule
from typhoon.topology.chaining import (
    CHAINING_OFF,
    ChainedError,
    chain_groups,
    group_of,
    hosted_by,
    plan_chains,
    refuse_chained_edge,
)
from typhoon.topology.routing import routes_for, upstream_of
from typhoon.wire import Control, ControlTuple, decode_rows

CHAIN3 = """
name: c3
{config}
spouts:
  - id: source
    operator: sentence_source
    args: {{count: 50, seed: 3, words: 4, vocabulary: 20}}
    parallelism: 2
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: upper
    operator: identity
    parallelism: 2
    {upper_config}
  - id: count
    operator: count_by_key
    args: {{key: word}}
    parallelism: 3
streams:
  - from: source
    to: split
    grouping: forward
  - from: split
    to: upper
    grouping: forward
  - from: upper
    to: count
    grouping: {{type: fields, fields: [word]}}
"""


def topo(config: str = "", upper_config: str = ""):
    return load_topology_text(CHAIN3.format(config=config, upper_config=upper_config), "c.yaml")


def test_a_run_of_forward_edges_is_one_chain_head_first():
    assert plan_chains(topo()) == [["source", "split", "upper"]]


def test_chaining_false_on_the_topology_or_a_node_breaks_the_chain_there():
    assert plan_chains(topo(config="config: {chaining: false}")) == []
    assert plan_chains(topo(upper_config="config: {chaining: false}")) == [["source", "split"]]
    # the node's own setting goes over the topology's
    on = topo(config="config: {chaining: false}", upper_config="config: {chaining: true}")
    assert plan_chains(on) == []  # split is off (the topology's), so neither edge chains


def test_a_second_input_or_output_keeps_the_edge_on_the_network():
    text = CHAIN3.format(config="", upper_config="") + (
        "  - from: source\n    to: count\n    grouping: {type: fields, fields: [sentence]}\n"
    )
    t = load_topology_text(text.replace("args: {key: word}", "args: {key: word}"), "c.yaml")
    # source has two outputs now; split -> upper still chains
    assert plan_chains(t) == [["split", "upper"]]


def test_shuffle_and_local_or_shuffle_are_not_chained():
    t = load_topology_text(CHAIN3.format(config="", upper_config="").replace("forward", "shuffle"))
    assert plan_chains(t) == []


def test_forward_with_unequal_parallelism_is_refused_at_load_time():
    text = CHAIN3.format(config="", upper_config="").replace(
        "  - id: split\n    operator: split_words\n    parallelism: 2",
        "  - id: split\n    operator: split_words\n    parallelism: 3",
    )
    with pytest.raises(TopologyError, match="parallelism differs \\(2 and 3\\)"):
        load_topology_text(text, "c.yaml")


def test_forward_is_not_key_routed():
    text = CHAIN3.format(config="", upper_config="").replace(
        "grouping: {type: fields, fields: [word]}", "grouping: forward"
    )
    text = text.replace("parallelism: 3", "parallelism: 2")
    # count_by_key keeps keyed state only when key-routed: behind forward it counts per worker
    assert not load_topology_text(text, "c.yaml").nodes["count"].keyed
    assert plan_chains(load_topology_text(text, "c.yaml")) == [
        ["source", "split", "upper", "count"]
    ]


def test_chaining_must_be_a_boolean():
    with pytest.raises(TopologyError, match="chaining"):
        topo(upper_config="config: {chaining: 3}")


def test_forward_routes_pair_worker_i_with_worker_i():
    t = topo(config="config: {chaining: false}")
    phys = schedule(t, ["h1"], 5)
    for i, w in enumerate(phys.of_node("source")):
        (route,) = routes_for(t, phys, w.worker_id)
        split = phys.of_node("split")[i]
        assert route.next_hops == [split.worker_id]
        assert upstream_of(t, phys, split.worker_id) == {1: [w.worker_id]}
        assert Router(route).select(["a b"]) == split.worker_id


def test_one_process_per_chain_instance_on_one_host():
    t = topo()
    phys = schedule(t, ["h1"], 5)
    src, split, upper = (phys.of_node(n) for n in ("source", "split", "upper"))
    groups = chain_groups(t, phys)
    assert groups == {
        src[i].worker_id: [src[i].worker_id, split[i].worker_id, upper[i].worker_id]
        for i in range(2)
    }
    assert hosted_by(t, phys) == {
        w.worker_id: src[i].worker_id for i in range(2) for w in (split[i], upper[i])
    }
    count = phys.of_node("count")[0].worker_id
    assert group_of(t, phys, count) == [count]
    assert group_of(t, phys, upper[1].worker_id) == groups[src[1].worker_id]


def test_an_instance_split_over_hosts_is_not_grouped():
    t = topo()
    phys = schedule(t, ["h1", "h2", "h3", "h4"], 5)  # 9 workers, 3 per host: chains cut
    for ws in chain_groups(t, phys).values():
        assert len({phys.by_id(w).host for w in ws}) == 1
    assert len(chain_groups(t, phys)) < 2


def test_refusal_is_one_sentence_naming_the_switch():
    t = topo()
    with pytest.raises(ChainedError, match="'split' -> 'upper'") as e:
        refuse_chained_edge(t, "split", "upper", "the live debugger")
    msg = str(e.value)
    assert CHAINING_OFF in msg and msg.count(". ") == 0
    refuse_chained_edge(t, "upper", "count", "the live debugger")  # not chained: fine


# ----- a chain's process, in memory -------------------------------------------------------


def chain_of(t, head_index: int = 0, **spec):
    phys = schedule(t, ["h1"], 5)
    head = phys.of_node("source")[head_index].worker_id
    ids = chain_groups(t, phys)[head]
    specs = [WorkerSpec(t, phys, w, **spec) for w in ids]
    recorders: dict[int, Recorder] = {}

    def transport(s):
        recorders[s.worker_id] = Recorder()
        return recorders[s.worker_id]

    return ChainWorker(specs, Worker, transport), recorders, phys, ids


def run_chain(cw: ChainWorker) -> None:
    cw.members[0].fw.control(ControlTuple(Control.ACTIVATE, {}))
    for _ in range(100):
        cw._turn(lambda: 0.0)
        if all(m.fw.done for m in cw.members):
            return
    raise AssertionError("the chain did not finish")


def test_a_chain_passes_rows_by_call_and_counts_per_node():
    t = topo()
    cw, rec, phys, (src, split, upper) = chain_of(t)
    run_chain(cw)
    # nothing went over a transport inside the chain: only upper sent (data and EOS)
    assert rec[src].sent == [] and rec[split].sent == []
    words = [row[0] for _, _, row in rec[upper].tuples(stream=3)]
    sentences = 25  # source[0] of 2 emits sentences 0, 2, 4, ...
    assert len(words) == sentences * 4
    count_ids = {w.worker_id for w in phys.of_node("count")}
    eos = [d for kind, d, s, _ in rec[upper].sent if s == EOS_STREAM]
    assert sorted(eos) == sorted(count_ids)
    assert rec[upper].sent[-1][2] == EOS_STREAM  # end of stream after the data
    fws = {m.fw.worker_id: m.fw for m in cw.members}
    assert fws[src].sent_to == {(split, 1): sentences}
    assert fws[split].received_from == {(src, 1): sentences}
    assert fws[split].sent_to == {(upper, 2): sentences * 4}
    assert fws[upper].received_from == {(split, 2): sentences * 4}
    assert fws[upper].tuples_in == {2: sentences * 4}


def test_under_a_guarantee_entries_cross_the_chain_as_bytes(tmp_path):
    t = topo(
        config=(
            "config: {guarantee: at_least_once, "
            f"checkpoint_store: 'file://{tmp_path}', checkpoint_interval_ms: 1}}"
        )
    )
    cw, rec, phys, (src, split, upper) = chain_of(t)
    assert all(m.fw.chained == {} for m in cw.members)  # no rows by reference
    assert cw.links[0].peers and cw.links[1].peers
    run_chain(cw)
    assert rec[src].sent == [] and rec[split].sent == []
    assert len(rec[upper].tuples(stream=3)) == 100


def test_chain_links_send_outside_the_chain_to_the_transport():
    inner = Recorder()
    got: list[Inbound] = []

    class Peer:
        def deliver(self, item):
            got.append(item)

    links = ChainLinks(inner, 7)
    links.peers[8] = Peer()
    links.send(8, 1, [b"x"])
    links.send(9, 1, [b"y"])
    assert [(i.src, i.stream, i.payloads) for i in got] == [(7, 1, [b"x"])]
    assert inner.sent == [("unicast", 9, 1, [b"y"])]
    assert links.settle([8, 9]) == [] and inner.settled == [[9]]
    links.on_urgent = print  # set on the transport it wraps
    assert inner.on_urgent is print
    decode_rows  # noqa: B018 - imported for Recorder.tuples


# ----- what needs an edge on the network is refused on a chained one ----------------------


def test_a_chain_from_a_spout_is_not_scaled_and_the_other_updates_plan():
    from typhoon.reconfig import Move, ReconfigError, Reroute, Scale, Swap, plan

    t = topo()
    phys = schedule(t, ["h1", "h2"], 5, 100)
    split0 = phys.of_node("split")[0].worker_id
    # scaling a chained node scales its whole chain, which here starts at a spout
    with pytest.raises(ReconfigError, match="'source' is a spout") as e:
        plan(Scale("split", 3), t, phys, ["h1", "h2"], 100)
    assert e.value.status == 409
    # move and route unchain what they need first (tests/unit/test_chain_ops.py); a swap
    # runs in place (tests/unit/test_swap_in_place.py)
    swap = plan(Swap("upper", "busy", {"cost_us": 1}), t, phys, ["h1", "h2"], 100)
    assert swap.steps[2].control == "SWAP" and not swap.added
    # count is not chained: scaling it plans (the chains keep their processes)
    assert plan(Scale("count", 4), t, phys, ["h1", "h2"], 100).added
    assert plan(Move(split0, "h2"), t, phys, ["h1", "h2"], 100).added
    assert plan(Reroute("split->upper", "shuffle"), t, phys, ["h1", "h2"], 100).steps[3].control
    # with chaining off the same scale of a forward node fails at the forward rule instead
    off = topo(config="config: {chaining: false}")
    phys_off = schedule(off, ["h1", "h2"], 5, 100)
    with pytest.raises(ReconfigError, match="parallelism differs"):
        plan(Scale("split", 3), off, phys_off, ["h1", "h2"], 100)
    assert plan(Reroute("split->upper", "shuffle"), off, phys_off, ["h1", "h2"], 100)


def test_an_update_that_would_form_a_chain_keeps_the_running_processes_apart():
    from typhoon.reconfig import Reroute, plan

    t = load_topology_text(CHAIN3.format(config="", upper_config="").replace("forward", "shuffle"))
    phys = schedule(t, ["h1"], 5, 100)
    p = plan(Reroute("split->upper", "forward"), t, phys, ["h1"], 100)
    # split -> upper is chainable now, but its running workers stay in their processes
    assert chain_groups(p.topology, p.final) == {}
    assert sorted(p.final.kept_chains) == [[w] for w in (3, 4, 5, 6)]
    assert not hosted_by(p.topology, p.final)  # so its edges keep their rules


def test_the_live_debugger_refuses_a_chained_edge():
    from controller.debugging.debugger import DebugError, DebugSessions, Limits

    t = topo()
    phys = schedule(t, ["h1"], 5, 100)
    sessions = DebugSessions(Limits())
    split = phys.of_node("split")[0]
    for direction in ("in", "out", "both"):
        with pytest.raises(DebugError) as e:
            sessions.plan("c3", t, phys, split, 1, set(), {"worker": split.worker_id,
                          "direction": direction}, "s1", "k", 0.0)  # fmt: skip
        assert e.value.status == 409 and CHAINING_OFF in str(e.value), direction
    # upper's output goes to count over the network: watching it is fine
    upper = phys.of_node("upper")[0]
    s = sessions.plan("c3", t, phys, upper, 1, set(), {"worker": upper.worker_id}, "s2", "k", 0.0)
    assert s.spec.direction == "out"


def test_a_member_waiting_lets_the_later_ones_take_input_and_a_drained_one_leaves():
    """After a member left its process (typhoon.reconfig.chains), a member may send over
    the network to any later one: waiting in its transport, it lets each of them (not
    those it calls) take its input.  A drained member closes its transport once every
    sender's end of stream is in; then nothing of the process touches it again."""
    t = topo()
    cw, rec, phys, (src, split, upper) = chain_of(t)
    polled: list[int] = []
    for wid, r in rec.items():
        r.poll = lambda timeout, wid=wid, poll=r.poll: polled.append(wid) or poll(timeout)
    cw._serve_next(0)
    assert polled == [upper]  # source calls split: only upper is served
    closed: list[int] = []
    for wid, r in rec.items():
        r.linger = lambda: None
        r.close = lambda wid=wid: closed.append(wid)
    fw = cw.members[1].fw
    fw.done, fw.draining, fw.pending_upstream = True, True, {src}
    cw._close_drained()
    assert closed == [] and cw.left == set()  # source's end of stream is not in yet
    fw.pending_upstream = set()
    cw._close_drained()
    assert closed == [split] and cw.left == {1}
    polled.clear()
    cw._serve_next(0)
    cw._take(1, lambda: 0.0)
    assert polled == [upper]
