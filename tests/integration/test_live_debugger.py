"""Live debugger end to end: Mininet bridges, real OVS, Ryu with apps/live_debugger.py, agents.

Scenario (paper §4 and §6.2, Fig. 12): a word count runs on 3 emulated hosts;
``typhoon debug attach`` watches split[0]'s output through a filter while a
second session (REST) watches count[0]'s input with 50 % sampling.  The input
is deterministic and routed entirely through split[0], so the test knows every
tuple split[0] emits to every count worker: the debugger must show exactly the
matching ones.  After Ctrl-C every rule is back as it was (dump-flows), and
split[0] did no extra work: one serialization per tuple and the same frames as
in a run without the debugger.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from flowdump import dump_flows
from harness import emulated_cluster, ryu_apps, wait

from controller.rules.cookies import RuleKind, parse_cookie
from controller.rules.flows import compile_default_rules, compile_rules
from controller.rules.mirror import MirrorTap, apply_mirrors
from mininet_env.run import EmulatedCluster, rest_call
from typhoon.operators.sources import generate_sentences
from typhoon.report import read_worker_reports
from typhoon.topology import load_topology
from typhoon.topology.chaining import hosted_by

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = 20000
BATCH = 100
# a meter rate no run here reaches (burst: a tenth of it): the exact test sees every frame
EVERY_FRAME = 1_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(
        tmp_path_factory.mktemp("debug"),
        "d",
        apps=["apps/live_debugger.py"],
        timeout=300,
        config=(
            "metrics_interval = 0.25\n[live_debugger]\nmax_sessions = 3\n"
            f"max_mirror_rate = {EVERY_FRAME}\nallow_imports = true\n"
        ),
    ) as c:
        yield c


def bridge_of(c: EmulatedCluster, host: str) -> str:
    return c.options.plan.bridge(int(host[1:]))


def rules_of(c: EmulatedCluster, host: str) -> frozenset:
    return frozenset(f.spec for f in dump_flows(bridge_of(c, host)))


def wordcount(name: str, sentences: int = SENTENCES):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.name = name
    t.nodes["source"].args.update(count=sentences, seed=7, words=8, vocabulary=500)
    # full batches only (the delay never expires): split[0]'s frames are then determined
    # by what it emits, so two runs can be compared frame for frame
    t.config.update(batch_size=BATCH, max_delay_ms=600_000)
    return t


def deploy_held(c: EmulatedCluster, name: str, sentences: int = SENTENCES):
    """Submit with the spouts held back (the controller activates only inactive apps),
    wait until every worker is attached and every bridge holds the compiled rules."""
    t = wordcount(name, sentences)
    c.submit(t)
    c.coordinator.put_app_state(name, {**c.coordinator.get_app_state(name), "active": True})
    physical = c.coordinator.get_physical(name)
    wait(
        lambda: (
            all(
                s.state in ("attached", "running")
                for s in c.coordinator.worker_statuses(name).values()
            )
            and len(c.coordinator.worker_statuses(name)) == len(physical.workers)
        ),
        30,
        "every worker attached",
    )
    cl = c.coordinator.get_cluster()
    expected = compile_rules(t, physical, cl)
    for host in cl.hosts:
        want = expected.get(host, frozenset()) | compile_default_rules()
        wait(lambda h=host, w=want: rules_of(c, h) == w, 15, f"the compiled rules on {host}")
    return t, physical


def start_through_split0(c: EmulatedCluster, name: str, physical) -> None:
    """Every sentence to split[0] (ROUTING), then start the source."""
    split0 = physical.of_node("split")[0].worker_id
    for ctype, body in (
        ("ROUTING", {"stream": 1, "policy": "global", "next_hops": [split0], "version": 5}),
        ("ACTIVATE", {}),
    ):
        status, reply = c.rest(
            "POST",
            f"/apps/{name}/control",
            # ROUTING alone bypasses the stable update: forced, it is what this test wants
            {"type": ctype, "body": body, "node": "source", "force": ctype == "ROUTING"},
        )
        assert status == 202, reply


def expected_words(sentences: int = SENTENCES) -> list[str]:
    return [w for s in generate_sentences(sentences, 7, 8, 500) for w in s.split()]


def ranked_words(sentences: int = SENTENCES) -> list[str]:
    """The vocabulary, most frequent first (rank 100 occurs ~500 times, rank 200 ~290)."""
    counts = Counter(expected_words(sentences))
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def _sigint_default() -> None:
    """The child stops on Ctrl-C even when the suite runs as a background job (which starts
    with SIGINT ignored, and Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Attach:
    """``typhoon debug attach`` as a child process; stdout lines collected by a thread."""

    def __init__(self, c: EmulatedCluster, *args: str) -> None:
        argv = [sys.executable, "-m", "typhoon_cli", "debug", "attach", *args]
        env = {**os.environ, "TYPHOON_CONTROLLER": c.rest_url, "TYPHOON_TOKEN": c.token}
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_sigint_default,
        )  # fmt: skip
        self.lines: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for th in self._threads:
            th.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def session(self) -> str:
        def live():
            if self.proc.poll() is not None:
                pytest.fail(f"attach exited {self.proc.returncode}: {self.err}")
            return next(
                (m[1] for e in self.err if (m := re.match(r"session (\w+): watching", e))), None
            )

        return wait(live, 30, "the debug session to go live")

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(timeout=20)
        for th in self._threads:
            th.join(timeout=5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def debug_worker_of(session: str) -> psutil.Process:
    """The running debug worker of ``session``, found by its command line (a forked one's
    process title is the command a spawned one would have)."""
    spec = f"/{session}.spec.json"
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        line = " ".join(argv)
        if "-m typhoon.debug.worker " in line and spec in line:
            return proc
    pytest.fail(f"no debug worker process for session {session}")


def frames_sent_by(c: EmulatedCluster, w) -> int:
    """Frames the switch took from ``w``'s port on its data rules (mirrored or not)."""
    total = 0
    for f in dump_flows(bridge_of(c, w.host)):
        cookie = parse_cookie(f.spec.cookie)
        if (
            cookie is not None
            and cookie.worker == w.worker_id
            and not cookie.credit
            and cookie.kind in (RuleKind.LOCAL, RuleKind.REMOTE_SEND, RuleKind.MIRROR)
            and f.spec.table_id == 0  # the metered copies' entries (table 1) match the same
            and dict(f.spec.match).get("in_port") == w.port
        ):
            total += f.n_packets
    return total


def split0_report(c: EmulatedCluster, name: str, physical) -> dict:
    wid = physical.of_node("split")[0].worker_id
    return next(r for r in read_worker_reports(c.report_dir(name)) if r["worker"] == wid)


def frames_switched_in_the_end(c: EmulatedCluster, name: str, physical) -> int:
    """:func:`frames_sent_by` split[0] once the job ended and the switch's counters have
    caught up: userspace OVS adds a datapath flow's packets to its OpenFlow rule on a
    revalidator pass (about every 500 ms), so right after the last frame the rules can
    show fewer than split[0] sent.  Final when they count at least the frames split[0]
    says it addressed to the count workers and two reads 1.2 s apart agree."""
    w = physical.of_node("split")[0]
    sent = sum(split0_report(c, name, physical)["links"]["transport"]["frames_to"].values())
    wait(lambda: frames_sent_by(c, w) >= sent, 10, f"the switch's counters at {sent} frames")
    reads: list[int] = []

    def steady() -> int | None:
        reads.append(frames_sent_by(c, w))
        return reads[-1] if len(reads) > 1 and reads[-1] == reads[-2] else None

    return wait(steady, 10, "the switch's counters to stop moving", 1.2)


def test_attach_filter_detach_exact_tuples_and_rules_restored(cluster):
    name = "wcdbg"
    t, physical = deploy_held(cluster, name)
    split0 = physical.of_node("split")[0]
    count0 = physical.of_node("count")[0]
    hosts = list(cluster.coordinator.get_cluster().hosts)
    before = {h: rules_of(cluster, h) for h in hosts}
    ranked = ranked_words()
    a, b, c3 = ranked[100], ranked[150], ranked[200]
    sampled = ranked[300:330]  # the second session's words: some are counted by count[0]
    attach = Attach(
        cluster, name, "split[0]", "--direction", "out", "--format", "json",
        "--filter", f"word in {a},{b} or word={c3}", "--last", "20000",
        "--rate", "all",
    )  # fmt: skip
    try:
        sid = attach.session()
        # no meter: the attach says every frame is copied (and never that it samples)
        wait(lambda: any("copies every frame (no meter)" in e for e in attach.err), 10, "note")
        assert not any("SAMPLED" in e for e in attach.err), attach.err
        # a second, concurrent session over REST: count[0]'s input, half of it sampled
        status, second = cluster.rest(
            "POST",
            f"/apps/{name}/debug",
            {
                "worker": "count[0]",
                "direction": "in",
                "filter": f"_src_node=split and word in {','.join(sampled)}",
                "sample": 50,
                "last": 20000,
                "rate": EVERY_FRAME,
            },
        )
        assert status == 201, second
        wait(
            lambda: (
                cluster.rest("GET", f"/apps/{name}/debug/{second['session']}")[1]["state"] == "live"
            ),
            30,
            "the second session to go live",
        )
        session = cluster.rest("GET", f"/apps/{name}/debug/{sid}")[1]
        for live in (sid, second["session"]):  # forked by their agents' zygotes
            proc = debug_worker_of(live)
            assert "typhoon.runtime.zygote_server" in " ".join(proc.parent().cmdline()), live

        # while attached: split[0]'s data rules carry one more output, nothing else changed
        mirrors = {
            split0.host: [
                MirrorTap(
                    physical.app_id,
                    split0.worker_id,
                    split0.port,
                    "out",
                    session["port"],
                    None,  # --rate all: no meter
                )
            ],  # fmt: skip
        }
        mirrors.setdefault(count0.host, []).append(
            MirrorTap(
                physical.app_id, count0.worker_id, count0.port, "in", second["port"], EVERY_FRAME
            )
        )
        for h in hosts:
            want = apply_mirrors(before[h], mirrors.get(h, []))
            wait(lambda h=h, w=want: rules_of(cluster, h) == w, 10, f"mirror rules on {h}")
        assert session["mirrored_rules"] == len(physical.of_node("count"))

        start_through_split0(cluster, name, physical)
        assert cluster.wait_finished(name)
        switched_with = frames_switched_in_the_end(cluster, name, physical)

        # exactly the matching tuples split[0] emitted (all sentences went through it)
        words = expected_words()
        matching = Counter(w for w in words if w in (a, b, c3))
        wait(lambda: len(attach.lines) >= sum(matching.values()), 30, "every matching tuple")

        # every frame the switch forwarded from split[0] (data and SYNC credits) was copied
        # once; the debug worker posts its counters in batches: once they count every frame,
        # they are final, and the attach has printed all it will once it printed `matched`
        def copied() -> int:
            st = cluster.rest("GET", f"/apps/{name}/debug/{sid}")[1]["stats"]
            return st["data_frames"] + st["other"]

        wait(lambda: copied() >= switched_with, 30, "the debug worker's count of every copy")
        stats = cluster.rest("GET", f"/apps/{name}/debug/{sid}")[1]["stats"]
        wait(lambda: len(attach.lines) >= stats["matched"], 30, "every matched tuple printed")
        records = [json.loads(line) for line in attach.lines]
        assert Counter(r["fields"]["word"] for r in records) == matching
        assert {r["src"] for r in records} == {split0.worker_id}
        # ... and to the count worker that counted it
        reports = {r["worker"]: r for r in read_worker_reports(cluster.report_dir(name))}
        seen = Counter((r["dst"], r["fields"]["word"]) for r in records)
        counted = Counter(
            {
                (w.worker_id, word): reports[w.worker_id]["result"]["counts"].get(word, 0)
                for w in physical.of_node("count")
                for word in (a, b, c3)
            }
        )
        assert seen == +counted
        # the ring buffer holds them too, over REST
        status, page = cluster.rest("GET", f"/apps/{name}/debug/{sid}/tuples?after=0&limit=10000")
        assert status == 200 and [r["n"] for r in page["records"]] == [r["n"] for r in records]

        # the switch made the copies: frames per link as split[0] batched them, none lost
        per_dst = Counter(r["dst"] for r in records)
        assert per_dst  # sanity
        # split[0]'s own count of the frames it sent per link (row batches of one event-loop
        # turn share frames, so this is not ceil(tuples / batch)); none sent twice
        sent = reports[split0.worker_id]["links"]["transport"]
        assert sent["retransmitted"] == 0, sent
        frames = {
            f"{split0.worker_id}->{w.worker_id}": sent["frames_to"][str(w.worker_id)]
            for w in physical.of_node("count")
        }
        assert all(n >= 2 for n in frames.values()), frames  # data and the end of stream
        assert stats["links"] == frames and stats["seq_gaps"] == 0, stats
        assert switched_with == copied(), (switched_with, stats)
        # the debug port's own counters (no meter to read): every copy, none left out
        wait(
            lambda: (
                cluster.rest("GET", f"/apps/{name}/debug/{sid}")[1]["stats"].get("switch_copied", 0)
                >= switched_with
            ),
            10,
            "the debug port's counters",
        )
        port_stats = cluster.rest("GET", f"/apps/{name}/debug/{sid}")[1]["stats"]
        assert port_stats["switch_sampled"] == 0 and port_stats["switch_dropped"] == 0, port_stats
        data_frames = sum(frames.values())
        final = cluster.rest("GET", f"/apps/{name}/debug/{sid}")[1]["stats"]
        assert final["data_frames"] == data_frames, final
        assert stats["tuples"] == len(words) and stats["matched"] == sum(matching.values())

        # the sampled input session: every tuple of those words count[0] received passed
        # the filter, about half of them were kept
        path = f"/apps/{name}/debug/{second['session']}"
        got = cluster.rest("GET", f"{path}/tuples?after=0&limit=10000")[1]["records"]
        counts0 = reports[count0.worker_id]["result"]["counts"]
        total = sum(counts0.get(w, 0) for w in sampled)
        stats2 = cluster.rest("GET", path)[1]["stats"]
        assert stats2["matched"] == total > 200, (stats2, total)
        assert stats2["sampled_out"] + len(got) == total
        # about half: a fair coin per tuple, within 6 standard deviations (sqrt(n) / 2 each),
        # so a correct sampler fails this once in ~10^9 runs
        assert abs(len(got) - total / 2) <= 3 * math.sqrt(total), (len(got), total)
        assert all(r["dst"] == count0.worker_id and r["fields"]["word"] in sampled for r in got)
        assert cluster.rest("DELETE", path)[0] == 200

        # Ctrl-C detaches: debug workers gone, every rule exactly as before
        assert attach.interrupt() == 0
        assert any("detached session" in e for e in attach.err), attach.err
        assert any("none left out (no meter)" in e for e in attach.err), attach.err
        for h in hosts:
            wait(lambda h=h: rules_of(cluster, h) == before[h], 10, f"the old rules on {h}")
            kinds = {parse_cookie(f.cookie).kind for f in rules_of(cluster, h)}
            assert RuleKind.MIRROR not in kinds
        wait(lambda: not cluster.coordinator.list("debug"), 5, "session keys removed")
        wait(
            lambda: (
                not any(
                    p >= 65000
                    for ag in cluster.coordinator.agents().values()
                    for p in ag.used_ports
                )
            ),
            10,
            "debug ports released by the agents",
        )
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert "tdbg" not in links
        report = split0_report(cluster, name, physical)
        with_debugger, with_debugger_links = report["metrics"], report["links"]["transport"]
        debugged_counts = {str(w.worker_id) for w in physical.of_node("count")}
    finally:
        attach.kill()
        cluster.kill(name)

    # the same run without a debugger: split[0] serializes and sends the same
    name = "wcplain"
    t, physical = deploy_held(cluster, name)
    try:
        start_through_split0(cluster, name, physical)
        assert cluster.wait_finished(name)
        switched_plain = frames_switched_in_the_end(cluster, name, physical)
        report = split0_report(cluster, name, physical)
        plain, plain_links = report["metrics"], report["links"]["transport"]
    finally:
        cluster.kill(name)
    tuples = len(expected_words())
    print(
        f"\nsplit[0] with debugger: {with_debugger['serializations']} serializations, "
        f"{with_debugger['frames_out']} frames out, {switched_with} through its data rules; "
        f"without: {plain['serializations']}, {plain['frames_out']}, {switched_plain} "
        f"({tuples} tuples)"
    )
    assert with_debugger["serializations"] == plain["serializations"] == tuples
    assert sum(with_debugger["out"].values()) == sum(plain["out"].values()) == tuples
    # the switch made the copies: split[0] addressed frames to the count workers only, with
    # or without a debugger, and its data rules carried at least every data frame (plus
    # SYNC probes, as many as the links' timing asked for: how many is timing, not asserted;
    # so are frames_out's METRIC_RESP replies, 4 a second of each run)
    plain_counts = {str(w.worker_id) for w in physical.of_node("count")}
    assert set(with_debugger_links["frames_to"]) == debugged_counts, with_debugger_links
    assert set(plain_links["frames_to"]) == plain_counts, plain_links
    plain_frames = sum(plain_links["frames_to"].values())  # its own run's, batched its way
    assert switched_with >= data_frames and switched_plain >= plain_frames


def test_a_low_rate_session_gets_at_most_its_rate_and_the_run_stays_exact(cluster):
    """Sampling in the switch: the meter lets ``rate`` frames/s through to the debug port,
    the others are never copied; the observed word count is exact."""
    name, rate = "wcrate", 20
    t, physical = deploy_held(cluster, name)
    split0 = physical.of_node("split")[0]
    try:
        post = lambda body: cluster.rest("POST", f"/apps/{name}/debug", body)  # noqa: E731
        wait(lambda: post({"worker": "split[0]", "rate": 0})[0] != 409, 10, "split[0] attached")
        status, session = post({"worker": "split[0]", "direction": "out", "rate": rate})
        assert status == 201 and session["rate"] == rate, session
        path = f"/apps/{name}/debug/{session['session']}"
        wait(lambda: cluster.rest("GET", path)[1]["state"] == "live", 30, "the session live")
        live = time.monotonic()
        start_through_split0(cluster, name, physical)
        assert cluster.wait_finished(name)

        # the meter's counters (read every second) and the debug worker's (posted in
        # batches) come in on their own clocks: final once they agree, every frame the
        # meter let through counted by the debug worker, with some left out
        def settled() -> dict | None:
            st = cluster.rest("GET", path)[1]["stats"]
            if not {"switch_copied", "switch_dropped"} <= st.keys():
                return None  # the meter's or the port's first reply not read yet
            agree = st["switch_copied"] == st["data_frames"] + st["other"]
            return st if agree and st["switch_sampled"] > 0 else None

        stats = wait(settled, 30, "the switch's and the debug worker's final counters", 0.2)
        elapsed = time.monotonic() - live
        sent = frames_sent_by(cluster, split0)
        reports = {r["worker"]: r for r in read_worker_reports(cluster.report_dir(name))}
        assert cluster.rest("DELETE", path)[0] == 200
    finally:
        cluster.kill(name)
    copies = stats["data_frames"] + stats["other"]
    print(f"\nrate {rate}/s over {elapsed:.1f} s: {copies} copies of {sent} frames; {stats}")
    burst = max(1, rate // 10)
    assert 0 < copies <= rate * elapsed + burst + 5, (copies, elapsed, stats)
    assert sent > 2 * copies, (sent, copies)  # the run sent far more than the meter let by
    # the switch's counters: what its meter let through and left out add up to what it
    # took from split[0]'s data rules while the session was live (the same frames)
    assert stats["switch_sampled"] > 0 and stats["switch_copied"] <= copies + burst, stats
    assert stats["switch_copied"] + stats["switch_sampled"] <= sent, (stats, sent)
    # gaps in the sequence are frames sampled away (none lost on the debug port); a link
    # whose copies were consecutive frames shows none, so gaps may be 0
    assert stats["switch_dropped"] == 0 and stats["ring_dropped"] == 0, stats
    assert stats["seq_gaps"] <= stats["switch_sampled"], stats
    # the observed run is exact: every word counted once
    counts: Counter = Counter()
    for w in physical.of_node("count"):
        counts.update(reports[w.worker_id]["result"]["counts"])
    assert counts == Counter(expected_words())


def test_a_custom_debug_operator_runs_over_the_mirrored_tuples(cluster):
    """``--operator module:Class`` (paper §4, custom debug logic): the debug worker runs
    typhoon.debug.examples:Tally over split[0]'s matching output and the attach prints
    what it emits; a module that does not exist ends its session with one sentence."""
    name, sentences = "wcop", 2000
    t, physical = deploy_held(cluster, name, sentences)
    post = lambda body: cluster.rest("POST", f"/apps/{name}/debug", body)  # noqa: E731
    wait(lambda: post({"worker": "split[0]", "rate": 0})[0] != 409, 10, "split[0] attached")
    bad = Attach(cluster, name, "split[0]", "--operator", "nosuch_debug_module:Tally")
    try:
        assert bad.proc.wait(timeout=40) == 1
    finally:
        bad.kill()
    for th in bad._threads:
        th.join(timeout=5)
    # told by the debug worker itself, or by its agent with its last log line: the sentence
    assert any(
        "did not go live" in e
        and "operator 'nosuch_debug_module:Tally': cannot import module 'nosuch_debug_module'" in e
        for e in bad.err
    ), bad.err
    ranked = ranked_words(sentences)
    a, b = ranked[20], ranked[60]
    matching = Counter(w for w in expected_words(sentences) if w in (a, b))
    attach = Attach(
        cluster, name, "split[0]", "--format", "json", "--filter", f"word in {a},{b}",
        "--operator", "typhoon.debug.examples:Tally", "--last", "20000",
        "--rate", str(EVERY_FRAME),
    )  # fmt: skip
    try:
        sid = attach.session()
        assert any("through operator typhoon.debug.examples:Tally" in e for e in attach.err)
        start_through_split0(cluster, name, physical)
        assert cluster.wait_finished(name)
        wait(lambda: len(attach.lines) >= sum(matching.values()), 30, "the operator's output")
        path = f"/apps/{name}/debug/{sid}"
        stats = wait(
            lambda: (
                (st := cluster.rest("GET", path)[1]["stats"]).get("op_emitted", 0)
                >= sum(matching.values())
                and st
            ),
            30,
            "the operator's final counters",
        )
        assert attach.interrupt() == 0
    finally:
        attach.kill()
        cluster.kill(name)
    records = [json.loads(line) for line in attach.lines]
    assert {r["dst_label"] for r in records} == {"op:Tally"}
    assert {r["src"] for r in records} == {physical.of_node("split")[0].worker_id}
    # the bolt's own state, in order: the n-th copy of a word is tallied n
    for word in (a, b):
        seen = [r["fields"]["seen"] for r in records if r["fields"]["value"] == word]
        assert seen == list(range(1, matching[word] + 1)), word
    assert len(records) == sum(matching.values())
    assert stats["ring_dropped"] == 0 and stats["op_errors"] == 0, stats
    assert stats["op_tuples"] == stats["matched"] == stats["op_emitted"] == len(records), stats
    assert any("op_emitted" in e for e in attach.err)  # the detach line


def test_bad_requests_and_the_session_limit(cluster):
    name = "wcbad"
    t, physical = deploy_held(cluster, name)
    try:
        post = lambda body: cluster.rest("POST", f"/apps/{name}/debug", body)  # noqa: E731
        # the controller reads worker states from the coordinator on its own clock: until
        # it has seen split[0] attached, an attach is refused with 409 whatever it asks
        bad = {"worker": "split[0]", "filter": "wrod=x"}
        wait(lambda: post(bad)[0] != 409, 10, "the controller to see split[0] attached")
        assert post(bad)[0] == 400
        assert post({"worker": "split[7]"})[0] == 404
        assert cluster.rest("POST", "/apps/nope/debug", {"worker": 1})[0] == 404
        sessions = [post({"worker": f"count[{i}]", "direction": "in"}) for i in range(3)]
        assert [s for s, _ in sessions] == [201, 201, 201]
        assert post({"worker": "split[0]"})[0] == 429  # max_sessions = 3 in this cluster
        for _, s in sessions:
            assert cluster.rest("DELETE", f"/apps/{name}/debug/{s['session']}")[0] == 200
        hosts = cluster.coordinator.get_cluster().hosts
        expected = compile_rules(t, physical, cluster.coordinator.get_cluster())
        for h in hosts:
            want = expected.get(h, frozenset()) | compile_default_rules()
            wait(lambda h=h, w=want: rules_of(cluster, h) == w, 10, f"rules on {h}")
        # killing the application ends its sessions too
        status, last = post({"worker": "split[1]"})
        assert status == 201
        path = f"/apps/{name}/debug/{last['session']}"
        wait(lambda: cluster.rest("GET", path)[1]["state"] == "live", 30, "the session to go live")
    finally:
        cluster.kill(name)
    reply = wait(lambda: (r := cluster.rest("GET", path)[1])["state"] == "ended" and r, 10, "end")
    assert reply["reason"] == "the application was killed"
    wait(lambda: not cluster.coordinator.list("debug"), 10, "the session key removed")


def test_the_app_starts_alone_and_pulls_in_the_core(tmp_path):
    """``ryu-manager apps/live_debugger.py``: no typhoon_core.py on the command line."""
    with ryu_apps(tmp_path, ["apps/live_debugger.py"]) as ryu:
        assert wait(lambda: ryu.get("/apps"), 30, "the controller's REST API") == (200, {})
        assert rest_call(ryu.url, "GET", "/apps/x/debug")[0] == 404  # the debugger's routes
        assert rest_call(ryu.url, "POST", "/apps/x/debug", {"worker": 1}, "t")[0] == 404
    text = ryu.log()
    assert "instantiating app controller.core" in text and "live debugger ready" in text


@pytest.mark.long
def test_attaching_to_a_chained_edge_unchains_it_live_and_the_run_stays_exact(cluster):
    """split[0]'s input is a function call from source[0] in one process (chaining): the
    attach unchains that edge live (the stable update, process kept), then mirrors its
    frames; it stays on the network after the detach; the word count is exact."""
    name = "wcchdbg"
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount_chained.yaml"))
    t.name = name
    t.nodes["source"].args.update(count=SENTENCES, rate=1000)  # about 10 s
    cluster.submit(t)
    cluster.wait_active(name)
    physical = cluster.coordinator.get_physical(name)
    source0, split0 = physical.of_node("source")[0], physical.of_node("split")[0]
    try:
        status, session = cluster.rest(
            "POST", f"/apps/{name}/debug", {"worker": "split[0]", "direction": "in"}
        )
        assert status == 201 and session["unchained"] == [split0.worker_id], session
        assert cluster.coordinator.get_physical(name).unchained == [split0.worker_id]
        path = f"/apps/{name}/debug/{session['session']}"
        wait(lambda: cluster.rest("GET", path)[1]["state"] == "live", 30, "the session live")
        wait(lambda: cluster.rest("GET", path)[1]["stats"].get("tuples", 0) > 100, 30, "copies")
        got = cluster.rest("GET", f"{path}/tuples?after=0&limit=10000")[1]["records"]
        assert cluster.rest("DELETE", path)[0] == 200
        assert cluster.wait_finished(name)
        reports = {r["worker"]: r for r in read_worker_reports(cluster.report_dir(name))}
        assert cluster.coordinator.get_physical(name).unchained == [split0.worker_id]
    finally:
        cluster.kill(name)
    sentences = set(generate_sentences(SENTENCES, 7, 8, 500))
    assert got and all(r["dst"] == split0.worker_id for r in got), got[:3]
    assert all(r["fields"]["sentence"] in sentences for r in got), got[:3]
    frames_to = reports[source0.worker_id]["links"]["transport"]["frames_to"]
    assert int(frames_to[str(split0.worker_id)]) > 0  # through the switch after the attach
    counts: Counter = Counter()
    for w in physical.of_node("count"):
        counts.update(reports[w.worker_id]["result"]["counts"])
    assert counts == Counter(expected_words())
    # the process stayed: source[0] and split[0] still share one log (its head's)
    hosted = hosted_by(t, physical)
    assert hosted[split0.worker_id] == source0.worker_id
    logs = {p.name for p in (cluster.workdir / name).glob("worker-*.log")}
    assert logs == {f"worker-{w.worker_id}.log" for w in physical.workers} - {
        f"worker-{w}.log" for w in hosted
    }, logs
