"""Scenario: what key-pair statistics cost, counted in the workers or sampled by the switch.

Issue 17 item 1 asks for (a, b) key-pair statistics of ``topologies/locality.yaml``'s
chain (``pair_source`` -> ``a`` on key a -> ``b`` on key b, one worker of each per
emulated host) and which of two ways costs less:

* ``counter``: the framework's opt-in counter (``typhoon/runtime/pairs.py``,
  ``config: locality: {pairs, sample, top}``) in every worker of ``a``;
* ``mirror``: a live-debugger session on the input of the stateful node ``b``
  (its worker ``b[0]``), sampled in the switch (the session's meter,
  ``MIRROR_RATE`` frames/s, ``controller/rules/meters.py``), the pairs read from its
  records as the CLI reads them;
* ``off``: neither, the reference.

The three alternate in every round on one 3-host cluster.  Measured per run: the
rate at which ``b`` took its tuples in (tuples over the run), the CPU seconds of
the ``a`` workers, and how well the sample recovers the top pairs: the share of the
exact ``TOP`` most frequent pairs toward ``b[0]`` (the generator is a pure function,
so the exact counts are known) found among the sample's ``TOP`` most frequent.
Counts are checked against the generator in every run.
"""

from __future__ import annotations

import copy
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.debug_watcher import Watcher
from benchmarks.scenario import (
    Bench,
    Ratio,
    Scenario,
    ScenarioResult,
    Table,
    register,
)
from benchmarks.stats import (
    fmt_num,
    fmt_rate,
    median,
)
from benchmarks.testbed import RunResult
from mininet_env.run import EmulatedCluster
from typhoon.client import ApiCallError, Client, resolve
from typhoon.operators.pairs import expected_counts, pair_tuple
from typhoon.report import read_worker_reports
from typhoon.topology import load_topology
from typhoon.topology.model import Topology

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("off", "counter", "mirror")
HOSTS = 3
KEYS = 200
LOCALITY = 0.8
TOP = 20
COUNTER = {"pairs": 1000, "sample": 10, "top": 200}
MIRROR_RATE = 20  # frames/s the switch copies: ~10k tuples/s of 64 KB frames, plenty of pairs


def workload(name: str, variant: str, count: int) -> Topology:
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "locality.yaml"))
    t.name = name
    t.nodes["source"].args.update(count=count, rate=0.0, keys_a=KEYS, keys_b=KEYS, size=100)
    t.config.pop("locality", None)
    if variant == "counter":
        t.config["locality"] = dict(COUNTER)
    return t


def exact_pairs(count: int) -> Counter:
    return Counter(tuple(pair_tuple(1, s, KEYS, KEYS, LOCALITY, "")[:2]) for s in range(count))


def recall(sampled: Counter, exact: Counter, keys_b: set[str]) -> float | None:
    """Share of the exact ``TOP`` pairs toward ``keys_b`` among the sample's ``TOP``."""
    want = [
        p for p, _ in Counter({p: n for p, n in exact.items() if p[1] in keys_b}).most_common(TOP)
    ]
    got = {
        p for p, _ in Counter({p: n for p, n in sampled.items() if p[1] in keys_b}).most_common(TOP)
    }
    return sum(p in got for p in want) / len(want) if want else None


class Hook:
    """on_tick: attaches the mirror session to b[0]'s input once the run is active."""

    def __init__(self, api: Client, name: str, variant: str) -> None:
        self.pairs: Counter = Counter()
        self.watcher: Watcher | None = None
        self.error = ""
        if variant == "mirror":
            self.watcher = Watcher(api, name, 100.0, "b[0]", "in", self._keep, MIRROR_RATE)

    def _keep(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            f = r.get("fields") or {}
            if "a" in f and "b" in f:
                self.pairs[(str(f["a"]), str(f["b"]))] += 1

    def __call__(self, elapsed: float) -> None:
        if self.watcher is not None and not self.watcher.requested:
            try:
                self.watcher.attach()
            except ApiCallError as e:
                self.error = f"attach: {e}"


def run_once(bench: Bench, cluster: EmulatedCluster, variant: str, count: int) -> RunResult:
    name = f"bench{next(bench.testbed.names):04d}-pairs-{variant}"
    topo = workload(name, variant, count)
    cluster.options.duration = None
    cluster.options.timeout = 300
    api = Client(resolve(config=str(cluster.workdir / "client.ini")))
    hook = Hook(api, name, variant)
    label = f"pairs {variant}"
    t0 = time.monotonic()
    try:
        report = cluster.run(topo, hook)
        if hook.watcher is not None:
            hook.watcher.detach()
            hook.watcher.stats = hook.watcher.final_stats()
        error = hook.error or (hook.watcher.error if hook.watcher else "")
        if hook.watcher is not None and not hook.watcher.live:
            error = error or "the debug session never went live"
        error = error if not report.get("ok") else error
        if not report.get("ok"):
            error = error or "a worker failed or the run timed out"
        run = RunResult("sdn", HOSTS, label, not error, time.monotonic() - t0, error)
        run.report, run.workers = report, read_worker_reports(cluster.report_dir(name))
    except Exception as e:  # one failed run must not end the benchmark
        detail = traceback.format_exception_only(e)[-1].strip()
        run = RunResult("sdn", HOSTS, label, False, time.monotonic() - t0, detail)
    run.report["pairs_cost"] = describe_run(run, hook, variant, count)
    record = run.to_dict()
    record["pairs_cost"] = run.report["pairs_cost"]
    bench.records.append(record)
    if not run.ok:
        bench.failures += 1
    status = "ok" if run.ok else f"FAILED: {run.error}"
    print(f"  {label} [sdn]: {status} ({run.wall_s:.1f} s)", file=bench.out, flush=True)
    return run


def describe_run(run: RunResult, hook: Hook, variant: str, count: int) -> dict[str, Any]:
    out: dict[str, Any] = {"variant": variant}
    if not run.ok:
        return out
    want_a, want_b = expected_counts(count, 1, KEYS, KEYS, LOCALITY, 1)
    exact = run.node_result("a").get("counts") == want_a and (
        run.node_result("b").get("counts") == want_b
    )
    elapsed = run.report.get("elapsed_s") or run.wall_s
    workers = run.report.get("workers", [])
    b0 = next((w for w in run.node_workers("b") if w.get("index") == 0), None)
    keys_b0 = set(((b0 or {}).get("result") or {}).get("counts", {}))
    sampled: Counter = Counter()
    if variant == "counter":
        for w in workers:
            for a, bs in (w.get("pairs") or {}).items():
                for b, n in bs.items():
                    sampled[(a, b)] += n
    elif variant == "mirror":
        sampled = hook.pairs
    a_cpu = [w.get("cpu_s") for w in workers if w.get("node") == "a"]
    out.update(
        {
            "exact_counts": exact,
            "b_tuples_s": run.report["nodes"]["b"]["tuples_in"] / elapsed if elapsed else None,
            "a_cpu_s": round(sum(c for c in a_cpu if c is not None), 3) if a_cpu else None,
            "pairs_seen": sum(sampled.values()),
            "top_recall": recall(sampled, exact_pairs(count), keys_b0)
            if variant != "off"
            else None,
        }
    )
    if hook.watcher is not None:
        st = hook.watcher.stats
        out["debug"] = {
            k: st.get(k)
            for k in ("frames", "tuples", "seq_gaps", "switch_copied", "switch_sampled",
                      "switch_dropped", "ring_dropped", "cpu_s")
        }  # fmt: skip
    return out


@register
class PairsCost(Scenario):
    name = "pairs_cost"
    title = "Key-pair statistics: framework counter vs sampled mirror"
    figure = "issue 17 item 1"
    order = 21

    APPS = ["apps/live_debugger.py"]
    CONTROLLER_CONFIG = "metrics_interval = 0.5\n"
    QUICK_COUNT, FULL_COUNT = 1_000_000, 3_000_000  # seconds of full speed: the session is live

    def run(self, bench: Bench) -> ScenarioResult:
        count = self.QUICK_COUNT if bench.quick else self.FULL_COUNT
        res = self.result(bench)
        runs: dict[str, list[RunResult]] = {v: [] for v in VARIANTS}
        cluster = bench.testbed.app_cluster("q", self.APPS, self.CONTROLLER_CONFIG)
        try:
            for rnd in range(bench.repeats):
                for v in VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]:
                    runs[v].append(run_once(bench, cluster, v, count))
        finally:
            cluster.close()
        per = {v: [r.report.get("pairs_cost", {}) for r in rs] for v, rs in runs.items()}

        def med(v: str, key: str) -> float | None:
            return median(d.get(key) for d in per[v])

        off = med("off", "b_tuples_s")
        rows = []
        for v in VARIANTS:
            rate = med(v, "b_tuples_s")
            rows.append(
                [
                    v,
                    fmt_rate(rate)
                    + f" ({', '.join(fmt_rate(d.get('b_tuples_s')) for d in per[v])})",
                    fmt_num(rate / off if rate and off else None),
                    fmt_num(med(v, "a_cpu_s")),
                    fmt_num(med(v, "pairs_seen"), 0),
                    fmt_num(med(v, "top_recall")),
                    f"{sum(bool(d.get('exact_counts')) for d in per[v])}/{len(per[v])}",
                ]
            )
            if v != "off":
                res.ratios.append(
                    Ratio(f"pairs {v}: b throughput / off", rate / off if rate and off else None)
                )
        res.summary = {v: per[v] for v in VARIANTS}
        res.tables.append(
            Table(
                f"{self.title}: {count} tuples of 100 B, {HOSTS} hosts, 80% correlated pairs "
                f"over {KEYS} keys (medians over the runs)",
                [
                    "variant",
                    "b tuples/s (runs)",
                    "/ off",
                    "a CPU s",
                    "pairs seen",
                    f"top-{TOP} recall (b[0])",
                    "exact counts",
                ],  # fmt: skip
                rows,
                note=(
                    f"counter: config locality {COUNTER} in the a workers; mirror: a debug "
                    f"session on b[0]'s input at {MIRROR_RATE} frames/s, every copied tuple "
                    "shipped; "
                    f"recall: share of the exact top-{TOP} pairs toward b[0]'s keys among the "
                    "sample's."
                ),
            )
        )
        return res
