"""Autoscaler on Mininet, real OVS and Ryu (paper §4 "Auto scaler", §6.2 Fig. 11).

One test, one emulated cluster (3 hosts) with ``apps/autoscaler.py``, two
applications side by side:

* wordcount whose **split** stage (2 workers, ``split_words`` with a service
  time of ``SPLIT_COST_US`` per sentence, 125 sentences/s each) is the
  bottleneck once the source goes from a rate they sustain to one they do not
  (310 sentences/s: 1.24 x what 2 serve, 0.83 x what 3 serve);
* a forward topology (sequence_source -> ``busy`` work stage of 2 workers ->
  sequence_check) overloaded the same way at the same moment, whose sink
  checks every sequence number, so 0 lost and 0 duplicated is proven across
  both updates (wordcount's counts are checked against a reference too).

The autoscaler (``nodes = split, work``) must have a third split worker
receiving within 10 s of the overload starting (the INPUT_RATE request);
the count workers' (sink's) throughput after the scale-up must be higher and
steadier than before; then the input drops and both stages go back to 2.

"Steadier": the coefficient of variation (stdev / mean) of per-second count
throughput samples, the same number of 1 s samples on each side, must not be
higher after the scale-up than before.  Before, the split stage is saturated,
so every hiccup of its workers (CPU contention from the other processes on
the machine, a late wake-up) is service time that is never made up and shows
up at the sink.  After, the stage has ~17% headroom: a hiccup leaves a short
queue that the workers catch up on, so the sink follows the source's token
bucket, which is the steady rate.  Raw standard deviations would not do (the
means differ), and the windows exclude the transitions (the first half second
of the overload, the update, and the backlog drain after it).  "Before" is
every whole second from then to the scale-up decision (3 or 4 with
``up_window = 3``: the 10 s target leaves no room for a longer window);
"after" is as many seconds from 5 s after the third workers first received
(the backlog built up during the overload drains in the seconds before).
On a quiet machine the saturated stage is nearly as steady as the source
(its service time is slept, not spun), and both CVs fall to what the
measurement resolves: per-second counts interpolated between METRIC_RESPs
0.5 s apart, about 0.5% with a constant source (seen: 0.000-0.005 after the
scale-up).  So the test asks ``CV after <= max(CV before, RESOLUTION)`` with
``RESOLUTION = 0.01``: not higher, beyond what the samples can tell apart.
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from harness import emulated_cluster, finish, ryu_apps, wait

from mininet_env.run import EmulatedCluster
from typhoon.coordinator import open_coordinator
from typhoon.operators.sources import generate_sentences
from typhoon.report import build_report
from typhoon.topology import load_topology_text

ROOT = Path(__file__).resolve().parents[2]
SCALE_UP_S = 10.0  # the target: overload start -> third worker receiving
RESOLUTION = 0.01  # CV the per-second samples resolve (see the docstring)
AFTER_S = 5.0  # the "after" samples start this long after the third split worker received

# the rates stay low so that the count workers, real CPU on a shared machine, are far
# from their own limit: the split stage must be the only bottleneck
SPLIT_COST_US = 8000  # 125 sentences/s per split worker
WC_START, WC_RATE, WC_LOW = 150.0, 310.0, 30.0  # sentences/s: 60% busy, 124%/83%, idle
WORDS = 8
WORDCOUNT = f"""
name: aswc
spouts:
  - id: source
    operator: sentence_source
    args: {{count: 100000000, seed: 7, words: {WORDS}, vocabulary: 500, rate: {WC_START}}}
bolts:
  - id: split
    operator: split_words
    parallelism: 2
    args: {{cost_us: {SPLIT_COST_US}}}
  - id: count
    operator: count_by_key
    args: {{key: word}}
    parallelism: 4
    stateful: true
streams:
  - from: source
    to: split
    grouping: shuffle
  - from: split
    to: count
    grouping: {{type: fields, fields: [word]}}
"""

WORK_COST_US = SPLIT_COST_US  # 125 tuples/s per work worker
FWD_START, FWD_RATE, FWD_LOW = WC_START, WC_RATE, WC_LOW  # tuples/s
FORWARD = f"""
name: asfwd
spouts:
  - id: source
    operator: sequence_source
    args: {{size: 100, rate: {FWD_START}}}
bolts:
  - id: work
    operator: busy
    parallelism: 2
    args: {{cost_us: {WORK_COST_US}}}
  - id: sink
    operator: sequence_check
streams:
  - from: source
    to: work
    grouping: shuffle
  - from: work
    to: sink
    grouping: shuffle
"""

SETTINGS = (
    "metrics_interval = 0.5\n"
    "[autoscaler]\n"
    "nodes = split, work\n"
    "busy_high = 0.9\n"
    "busy_low = 0.3\n"
    "up_window = 3.0\n"
    "down_window = 4.0\n"
    "cooldown = 4.0\n"
    "min_parallelism = 2\n"
    "max_parallelism = 3\n"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(
        tmp_path_factory.mktemp("autoscale"), "a", apps=["apps/autoscaler.py"], config=SETTINGS
    ) as c:
        yield c


def decisions(c: EmulatedCluster, name: str, node: str, action: str) -> list[dict]:
    """The autoscaler's decisions about ``node`` of ``name`` (its REST report)."""
    status, report = c.rest("GET", f"/apps/{name}/autoscaler")
    found = report.get(node, {}).get("decisions", []) if status == 200 else []
    return [d for d in found if d["action"] == action]


def workers_of(c: EmulatedCluster, name: str, node: str) -> set[int]:
    return {w.worker_id for w in c.coordinator.get_physical(name).of_node(node)}


def tuples_in(m: dict) -> int:
    return sum(v for k, v in m.get("in", {}).items() if k != "0")  # stream 0: control


def set_rate(c: EmulatedCluster, name: str, rate: float) -> float:
    """INPUT_RATE to the source; the wall time the request was made."""
    at = time.time()
    status, reply = c.rest(
        "POST", f"/apps/{name}/control",
        {"type": "INPUT_RATE", "body": {"rate": rate}, "node": "source"},
    )  # fmt: skip
    assert status == 202, reply
    return at


def settled(c: EmulatedCluster, name: str, node: str, parallelism: int) -> bool:
    return (
        len(workers_of(c, name, node)) == parallelism
        and c.rest("GET", f"/apps/{name}/reconfig")[1]["state"] == "done"
    )


class InputSampler(threading.Thread):
    """Every METRIC_RESP of some workers: (the worker's clock, tuples in so far).

    Reads its own coordinator connection every 0.1 s, so per-second rates can
    be interpolated between replies instead of depending on when the test polls.
    """

    def __init__(self, url: str, name: str, workers: set[int]) -> None:
        super().__init__(daemon=True)
        self.url, self.name = url, name
        self.series: dict[int, list[tuple[float, int]]] = {w: [] for w in workers}
        self.stop = threading.Event()

    def run(self) -> None:
        coordinator = open_coordinator(self.url)
        try:
            while not self.stop.is_set():
                metrics = coordinator.get_metrics(self.name)
                for w, points in self.series.items():
                    m = metrics.get(w)
                    if m and (not points or m["time"] > points[-1][0]):
                        points.append((m["time"], tuples_in(m)))
                self.stop.wait(0.1)
        finally:
            coordinator.close()

    def latest(self) -> float:
        """Up to when every worker's input is known."""
        return min((p[-1][0] if p else 0.0) for p in self.series.values())

    def total(self, t: float) -> float:
        """Tuples in of all the workers at ``t`` (linear between replies)."""
        n = 0.0
        for points in self.series.values():
            times = [p[0] for p in points]
            i = bisect.bisect_right(times, t)
            assert 0 < i < len(points), f"no replies around {t}"
            (t0, n0), (t1, n1) = points[i - 1], points[i]
            n += n0 + (n1 - n0) * (t - t0) / (t1 - t0)
        return n

    def per_second(self, start: float, samples: int) -> list[float]:
        return [self.total(start + k + 1) - self.total(start + k) for k in range(samples)]


def cv(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.mean(xs)


def test_fig11_split_overload_scales_up_within_10s_then_down_losing_nothing(cluster):
    c = cluster
    wc, fwd = load_topology_text(WORDCOUNT, "aswc"), load_topology_text(FORWARD, "asfwd")
    for t in (wc, fwd):
        c.submit(t)
    for t in (wc, fwd):
        c.wait_active(t.name)
    splits, works = workers_of(c, wc.name, "split"), workers_of(c, fwd.name, "work")
    sampler = InputSampler(c.coordinator_url, wc.name, workers_of(c, wc.name, "count"))
    sampler_fwd = InputSampler(c.coordinator_url, fwd.name, workers_of(c, fwd.name, "sink"))
    for s in (sampler, sampler_fwd):
        s.start()
    try:
        time.sleep(4.0)  # both run at rates their 2 workers sustain
        assert not decisions(c, wc.name, "split", "scale up")
        assert not decisions(c, fwd.name, "work", "scale up")

        # ----- overload: scale up within 10 s ------------------------------------------
        overload = set_rate(c, wc.name, WC_RATE)
        overload_fwd = set_rate(c, fwd.name, FWD_RATE)

        seen: dict[str, tuple[int, float]] = {}  # app -> (new worker, first seen receiving)

        def thirds():
            """Both new workers, each with the time it was first seen receiving tuples."""
            for name, node, before in ((wc.name, "split", splits), (fwd.name, "work", works)):
                added = workers_of(c, name, node) - before
                if name in seen or len(added) != 1:
                    continue
                if tuples_in(c.coordinator.get_metrics(name).get(next(iter(added)), {})) > 0:
                    seen[name] = (next(iter(added)), time.time())
            return len(seen) == 2

        wait(thirds, 40, "a third split and a third work worker receiving", 0.05)
        (new_split, received), (new_work, received_fwd) = seen[wc.name], seen[fwd.name]
        up = decisions(c, wc.name, "split", "scale up")[0]
        up_fwd = decisions(c, fwd.name, "work", "scale up")[0]
        for d in (up, up_fwd):
            assert (d["from"], d["to"]) == (2, 3) and "started" in d["outcome"], d
        wait(lambda: settled(c, wc.name, "split", 3) and settled(c, fwd.name, "work", 3),
             40, "both scale-ups to finish")  # fmt: skip
        done = time.time()
        print(
            f"\nautoscaler: wordcount overload -> decision {up['time'] - overload:.2f} s, -> "
            f"split worker {new_split} receiving {received - overload:.2f} s, both updates done "
            f"{done - overload:.2f} s ({up['reason']}); "
            f"forward -> decision {up_fwd['time'] - overload_fwd:.2f} s, -> work worker "
            f"{new_work} receiving {received_fwd - overload_fwd:.2f} s"
        )

        # ----- count throughput: higher and steadier -----------------------------------
        # whole seconds of 2 saturated workers: they were at 60%, so the stage saturates
        # as soon as the source's new rate arrives; half a second keeps the jump out
        start_before = overload + 0.5
        n = int(up["time"] - start_before)
        assert n >= 3, f"only {n} s of overload before the decision"
        # past both updates and the backlog of the overload: 3 workers have 65 sentences/s
        # to spare to drain what waits in the credit windows and queues
        start_after = max(received + AFTER_S, received_fwd + AFTER_S, done + 1.0)
        wait(lambda: min(sampler.latest(), sampler_fwd.latest()) > start_after + n + 0.1, n + 20,
             "count workers' metrics after the scale-up")  # fmt: skip
        before = sampler.per_second(start_before, n)
        after = sampler.per_second(start_after, n)
        between = sampler.per_second(start_before + n, int(start_after - start_before - n))
        mean_b, mean_a = statistics.mean(before), statistics.mean(after)
        print(
            f"autoscaler: count {mean_b:,.0f} words/s with 2 split workers (CV {cv(before):.3f}), "
            f"{mean_a:,.0f} with 3 (CV {cv(after):.3f}); {n} samples each: "
            f"{[round(x) for x in before]} -> {[round(x) for x in after]} "
            f"(update and drain between: {[round(x) for x in between]})"
        )
        n_fwd = int(up_fwd["time"] - (overload_fwd + 0.5))
        fwd_before = statistics.mean(sampler_fwd.per_second(overload_fwd + 0.5, n_fwd))
        fwd_after = statistics.mean(sampler_fwd.per_second(start_after, n))
        print(
            f"autoscaler: forward sink {fwd_before:,.0f} tuples/s with 2 work workers, "
            f"{fwd_after:,.0f} with 3"
        )

        # ----- the input drops: scale down -----------------------------------------------
        dropped = set_rate(c, wc.name, WC_LOW)
        dropped_fwd = set_rate(c, fwd.name, FWD_LOW)
        wait(lambda: settled(c, wc.name, "split", 2) and settled(c, fwd.name, "work", 2),
             60, "both scale-downs to finish")  # fmt: skip
        down = decisions(c, wc.name, "split", "scale down")
        down_fwd = decisions(c, fwd.name, "work", "scale down")
        print(
            f"autoscaler: input drop -> scale-down decision: wordcount "
            f"{down[0]['time'] - dropped:.2f} s, forward {down_fwd[0]['time'] - dropped_fwd:.2f} s"
        )
        time.sleep(1.0)
    finally:
        for s in (sampler, sampler_fwd):
            s.stop.set()
            s.join(5)

    # one scale-up and one scale-down each, both carried out: no flapping
    for d in (down, down_fwd):
        assert len(d) == 1 and (d[0]["from"], d[0]["to"]) == (3, 2), d
        assert "started" in d[0]["outcome"], d
    assert len(decisions(c, wc.name, "split", "scale up")) == 1
    assert len(decisions(c, fwd.name, "work", "scale up")) == 1

    # ----- nothing lost ----------------------------------------------------------------
    c.drain(fwd.name)
    topology, reports = finish(c, fwd.name)
    # sequence numbers are followed through identity nodes only; busy passes every tuple
    # on unchanged, so it is reported as one
    topology.nodes["work"].operator, topology.nodes["work"].args = "identity", {}
    report = build_report(topology, reports)
    sink = report["results"]["sink"]
    print(
        f"autoscaler: forward sink {sink['received']:,} tuples, missing {sink['missing']}, "
        f"duplicates {sink['duplicates']}"
    )
    assert sink["received"] > 0 and sink["missing"] == 0 and sink["duplicates"] == 0

    c.drain(wc.name)
    topology, reports = finish(c, wc.name)
    report = build_report(topology, reports)
    sent = report["results"]["source"]["emitted"]
    ref = Counter(
        w for s in generate_sentences(sent, seed=7, words=WORDS, vocabulary_size=500)
        for w in s.split()
    )  # fmt: skip
    counts = report["results"]["count"]["counts"]
    split_ids = {w["worker"] for w in report["workers"] if w["node"] == "split"}
    print(
        f"autoscaler: wordcount {sent:,} sentences, {sum(counts.values()):,} words counted, "
        f"{sum(ref.values()):,} in the reference; split workers {sorted(split_ids)}"
    )
    assert counts == dict(ref)
    assert new_split in split_ids and len(split_ids) == 3

    assert received - overload <= SCALE_UP_S, received - overload
    assert received_fwd - overload_fwd <= SCALE_UP_S, received_fwd - overload_fwd
    assert mean_a > 1.1 * mean_b, (before, after)  # 2 -> 3 workers: 1.24 x expected
    assert cv(after) <= max(cv(before), RESOLUTION), (before, after)


@pytest.mark.parametrize(
    "apps",
    [
        ["apps/autoscaler.py"],
        ["apps/autoscaler.py", "apps/load_balancer.py", "apps/live_debugger.py"],
    ],
    ids=["alone", "with-others"],
)
def test_the_app_starts_alone_and_with_the_others(tmp_path, apps):
    """``ryu-manager apps/autoscaler.py [others]``: the core comes in by itself."""
    with ryu_apps(tmp_path, apps, "[autoscaler]\nrecommend_only = true\nmax_step = 2\n") as ryu:
        assert wait(lambda: ryu.get("/autoscaler"), 30, "the autoscaler's REST API") == (200, {})
    text = ryu.log()
    assert "instantiating app controller.core" in text
    assert "autoscaler ready" in text and "recommend_only=True" in text and "max_step=2" in text
