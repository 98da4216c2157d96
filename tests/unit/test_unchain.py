"""Live unchaining: the plan (pure), the rules it adds, and a chain's process in memory
switching an inner edge to the network and back without reordering or losing a row."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fakeflows import FakeFabric, Packet, line_cluster
from test_framework import Recorder

from controller.rules.flows import compile_default_rules, compile_rules
from typhoon.reconfig import ReconfigError, Scale, parse_request, plan
from typhoon.reconfig.requests import Chain, Unchain
from typhoon.runtime.chain import ChainWorker
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound
from typhoon.runtime.worker import Worker
from typhoon.topology import load_topology, schedule
from typhoon.topology.chaining import (
    ChainedError,
    by_call,
    chain_groups,
    inner_edges,
    observed_calls,
    refuse_observing,
)
from typhoon.wire import Control, ControlTuple, mac_str, worker_mac

ROOT = Path(__file__).resolve().parents[2]
APP = 7


def wordcount(count: int = 40):
    t = load_topology(ROOT / "topologies" / "wordcount_chained.yaml")
    t = dataclasses.replace(t, nodes=dict(t.nodes))
    t.nodes["source"] = dataclasses.replace(
        t.nodes["source"], args={**t.nodes["source"].args, "count": count}
    )
    return t, schedule(t, ["h1"], APP, 100)


def ids(phys, node: str) -> list[int]:
    return [w.worker_id for w in phys.of_node(node)]


# ----- requests and plans -------------------------------------------------------------------


def test_unchain_and_chain_requests_parse():
    assert parse_request("unchain", {"node": "split"}) == Unchain("split")
    assert parse_request("chain", {"node": "split", "worker": 3}) == Chain("split", 3)
    for body, text in (({}, "'node' is missing"), ({"node": "s", "worker": 0}, "worker ID")):
        with pytest.raises(ReconfigError, match=text):
            parse_request("unchain", body)
    with pytest.raises(ReconfigError, match="unknown field"):
        parse_request("chain", {"node": "s", "parallelism": 2})


def test_unchain_writes_the_receivers_then_tells_the_senders():
    t, phys = wordcount()
    src, split = ids(phys, "source"), ids(phys, "split")
    p = plan(Unchain("split"), t, phys, ["h1"], 100)
    assert p.topology is t and not p.added and not p.removed
    assert p.physical.unchained == sorted(split) and p.physical.version == phys.version + 1
    assert p.physical.workers == phys.workers
    assert [s.action for s in p.steps] == ["write", "wait_rules", "control", "commit"]
    (ctl,) = [s for s in p.steps if s.action == "control"]
    assert ctl.control == "CHAIN"
    assert ctl.bodies == [
        (a, {"receiver": b, "chained": False}) for a, b in zip(src, split, strict=True)
    ]
    # chaining again: make before break, the rules go only after the senders acked
    back = plan(Chain("source"), t, p.physical, ["h1"], 100)
    assert back.physical.unchained == []
    assert [s.action for s in back.steps] == [
        "keep_rules", "write", "wait_rules", "control", "commit", "drop_rules", "wait_rules"
    ]  # fmt: skip
    assert [b for _, b in back.steps[3].bodies] == [{"receiver": b, "chained": True} for b in split]


def test_one_instance_and_the_refusals():
    t, phys = wordcount()
    src, split = ids(phys, "source"), ids(phys, "split")
    one = plan(Unchain("split", split[1]), t, phys, ["h1"], 100)
    assert one.physical.unchained == [split[1]]
    assert inner_edges(t, phys, "split", split[1]) == [(src[1], split[1])]
    cases = [
        (Unchain("count"), phys, 409, "runs in no chain process"),
        (Unchain("nope"), phys, 404, "no node 'nope'"),
        (Unchain("split", src[0]), phys, 404, "is not a worker of 'split'"),
        (Chain("split"), phys, 409, "function calls already"),
        (Unchain("split", split[1]), one.physical, 409, "on the network already"),
    ]
    for request, p, status, text in cases:
        with pytest.raises(ReconfigError, match=text) as e:
            plan(request, t, p, ["h1"], 100)
        assert e.value.status == status
    # the rest of the node still unchains; an exited sender is left alone
    rest = plan(Unchain("split"), t, one.physical, ["h1"], 100, exited={src[1]})
    assert rest.physical.unchained == sorted(split)
    assert [b["receiver"] for _, b in rest.steps[2].bodies] == [split[0]]


def test_other_updates_keep_the_unchained_edges():
    t, phys = wordcount()
    off = plan(Unchain("split"), t, phys, ["h1"], 100).physical
    p = plan(Scale("count", 5), t, off, ["h1"], 100)
    assert p.physical.unchained == off.unchained == p.final.unchained
    assert p.physical.to_dict()["unchained"] == off.unchained
    assert type(off).from_dict(off.to_dict()).unchained == off.unchained
    assert "unchained" not in phys.to_dict()  # nothing written when nothing is unchained


def test_an_unchained_edge_gets_its_rules_and_the_debugger_may_watch_it():
    t, phys = wordcount()
    cluster = line_cluster(1)
    src, split = phys.of_node("source")[0], phys.of_node("split")[0]

    def delivered(p) -> bool:
        rules = compile_rules(t, p, cluster)
        fabric = FakeFabric(cluster, {h: r | compile_default_rules() for h, r in rules.items()})
        pkt = Packet(src.port, mac_str(worker_mac(APP, src.worker_id)),
                     mac_str(worker_mac(APP, split.worker_id)))  # fmt: skip
        return bool(fabric.send("h1", pkt).delivered)

    assert not delivered(phys)  # a function call: no rule
    with pytest.raises(ChainedError):
        refuse_observing(t, phys, split.worker_id, "in")
    off = plan(Unchain("split", split.worker_id), t, phys, ["h1"], 100).physical
    assert delivered(off)
    assert split.worker_id not in by_call(t, off)
    assert chain_groups(t, off) == chain_groups(t, phys)  # the processes stay
    assert observed_calls(t, off, split.worker_id, "both") == []
    refuse_observing(t, off, split.worker_id, "in")
    assert observed_calls(t, phys, src.worker_id, "out") == [(src.worker_id, split.worker_id)]


# ----- a chain's process in memory ----------------------------------------------------------


class Net:
    """Frames between in-memory transports; ``hold`` keeps them in flight."""

    def __init__(self) -> None:
        self.ports: dict[int, Loop] = {}
        self.hold = False
        self.flight: list[tuple[int, Inbound]] = []

    def release(self) -> None:
        for dst, item in self.flight:
            self.ports[dst].inbox.append(item)
        self.flight = []


class Loop(Recorder):
    """A transport that counts frames per link like the sdn one (one send = one frame)."""

    def __init__(self, net: Net, wid: int) -> None:
        super().__init__()
        self.net, self.wid = net, wid
        self.inbox: list[Inbound | ControlTuple] = []
        self.sent_n: dict[int, int] = {}
        self.got_n: dict[int, int] = {}
        net.ports[wid] = self

    def send(self, dst, stream, payloads):
        super().send(dst, stream, payloads)
        if dst in self.net.ports:
            self.sent_n[dst] = self.sent_n.get(dst, 0) + 1
            item = (dst, Inbound(self.wid, stream, list(payloads)))
            if self.net.hold:
                self.net.flight.append(item)
            else:
                self.net.ports[dst].inbox.append(item[1])

    def poll(self, timeout):
        items, self.inbox = self.inbox, []
        for item in items:
            if isinstance(item, Inbound):
                self.got_n[item.src] = self.got_n.get(item.src, 0) + 1
        return items

    def frames_sent(self, dst):
        return self.sent_n.get(dst, 0)

    def frames_delivered(self, src):
        return self.got_n.get(src, 0)

    def frames_confirmed(self, dst):
        """Confirmed once delivered (the sdn transport waits for the receiver's grant)."""
        return self.net.ports[dst].got_n.get(self.wid, 0) if dst in self.net.ports else 0


def chain(t, phys, transport):
    head = phys.of_node("source")[0].worker_id
    specs = [WorkerSpec(t, phys, w, batch_size=4) for w in chain_groups(t, phys)[head]]
    return ChainWorker(specs, Worker, transport)


class Clock:
    """10 ms more at every turn: a paced source emits a few rows per turn."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def turns(cw: ChainWorker, n: int, clock: Clock) -> None:
    for _ in range(n):
        clock.t += 0.01
        cw._turn(clock)


def paced(cw: ChainWorker) -> None:
    """Start the source at 1000 sentences/s: about 10 per turn."""
    cw.members[0].fw.now = 0.0  # the test's clock (Clock)
    cw.members[0].fw.control(ControlTuple(Control.INPUT_RATE, {"rate": 1000.0}))
    cw.members[0].fw.control(ControlTuple(Control.ACTIVATE, {}))


def per_receiver(rec) -> dict[int, list[str]]:
    """The words split sent each count worker, in order (batches to different
    receivers may interleave differently)."""
    out: dict[int, list[str]] = {}
    for _, dst, row in rec.tuples(stream=2):
        out.setdefault(dst, []).append(row[0])
    return out


def words_out(cw: ChainWorker, rec, clock: Clock) -> dict[int, list[str]]:
    paced(cw)
    for _ in range(1000):
        turns(cw, 1, clock)
        if all(m.fw.done for m in cw.members):
            return per_receiver(rec)
    raise AssertionError("the chain did not finish")


def acks(io) -> list[int]:
    return [ct.body["request_id"] for ct in io.replies if ct.body["metrics"].get("ack") == "CHAIN"]


def test_an_edge_goes_on_the_network_and_back_in_order_with_nothing_lost():
    t, phys = wordcount(count=400)
    plain = {}
    cw = chain(t, phys, lambda s: plain.setdefault(s.worker_id, Recorder()))
    want = words_out(cw, plain[cw.members[1].fw.worker_id], Clock())
    clock = Clock()

    net = Net()
    ios: dict[int, Loop] = {}
    cw = chain(t, phys, lambda s: ios.setdefault(s.worker_id, Loop(net, s.worker_id)))
    src, split = (m.fw.worker_id for m in cw.members)
    a = ios[src]
    paced(cw)
    turns(cw, 3, clock)
    assert a.sent_n == {} and cw.members[0].fw.sent_to  # chained, and rows went
    assert not cw.members[0].fw.done  # chained: function calls only
    a.inbox.append(ControlTuple(Control.CHAIN, {"version": 5, "receiver": split, "chained": False}))
    turns(cw, 1, clock)
    assert acks(a) == [5] and cw.links[0].peers == {} and cw.members[0].fw.chained == {}
    net.hold = True  # frames in flight while the sender is told to call again
    turns(cw, 3, clock)
    assert a.sent_n[split] > 0 and net.flight
    a.inbox.append(ControlTuple(Control.CHAIN, {"version": 6, "receiver": split, "chained": True}))
    turns(cw, 2, clock)
    assert acks(a) == [5] and cw.rechaining  # the receiver lacks frames: no call yet
    assert cw.links[0].peers == {}
    # rolled back (the update timed out): the waiting re-chain is dropped, then asked again
    a.inbox.append(ControlTuple(Control.CHAIN, {"version": 7, "receiver": split, "chained": False}))
    turns(cw, 1, clock)
    assert acks(a) == [5, 7] and not cw.rechaining
    a.inbox.append(ControlTuple(Control.CHAIN, {"version": 6, "receiver": split, "chained": True}))
    turns(cw, 1, clock)
    assert cw.rechaining and cw.links[0].peers == {}
    net.hold = False
    net.release()
    turns(cw, 1, clock)
    assert acks(a) == [5, 7, 6] and split in cw.links[0].peers and not cw.rechaining
    sent = a.sent_n[split]
    for _ in range(1000):
        turns(cw, 1, clock)
        if all(m.fw.done for m in cw.members):
            break
    assert a.sent_n[split] == sent  # called again: no frame after the switch
    assert per_receiver(ios[split]) == want  # same words, same order, none lost or repeated
    fws = [m.fw for m in cw.members]
    assert fws[0].sent_to == {(split, 1): 200} and fws[1].received_from == {(src, 1): 200}


def test_a_chain_starts_unchained_when_its_spec_says_so_and_refuses_without_counts():
    t, phys = wordcount()
    split = phys.of_node("split")[0].worker_id
    off = plan(Unchain("split", split), t, phys, ["h1"], 100).physical
    net = Net()
    cw = chain(t, off, lambda s: Loop(net, s.worker_id))
    assert cw.links[0].peers == {}
    # a transport that cannot count its frames cannot unchain: counted, never acked
    recs: dict[int, Recorder] = {}
    cw = chain(t, phys, lambda s: recs.setdefault(s.worker_id, Recorder()))
    src = cw.members[0].fw.worker_id
    body = {"version": 1, "receiver": split, "chained": False}
    clock = Clock()
    recs[src].poll = lambda timeout: [ControlTuple(Control.CHAIN, body)]
    turns(cw, 1, clock)
    assert recs[src].stats.drops == {"unchain_unsupported": 1} and acks(recs[src]) == []
    assert split in cw.links[0].peers
    body["receiver"] = src  # not the next worker of the process
    turns(cw, 1, clock)
    assert recs[src].stats.drops["unexpected_control"] == 1


def test_the_debugger_plans_a_session_on_an_unchained_edge():
    from controller.debugging.debugger import DebugError, DebugSessions, Limits

    t, phys = wordcount()
    split = phys.of_node("split")[0]
    sessions = DebugSessions(Limits())
    request = {"worker": split.worker_id, "direction": "in"}
    with pytest.raises(DebugError) as e:  # the app unchains first (apps/live_debugger.py)
        sessions.plan("wc", t, phys, split, 1, set(), request, "s1", "k", 0.0)
    assert e.value.status == 409
    off = plan(Unchain("split", split.worker_id), t, phys, ["h1"], 100).physical
    s = sessions.plan("wc", t, off, split, 1, set(), request, "s2", "k", 0.0)
    assert s.spec.direction == "in" and s.spec.worker == split.worker_id


# ----- scaling a chained node scales its chain ------------------------------------------------

BOLT_CHAIN = """
name: bc
spouts:
  - {id: source, operator: sentence_source, args: {count: 100}, parallelism: 1}
bolts:
  - {id: split, operator: split_words, parallelism: 2}
  - {id: upper, operator: identity, parallelism: 2}
  - {id: count, operator: count_by_key, args: {key: word}, parallelism: 2}
streams:
  - {from: source, to: split, grouping: shuffle}
  - {from: split, to: upper, grouping: forward}
  - {from: upper, to: count, grouping: {type: fields, fields: [word]}}
"""


def test_scaling_a_chained_node_scales_its_chain_in_whole_processes():
    from typhoon.reconfig.chains import check_groups
    from typhoon.topology import load_topology_text

    t = load_topology_text(BOLT_CHAIN, "bc.yaml")
    phys = schedule(t, ["h1"], APP, 100)
    before = chain_groups(t, phys)
    assert len(before) == 2
    up = plan(Scale("upper", 3), t, phys, ["h1"], 100)
    assert {n: up.topology.nodes[n].parallelism for n in ("split", "upper")} == {
        "split": 3,
        "upper": 3,
    }
    assert len(up.added) == 2  # one new instance: split[2] and upper[2]
    after = chain_groups(up.topology, up.final)
    assert {h: ws for h, ws in after.items() if h in before} == before
    (new,) = [ws for h, ws in after.items() if h not in before]
    assert sorted(new) == up.added  # one new process
    down = plan(Scale("split", 1), t, phys, ["h1"], 100)
    assert sorted(down.removed) == sorted(before[max(before)])  # a whole instance drains
    # a process that would lose a member, or a running worker joining one, is refused
    split1 = phys.of_node("split")[1].worker_id
    torn = dataclasses.replace(phys, workers=[w for w in phys.workers if w.worker_id != split1])
    with pytest.raises(ReconfigError, match="split or form a chain") as e:
        check_groups((t, phys), (t, torn))
    assert e.value.status == 409


def test_tcp_runs_unchaining_and_the_scale_of_a_chain():
    """tcp runs them too (tests/unit/test_tcp_unchain.py, tests/runtime/test_unchain_tcp.py)."""
    from typhoon.tcp_requests import tcp_refusal
    from typhoon.topology import load_topology_text

    t = load_topology_text(BOLT_CHAIN, "bc.yaml")
    for request in (Scale("upper", 3), Unchain("upper"), Chain("upper"), Scale("count", 3)):
        assert tcp_refusal(t, request) is None, request


# ----- through the executor -------------------------------------------------------------------


def test_the_executor_unchains_and_undoes_a_chain_that_never_confirms(fwd):
    from test_reconfig_executor import run

    c, m, FakeCore = fwd
    core = FakeCore(c)
    core.sleep(0)
    rec = run(core, m, Unchain("sink"))
    assert rec.state == "done", rec.to_dict()
    assert core.sent == [(1, "CHAIN", {"receiver": 2, "chained": False, "version": 1000})]
    assert c.get_physical("fwd").unchained == [2]
    core.silent = {1}  # the sender never confirms it caught up
    rec = run(core, m, Chain("sink"), timeout=0.2)
    d = rec.to_dict()
    assert rec.state == "rolled_back" and "did not confirm CHAIN" in d["error"], d
    assert [r["action"] for r in d["rollback"]] == [
        "undo CHAIN", "undo write", "undo kept_rules"
    ]  # fmt: skip
    assert core.sent[-1][1:] == ("CHAIN", {"receiver": 2, "chained": False,
                                           "version": core.sent[-1][2]["version"]})  # fmt: skip
    assert c.get_physical("fwd").unchained == [2] and core.kept == {}


def test_the_cli_verbs_send_unchain_and_chain():
    from typhoon_cli import build_parser
    from typhoon_cli.ctl import _request

    parser = build_parser()
    assert _request(parser.parse_args(["unchain", "wc", "split"])) == (
        "unchain",
        {"node": "split"},
    )
    args = parser.parse_args(["chain", "wc", "split", "--worker", "3", "--no-wait"])
    assert _request(args) == ("chain", {"node": "split", "worker": 3})
