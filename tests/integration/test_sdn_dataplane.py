"""The SDN data plane end to end: Mininet bridges, real OVS, the Ryu controller, agents, workers.

One emulated 3-host cluster (full mesh) serves the whole module; each test
submits its own application and kills it at the end.
"""

from __future__ import annotations

import copy
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from flowdump import dump_flows
from harness import emulated_cluster, wait

from controller.rules.cookies import RuleKind, parse_cookie
from controller.rules.flows import compile_default_rules, compile_rules
from mininet_env.run import EmulatedCluster
from typhoon import wire
from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report, read_worker_reports
from typhoon.topology import load_topology, load_topology_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(tmp_path_factory.mktemp("sdn"), "b", timeout=300) as c:
        yield c


def topo(name: str, text: str | None = None, file: str | None = None, **args):
    """A topology from a file or text, renamed, with ``node.arg`` overrides."""
    t = load_topology(ROOT / "topologies" / file) if file else load_topology_text(text, name)
    t = copy.deepcopy(t)
    t.name = name
    for key, value in args.items():
        node, arg = key.split("__")
        t.nodes[node].args[arg] = value
    return t


def bridge_of(c: EmulatedCluster, host: str) -> str:
    return c.options.plan.bridge(int(host[1:]))


def counter_after(c: EmulatedCluster, name: str, wid: int, after: float, key="out"):
    """(time, total tuples out/in) of a worker from a METRIC_RESP newer than ``after``."""

    def fresh():
        m = c.coordinator.get_metrics(name).get(wid)
        return m if m and m["time"] > after else None

    m = wait(fresh, 10, f"fresh metrics of worker {wid}")
    return m["time"], sum(v for k, v in m[key].items() if k != "0")


def rate(c: EmulatedCluster, name: str, wid: int, seconds: float = 1.0, key="out") -> float:
    t0, n0 = counter_after(c, name, wid, time.time())
    time.sleep(seconds)
    t1, n1 = counter_after(c, name, wid, time.time())
    return (n1 - n0) / (t1 - t0)


def until(measure, ok, what: str, timeout: float = 10.0):
    """Measure until ``ok(value)``; fail with the values seen after ``timeout``."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        seen.append(measure())
        if ok(seen[-1]):
            return seen[-1]
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not in effect after {timeout:g} s, measured {seen}")


def inject(bridge: str, in_port: int, frame: bytes) -> None:
    """Put a frame into the bridge as if it arrived on ``in_port`` (then through table 0)."""
    subprocess.run(
        [
            "ovs-ofctl",
            "-O",
            "OpenFlow13",
            "packet-out",
            bridge,
            f"in_port={in_port} packet={frame.hex()} actions=table",
        ],
        check=True,
        capture_output=True,
        timeout=10,
    )


# ----- correctness -------------------------------------------------------------------------


WORDCOUNT_CHECKED = (ROOT / "topologies" / "wordcount.yaml").read_text().replace(
    "streams:\n",
    "  - id: check\n    operator: key_origins\n    args: {key: key, count: count}\nstreams:\n",
    1,
) + ("  - from: count\n    to: check\n    grouping: global\n")


def test_wordcount_on_three_hosts_equals_reference(cluster):
    """wordcount.yaml with a key_origins sink behind count: besides the report's merge
    of the workers' totals, what count emitted downstream is checked, and where from."""
    t = topo("wc-sdn", text=WORDCOUNT_CHECKED, source__count=30000)
    report = cluster.run(t)
    ref = Counter(
        w
        for s in generate_sentences(30000, seed=7, words=8, vocabulary_size=500)
        for w in s.split()
    )
    assert report["ok"], report
    assert report["results"]["count"]["counts"] == dict(ref)
    assert {w["host"] for w in report["workers"]} == {"h1", "h2", "h3"}
    # downstream: the flushed [key, count] tuples add up to the reference, each key from
    # exactly one count worker, and every count worker owns some keys
    keys = report["results"]["check"]["keys"]
    assert {k: v["sum"] for k, v in keys.items()} == dict(ref)
    assert all(len(v["from"]) == 1 for v in keys.values()), keys
    count_ids = {w["worker"] for w in report["workers"] if w["node"] == "count"}
    assert {v["from"][0] for v in keys.values()} == count_ids


FORWARD_REMOTE = """
name: fwd
spouts:
  - id: source
    operator: sequence_source
    args: {count: 1000000, size: 100}
bolts:
  - id: sink
    operator: sequence_check
streams:
  - from: source
    to: sink
    grouping: shuffle
"""


def test_forward_across_hosts_million_tuples_no_loss(cluster):
    t = topo("fwd-fc", FORWARD_REMOTE)
    report = cluster.run(t)
    hosts = {w["node"]: w["host"] for w in report["workers"]}
    assert hosts["source"] != hosts["sink"]
    sink = report["results"]["sink"]
    print(
        f"\nflow control on: {report['elapsed_s']} s, "
        f"{1_000_000 / report['elapsed_s']:,.0f} tuples/s, missing {sink['missing']}"
    )
    assert report["ok"]
    assert sink["expected"] == 1_000_000
    assert sink["missing"] == 0 and sink["duplicates"] == 0


# Flow control off on one bridge: test_sdn_transport.py; frames dropped on a fabric
# and sent again: test_forced_loss.py.


BROADCAST6 = """
name: bc6
spouts:
  - id: source
    operator: sequence_source
    args: {count: 100000, size: 100}
bolts:
  - id: sink
    operator: sequence_check
    parallelism: 6
streams:
  - from: source
    to: sink
    grouping: all
"""


def test_broadcast_six_sinks_one_serialization_one_copy_per_link(cluster):
    t = topo("bc6", BROADCAST6)
    name = t.name
    cluster.submit(t)
    cluster.wait_active(name)
    try:
        assert cluster.wait_finished(name)
        physical = cluster.coordinator.get_physical(name)
        sink_hosts = {w.host for w in physical.of_node("sink")}
        assert sink_hosts == {"h1", "h2", "h3"}
        # every bridge has exactly one multicast rule for the stream, and each matched the
        # same number of frames: a link that carried a frame twice would double a count
        counts = {}
        for host in ("h1", "h2", "h3"):
            rules = [
                f
                for f in dump_flows(bridge_of(cluster, host))
                if parse_cookie(f.spec.cookie).kind == RuleKind.MULTICAST
            ]
            assert len(rules) == 1, (host, rules)
            counts[host] = rules[0].n_packets
        assert len(set(counts.values())) == 1 and counts["h1"] > 0, counts
    finally:
        cluster.kill(name)
    report = build_report(t, read_worker_reports(cluster.report_dir(name)))
    sink = report["results"]["sink"]
    assert sink["missing"] == 0 and set(sink["missing_per_worker"].values()) == {0}
    assert sink["received"] == 6 * 100000
    source = next(w for w in report["workers"] if w["node"] == "source")
    assert source["serializations"] == 100000  # one serialization per tuple, not per sink
    assert source["frames_out"] >= counts["h1"]
    assert len(report["workers"]) == 7


# ----- the rules on the switches -----------------------------------------------------------

ENDLESS = """
name: endless
spouts:
  - id: source
    operator: sequence_source
    args: {size: 100, rate: 2000}
bolts:
  - id: mid
    operator: identity
    parallelism: 2
  - id: sink
    operator: sequence_check
streams:
  - from: source
    to: mid
    grouping: shuffle
  - from: mid
    to: sink
    grouping: global
"""


@pytest.fixture
def endless(cluster):
    t = topo("endless", ENDLESS)
    cluster.submit(t)
    cluster.wait_active(t.name)
    yield t
    if cluster.coordinator.get_physical(t.name) is not None:
        cluster.kill(t.name)


def test_dump_flows_equals_compiled_specs_and_nothing_left_after_kill(cluster, endless):
    physical = cluster.coordinator.get_physical(endless.name)
    cl = cluster.coordinator.get_cluster()
    expected = compile_rules(endless, physical, cl)
    for host in cl.hosts:
        want = set(expected.get(host, ())) | set(compile_default_rules())
        wait(
            lambda h=host, w=want: {f.spec for f in dump_flows(bridge_of(cluster, h))} == w,
            10,
            f"rules on {host}",
        )
    cluster.kill(endless.name)
    for host in cl.hosts:
        wait(
            lambda h=host: (
                {f.spec for f in dump_flows(bridge_of(cluster, h))} == set(compile_default_rules())
            ),
            10,
            f"only the default rule on {host}",
        )


def _workers(cluster, t):
    physical = cluster.coordinator.get_physical(t.name)
    return physical, {n: physical.of_node(n) for n in t.nodes}


def test_spoofed_frames_are_dropped_by_the_switch(cluster, endless):
    physical, by_node = _workers(cluster, endless)
    app = physical.app_id
    src = by_node["source"][0]
    mid = by_node["mid"][0]
    bridge = bridge_of(cluster, src.host)
    spoof_rule = lambda: next(  # noqa: E731
        f
        for f in dump_flows(bridge)
        if parse_cookie(f.spec.cookie).kind == RuleKind.SPOOF_DROP
        and dict(f.spec.match)["in_port"] == src.port
    )
    before = spoof_rule().n_packets
    # a data frame claiming to come from another worker
    data = wire.pack_frames(
        wire.worker_mac(app, mid.worker_id),
        wire.worker_mac(app, 999),
        wire.Kind.DATA,
        1,
        0,
        [wire.encode_tuple([1, 2, 3.0, b""])],
    )[0]
    inject(bridge, src.port, data)
    # a DEACTIVATE that claims to come from the controller, sent from the spout's own port
    ctrl = wire.pack_frames(
        wire.worker_mac(app, src.worker_id),
        wire.controller_mac(app),
        wire.Kind.CONTROL,
        0,
        0,
        [wire.encode_control(wire.ControlTuple(wire.Control.DEACTIVATE, {}))],
    )[0]
    inject(bridge, src.port, ctrl)
    wait(lambda: spoof_rule().n_packets >= before + 2, 5, "the anti-spoof rule to count both")
    # the forged DEACTIVATE did not stop the spout: still active, still emitting (a
    # DEACTIVATE that got through would stop its count; by count, not a rate measured
    # against an earlier one)
    _, sent = counter_after(cluster, endless.name, src.worker_id, time.time())
    wait(
        lambda: counter_after(cluster, endless.name, src.worker_id, time.time())[1] >= sent + 1000,
        30,
        "the source to send 1,000 more tuples after the spoofed DEACTIVATE",
    )
    assert cluster.coordinator.get_metrics(endless.name)[src.worker_id]["active"] == 1
    # the forged DATA never reached mid: drain the job; mid's own report counts tuples
    # per sender, and none came from the claimed sender 999; the sink saw no duplicate
    # (the forged tuple repeats the source's tuple seq 2)
    state = cluster.coordinator.get_app_state(endless.name) or {}
    cluster.coordinator.put_app_state(endless.name, {**state, "drain": True})
    assert cluster.wait_finished(endless.name)
    reports = read_worker_reports(cluster.report_dir(endless.name))
    cluster.kill(endless.name)
    mids = [r for r in reports if r["node"] == "mid"]
    assert len(mids) == len(by_node["mid"]), [r["worker"] for r in reports]
    for r in mids:
        senders = {int(k.split(":")[0]) for k in r["links"]["in"]}
        assert senders == {src.worker_id}, (r["worker"], r["links"]["in"])
    report = build_report(endless, reports)
    sink = report["results"]["sink"]
    assert sink["duplicates"] == 0 and sink["missing"] == 0, sink
    assert report["ok"], report["problems"]


def test_malformed_frames_are_counted_and_dropped(cluster, endless):
    physical, by_node = _workers(cluster, endless)
    app = physical.app_id
    src, mid = by_node["source"][0], by_node["mid"][0]
    good_header = wire.pack_frames(
        wire.worker_mac(app, mid.worker_id),
        wire.worker_mac(app, src.worker_id),
        wire.Kind.DATA,
        1,
        0,
        [b"x"],
    )[0]
    frames = [
        good_header[:14] + b"\x07" + good_header[15:],  # wrong version
        good_header[:20],  # truncated header
        good_header[:14] + bytes(range(200)),  # garbage
    ]
    for f in frames:
        inject(bridge_of(cluster, src.host), src.port, f)

    def dropped():
        m = cluster.coordinator.get_metrics(endless.name).get(mid.worker_id, {})
        return m.get("drops", {}).get("malformed_frame", 0) >= 3

    wait(dropped, 10, "the mid worker to count 3 malformed frames")
    assert rate(cluster, endless.name, mid.worker_id, key="in") > 0  # it keeps working


INJECT = """
name: inject
spouts:
  - id: source
    operator: sequence_source
    args: {count: 40000, size: 100, rate: 8000}
bolts:
  - id: mid
    operator: identity
    parallelism: 2
  - id: sink
    operator: sequence_check
streams:
  - from: source
    to: mid
    grouping: shuffle
  - from: mid
    to: sink
    grouping: global
"""


def test_data_a_sink_sends_upstream_is_dropped_and_counted(cluster):
    """The switch's reverse path (credits, NACKs: receiver -> sender) matches addresses,
    not the frame kind, so a sink can put DATA frames on it towards its upstream.  Each
    mid worker drops them (``not_upstream``), the run completes and stays exact."""
    t = topo("inject", INJECT)
    injected: dict[int, int] = {}

    def inject_once(elapsed: float) -> None:
        if injected or elapsed < 1.0:
            return
        physical = cluster.coordinator.get_physical(t.name)
        sink = physical.of_node("sink")[0]
        stream = t.inputs_of("mid")[0].id
        source = physical.of_node("source")[0].worker_id
        rows = [[source, seq, 0.0, b"x" * 100] for seq in range(10)]  # the source's tuples
        for mid in physical.of_node("mid"):
            frame = wire.pack_frames(
                wire.worker_mac(physical.app_id, mid.worker_id),
                wire.worker_mac(physical.app_id, sink.worker_id),  # the sink's own address
                wire.Kind.DATA,
                stream,
                0,
                [wire.encode_rows(rows)],
            )[0]
            inject(bridge_of(cluster, sink.host), sink.port, frame)
            injected[mid.worker_id] = len(rows)

        def counted():
            metrics = cluster.coordinator.get_metrics(t.name)
            return all(
                metrics.get(w, {}).get("drops", {}).get("not_upstream", 0) == n
                for w, n in injected.items()
            )

        wait(counted, 10, "each mid worker to count the sink's data frame as not_upstream")

    report = cluster.run(t, on_tick=inject_once)
    assert injected, "the run ended before the injection"
    assert report["ok"], report
    sink = report["results"]["sink"]
    assert sink["expected"] == 40000
    assert sink["missing"] == 0 and sink["duplicates"] == 0
    mids = {w["worker"]: w for w in report["workers"] if w["node"] == "mid"}
    assert {w: m["drops"].get("not_upstream", 0) for w, m in mids.items()} == injected
    assert sum(sum(m["in"].values()) for m in mids.values()) == 40000


# ----- control tuples through the switch ---------------------------------------------------


def control(cluster, name, ctype, body=None, **target):
    # ROUTING and DRAIN alone bypass the stable update: refused unless forced, as here
    force = {"force": True} if ctype in ("ROUTING", "DRAIN") else {}
    status, reply = cluster.rest(
        "POST", f"/apps/{name}/control", {"type": ctype, "body": body or {}, **target, **force}
    )
    assert status == 202, reply
    return reply


def test_every_control_tuple_takes_effect(cluster, endless):
    name = endless.name
    physical, by_node = _workers(cluster, endless)
    src = by_node["source"][0].worker_id
    mids = [w.worker_id for w in by_node["mid"]]
    sink = by_node["sink"][0].worker_id

    # METRIC_REQ -> METRIC_RESP with queue depth and counts (asked again until the sink's
    # first tuples have arrived: the application has just been activated)
    def answer(request_id: int) -> dict | None:
        control(cluster, name, "METRIC_REQ", {"request_id": request_id}, workers=[sink])
        return wait(
            lambda: cluster.rest("GET", f"/apps/{name}/responses/{request_id}")[1].get(str(sink)),
            10,
            f"METRIC_RESP {request_id}",
        )

    ids = iter(range(424242, 424342))
    m = wait(lambda: (r := answer(next(ids)))["in"] and r, 10, "a METRIC_RESP with input")
    assert "queue" in m and m["in"] and "proc_us" in m

    # INPUT_RATE halves the source rate; DEACTIVATE stops the spouts, ACTIVATE starts them
    # again.  Each effect is awaited (measured over a second, up to 10 s): under load a
    # control tuple can wait behind the frames queued before it.
    full = rate(cluster, name, src)
    assert full > 1500, full  # sequence_source at rate 2000
    control(cluster, name, "INPUT_RATE", {"rate": 1000.0}, node="source")
    until(lambda: rate(cluster, name, src), lambda r: 0.35 * full < r <= 1100, "INPUT_RATE 1000")
    control(cluster, name, "DEACTIVATE", node="source")
    until(lambda: rate(cluster, name, src), lambda r: r == 0, "DEACTIVATE")
    control(cluster, name, "ACTIVATE", node="source")
    until(lambda: rate(cluster, name, src), lambda r: r > 0, "ACTIVATE")

    # BATCH_SIZE changes the I/O batching
    control(cluster, name, "BATCH_SIZE", {"size": 7, "max_delay_ms": 1.0}, workers=mids)
    wait(
        lambda: all(
            cluster.coordinator.get_metrics(name).get(w, {}).get("batch_size") == 7 for w in mids
        ),
        10,
        "batch size 7 on the mid workers",
    )

    # ROUTING: the source sends to the first mid worker only
    control(
        cluster,
        name,
        "ROUTING",
        {"stream": 1, "policy": "global", "next_hops": [mids[0]], "version": 77},
        node="source",
    )
    until(
        lambda: [rate(cluster, name, w, key="in") for w in mids],
        lambda r: r[0] > 0 and r[1] == 0,
        "ROUTING to the first mid worker only",
    )

    # SIGNAL is confirmed by the worker
    control(cluster, name, "SIGNAL", {"version": 78}, workers=[sink])

    def acked(what, version):
        status, acks = cluster.rest("GET", f"/apps/{name}/acks")
        return any(a["ack"] == what and a["version"] == version for a in acks)

    wait(lambda: acked("ROUTING", 77), 10, "ROUTING ack")
    wait(lambda: acked("SIGNAL", 78), 10, "SIGNAL ack")

    # DRAIN: the source finishes, end of stream flows down, every worker exits cleanly
    control(cluster, name, "DRAIN", {"version": 79}, node="source")
    cluster.options.timeout = 30
    try:
        assert cluster.wait_finished(name)
    finally:
        cluster.options.timeout = 300
    statuses = cluster.coordinator.worker_statuses(name)
    assert {s.exit_code for s in statuses.values()} == {0}
