"""Live unchaining on tcp, the pure parts: what the tcp runner accepts on a chained
topology, and its executor (typhoon/tcp_reconfig.py) running the sdn plans of
``unchain``, ``chain``, a direct route of a chained edge and the scale of a chained
node against a fake tcp cluster (the real processes: tests/runtime/test_unchain_tcp.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tcp_reconfig import FakeCluster

from typhoon.reconfig import Reroute, Scale
from typhoon.reconfig.requests import Chain, Unchain
from typhoon.tcp_reconfig import Rescaler
from typhoon.tcp_requests import parse_chain_option, tcp_refusal
from typhoon.topology import load_topology_text
from typhoon.topology.chaining import chain_groups
from typhoon_cli import UsageError, build_parser, cmd_run, tcp_chain_verbs

CHAINED = """
name: ch
spouts:
  - {id: source, operator: sentence_source, args: {count: 100}}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: upper, operator: identity, parallelism: 2}
  - {id: count, operator: running_count, parallelism: 2, config: {max_parallelism: 64}}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: upper, grouping: forward}
  - {from: upper, to: count, grouping: {type: fields, fields: [word]}}
"""


def chained(text: str = CHAINED):
    return load_topology_text(text, "ch.yaml")


def ids(c: FakeCluster, node: str) -> list[int]:
    return [w.worker_id for w in c.physical.of_node(node)]


def chains_sent(c: FakeCluster) -> list[tuple[int, dict]]:
    return [(w, ct.body) for w, ct in c.inbox_log if ct.type.name == "CHAIN"]


def run(c: FakeCluster, request) -> dict:
    r = Rescaler(c)
    rec = r.request(request)
    assert r.turn(0.0) and rec.state == "done", rec.to_dict()
    return rec.to_dict()


def test_tcp_accepts_unchain_chain_a_chain_scale_and_a_direct_route_of_a_chained_edge():
    t = chained()
    for request in (
        Unchain("upper"),
        Chain("split", 3),
        Scale("upper", 3),
        Reroute("split->upper", "direct", ("word",), (("a", 1),)),
    ):
        assert tcp_refusal(t, request) is None, request


SPOUT_CHAIN = """
name: sc
spouts:
  - {id: source, operator: sentence_source, args: {count: 100}, parallelism: 2}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: count, operator: running_count, parallelism: 2}
streams:
  - {from: source, to: split, grouping: forward}
  - {from: split, to: count, grouping: {type: fields, fields: [word]}}
"""

UNKEYED_IN_CHAIN = """
name: uk
spouts:
  - {id: source, operator: sentence_source, args: {count: 100}}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: count, operator: count_by_key, args: {key: word}, parallelism: 2, stateful: true}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: count, grouping: forward}
"""


@pytest.mark.parametrize(
    ("text", "node", "words"),
    [
        (SPOUT_CHAIN, "split", "'source' is a spout"),
        (UNKEYED_IN_CHAIN, "split", "'count' keeps per-worker state that is not keyed"),
    ],
    ids=["spout_chain", "unkeyed_state_in_the_chain"],
)
def test_a_chain_scale_tcp_cannot_run_is_refused_in_one_sentence(text, node, words):
    sentence = tcp_refusal(chained(text), Scale(node, 3))
    assert sentence is not None and words in sentence, sentence
    assert sentence.count(". ") == 0 and "\n" not in sentence


def test_unchain_then_chain_sends_chain_to_the_senders_and_keeps_every_process():
    c = FakeCluster(chained())
    splits, uppers = ids(c, "split"), ids(c, "upper")
    groups = chain_groups(c.topology, c.physical)
    off = run(c, Unchain("upper"))
    assert c.physical.unchained == uppers and off["added"] == [] and off["removed"] == []
    assert [k for k, _ in c.log if k != "CHAIN"] == ["launch"] and c.log[0] == ("launch", [])
    assert chains_sent(c) == [
        (s, {"receiver": u, "chained": False, "version": i + 1})
        for i, (s, u) in enumerate(zip(splits, uppers, strict=True))
    ]
    c.inbox_log.clear()
    run(c, Chain("upper", uppers[1]))  # one chain instance
    assert c.physical.unchained == [uppers[0]]
    assert [(w, b["receiver"], b["chained"]) for w, b in chains_sent(c)] == [
        (splits[1], uppers[1], True)
    ]
    assert chain_groups(c.topology, c.physical) == groups  # the same processes throughout


def test_nothing_to_unchain_is_refused_and_the_run_goes_on():
    c = FakeCluster(chained())
    r = Rescaler(c)
    rec = r.request(Chain("upper"))
    assert r.turn(0.0) and rec.state == "refused"
    assert "function calls already" in rec.error and c.inbox_log == []


def test_a_direct_route_of_a_chained_edge_unchains_it_first_without_launching_anything():
    c = FakeCluster(chained())
    splits, uppers = ids(c, "split"), ids(c, "upper")
    rec = run(c, Reroute("split->upper", "direct", ("word",), (("a", 1),)))
    kinds = [k for k, _ in c.log if k != "METRIC_REQ"]
    # the unchaining's write sets the physical topology only: one launch (of nobody)
    assert [k for k in kinds if k == "launch"] == ["launch"] and ("launch", []) in c.log
    assert kinds.index("CHAIN") < kinds.index("ROUTING")
    assert sorted(w for w, _ in chains_sent(c)) == splits
    assert c.physical.unchained == uppers
    assert c.topology.streams[1].grouping.type == "direct"
    assert rec["added"] == [] and rec["removed"] == []


def test_scaling_a_chained_node_starts_a_whole_new_chain_instance():
    c = FakeCluster(chained())
    before = chain_groups(c.topology, c.physical)
    rec = run(c, Scale("upper", 3))
    added = rec["added"]
    assert [c.physical.by_id(w).node for w in added] == ["split", "upper"]
    assert ("launch", added) in c.log and chains_sent(c) == []
    after = chain_groups(c.topology, c.physical)
    assert {h: ws for h, ws in after.items() if h in before} == before
    assert after[added[0]] == added  # the new instance is one process


# ----- typhoon run --unchain / --chain -----------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "text", "want"),
    [
        ("unchain", "5:upper", (5.0, Unchain("upper"))),
        ("chain", "0.5:upper:4", (0.5, Chain("upper", 4))),
    ],
)
def test_chain_option(verb, text, want):
    assert parse_chain_option(text, verb) == want


@pytest.mark.parametrize("text", ["upper", "5:", "x:upper", "-1:upper", "5:upper:0", "5:upper:x"])
def test_a_malformed_chain_option_says_its_form(text):
    with pytest.raises(ValueError, match="AT:NODE or AT:NODE:WORKER"):
        parse_chain_option(text, "unchain")


def test_the_cli_checks_the_chain_verbs_before_the_run():
    t = chained()
    assert tcp_chain_verbs(t, ["1:upper"], ["2:split:3"]) == [
        (1.0, Unchain("upper")),
        (2.0, Chain("split", 3)),
    ]
    with pytest.raises(UsageError, match="'count' is not a node of a chain of 'ch'"):
        tcp_chain_verbs(t, [], ["2:count"])
    with pytest.raises(UsageError, match="--unchain '2'"):
        tcp_chain_verbs(t, ["2"], [])
    file = str(Path(__file__).resolve().parents[2] / "topologies" / "wordcount_chained.yaml")
    args = build_parser().parse_args(["run", file, "--transport", "sdn", "--unchain", "1:split"])
    with pytest.raises(UsageError, match="are for tcp runs"):
        cmd_run(args)
