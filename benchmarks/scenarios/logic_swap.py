"""Scenario 7, logic swap (paper Fig. 14): a windowed count over time through a filter swap.

The ad-analytics pipeline (``topologies/ad_analytics.yaml``: events -> parse
-> filter -> projection -> per-campaign 10-second event-time window count ->
sink) runs on two emulated hosts over ``sdn``.  Once a third of the events
are out, the filter's logic is swapped from ``event_type == view`` to
``event_type in (view, click)`` through the controller's REST API (the
reconfiguration executor: new filter worker, rules, ROUTING, commit, drain).

Measured, per 10-second window (summed over campaigns): the final count,
against two references computed from the same generated events (views only,
views and clicks).  ``events`` and ``parse`` have one worker each, so the old
filter worker's input count is the index of the first event the new filter
saw; the windows before it must count views only, those after it views and
clicks, the one it falls in lies between, and every window must equal the
reference for that cut (a lost or doubled tuple shows).  Also: the time from
the request to the commit and to the end of the update.

Full mode counts on Spark (the paper's setting; a cold Spark driver takes
30-60 s to start here).  Quick mode runs the same pipeline on the python
engine's built-ins (``topologies/ad_analytics_native.yaml``: ``lookup`` and
``window_aggregate``, same 10-second windows, the watermark from the source's
event time) so it fits in well under a minute; its windows are emitted once,
final, so they carry no emit time of their newest event.  The ``tcp``
transport has no reconfiguration executor, so the scenario is sdn-only.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.plots import time_series
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_num, ratio
from benchmarks.testbed import RunResult
from typhoon.operators.ads import START_MS, per_window, reference_swap_counts
from typhoon.report import build_report, read_worker_reports
from typhoon.topology import load_topology
from typhoon.topology.batching import DEFAULTS
from typhoon.topology.model import Topology

ROOT = Path(__file__).resolve().parents[2]
AD_YAML = ROOT / "topologies" / "ad_analytics.yaml"
AD_NATIVE_YAML = ROOT / "topologies" / "ad_analytics_native.yaml"
SEED = 7
WINDOW_MS = 10_000
NEW_ARGS = {"field": "event_type", "values": ["view", "click"]}


def swap_topology(name: str, engine: str, count: int, rate: float, per_second: int) -> Topology:
    """``ad_analytics`` with the window count on ``engine``: spark, or python (the built-ins of
    ``ad_analytics_native``) for quick runs."""
    topo = load_topology(AD_YAML if engine == "spark" else AD_NATIVE_YAML)
    topo.name = name
    topo.nodes["events"].args.update(count=count, rate=rate, per_second=per_second, seed=SEED)
    if engine == "spark":
        params = topo.nodes["campaign_counts"].args["params"]
        params["campaigns"] = str(ROOT / params["campaigns"])
    else:
        lookup = topo.nodes["campaign"].args
        lookup["table"] = str(ROOT / lookup["table"])
    return topo


def final_counts(rows: list[list]) -> tuple[dict[tuple[str, int], int], int]:
    """(last count per (campaign, window), rows repeated): update mode's final result.

    Spark's rows are ``[campaign, start, end, count, ts]``, ``window_aggregate``'s
    ``[campaign, start, end, count]`` (one per window)."""
    final: dict[tuple[str, int], int] = {}
    for campaign, start, _end, count, *_ts in rows:
        final[(campaign, start)] = max(final.get((campaign, start), 0), count)
    return final, len(rows) - len({(r[0], r[1], r[3]) for r in rows})


def _wait(predicate, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def run_swap(bench: Bench, params: dict[str, Any]) -> tuple[RunResult, dict[str, Any]]:
    """One run with a swap at ``swap_fraction`` of the events; (run record, measurements)."""
    cluster = bench.testbed.sdn_cluster(params["hosts"])
    count, per_second = params["count"], params["per_second"]
    name = f"bench{next(bench.testbed.names):04d}-logic_swap"
    topo = swap_topology(name, params["engine"], count, params["rate"], per_second)
    DEFAULTS.write(topo.config)
    label = f"logic swap ({params['engine']} window count)"
    saved = cluster.options.start_timeout, cluster.options.timeout, cluster.options.duration
    cluster.options.start_timeout, cluster.options.timeout = 300.0, params["timeout"]
    cluster.options.duration = None
    t0 = time.monotonic()
    submitted = False
    try:
        cluster.submit(topo)
        submitted = True
        cluster.wait_active(name)
        active = time.time()
        old = {w.worker_id for w in cluster.coordinator.get_physical(name).of_node("views")}
        (source,) = [w.worker_id for w in cluster.coordinator.get_physical(name).of_node("events")]

        def emitted() -> int:
            metrics = cluster.coordinator.get_metrics(name).get(source, {})
            return sum(metrics.get("out", {}).values())

        _wait(lambda: emitted() >= params["swap_fraction"] * count, 300, "events before the swap")
        status, reply = cluster.rest(
            "POST", f"/apps/{name}/swap", {"node": "views", "operator": "filter", "args": NEW_ARGS}
        )
        if status != 202:
            raise RuntimeError(f"the controller refused the swap ({status}): {reply}")

        def finished() -> dict | None:
            record = cluster.rest("GET", f"/apps/{name}/reconfig")[1]
            return record if record["state"] != "running" else None

        record = _wait(finished, 240, "the swap to finish", 0.05)
        clean = cluster.wait_finished(name)
        elapsed = time.monotonic() - t0
        topology = cluster.coordinator.get_topology(name)
        cluster.kill(name)
        submitted = False
        workers = read_worker_reports(cluster.report_dir(name))
        report = build_report(topology, workers, transport="sdn", ok=clean, elapsed_s=elapsed)
    except Exception as e:
        if submitted and name in cluster.manager.list():
            cluster.kill(name)
        detail = traceback.format_exception_only(e)[-1].strip()
        result = RunResult("sdn", params["hosts"], label, False, time.monotonic() - t0, detail)
        return result, {}
    finally:
        cluster.options.start_timeout, cluster.options.timeout, cluster.options.duration = saved
    ok = clean and record["state"] == "done"
    error = "" if ok else f"swap {record['state']} {record['error']}; workers clean: {clean}"
    result = RunResult("sdn", params["hosts"], label, ok, elapsed, error, report, workers)
    return result, measure_swap(report, record, old, active, params)


def measure_swap(
    report: dict[str, Any],
    record: dict[str, Any],
    old: set[int],
    active: float,
    params: dict[str, Any],
) -> dict[str, Any]:
    """Per-window counts against the references, the cut, and the swap's timings."""
    count, per_second = params["count"], params["per_second"]
    views = [w for w in report["workers"] if w["node"] == "views"]
    cut = sum(sum(w["in"].values()) for w in views if w["worker"] in old)
    filtered = sum(sum(w["in"].values()) for w in views)
    rows = report["results"]["sink"]["tuples"]
    got, repeated = final_counts(rows)
    kw = {"seed": SEED, "per_second": per_second, "window_ms": WINDOW_MS}
    lo = per_window(reference_swap_counts(count, count, ("view",), (), **kw))
    hi = per_window(reference_swap_counts(count, 0, (), ("view", "click"), **kw))
    expected = reference_swap_counts(count, cut, ("view",), ("view", "click"), **kw)
    totals, exp = per_window(got), per_window(expected)
    swap_ms = START_MS + cut * 1000 // per_second
    steps, to_commit = record.get("steps", []), 0.0
    for s in steps:
        to_commit += s["seconds"]
        if s["action"] == "commit":
            break
    windows = []
    for start in sorted(set(lo) | set(totals)):
        side = "before" if start + WINDOW_MS <= swap_ms else "after" if start >= swap_ms else "swap"
        windows.append(
            {
                "start_s": (start - START_MS) / 1000,
                "count": totals.get(start, 0),
                "views": lo.get(start, 0),
                "views_clicks": hi.get(start, 0),
                "expected": exp.get(start, 0),
                "side": side,
                # when the window's newest counted event left the source (wall clock;
                # Spark's update rows carry it, window_aggregate's final rows do not)
                "emitted_s": max(
                    (r[4] for r in rows if r[1] == start), default=active
                ) - active if rows and len(rows[0]) > 4 else None,
            }
        )  # fmt: skip
    before = [w["count"] for w in windows if w["side"] == "before"]
    after = [w["count"] for w in windows if w["side"] == "after"]
    return {
        "events": count,
        "cut": cut,
        "swap_event_time_s": (swap_ms - START_MS) / 1000,
        "requested_s": record["started"] - active,
        "swap_s": record["seconds"],
        "to_commit_s": round(to_commit, 3),
        "state": record["state"],
        "windows": windows,
        "mean_before": sum(before) / len(before) if before else None,
        "mean_after": sum(after) / len(after) if after else None,
        "exact": got == expected,
        "filtered_all": filtered == count,
        "lost": sum(expected.values()) - sum(got.values()),
        "windows_off": sum(1 for k in set(got) | set(expected) if got.get(k) != expected.get(k)),
        "repeated_updates": repeated,
    }


@register
class LogicSwap(Scenario):
    name = "logic_swap"
    title = "Logic swap: windowed count through a filter swap"
    figure = "Fig. 14"
    order = 7

    # a 10 s window holds 10 * per_second events; events leave the source at `rate` per second
    FULL = {
        "engine": "spark",
        "hosts": 2,
        "count": 60_000,
        "rate": 1000,
        "per_second": 500,
        "swap_fraction": 1 / 3,
        "timeout": 300.0,
    }
    QUICK = {
        "engine": "python",
        "hosts": 2,
        "count": 20_000,
        "rate": 2000,
        "per_second": 250,
        "swap_fraction": 1 / 3,
        "timeout": 120.0,
    }

    def run(self, bench: Bench) -> ScenarioResult:
        params = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        result, m = run_swap(bench, params)
        bench.records.append(result.to_dict())
        print(
            f"  {result.label} [sdn]: {'ok' if result.ok else 'FAILED: ' + result.error} "
            f"({result.wall_s:.1f} s)",
            file=bench.out,
            flush=True,
        )
        if not result.ok:
            bench.failures += 1
        if not m:
            res.notes.append(f"the run failed: {result.error}")
            return res
        res.summary = {"params": params, **m}
        res.tables.append(
            Table(
                f"{self.title}: final count per 10 s event-time window, summed over campaigns",
                [
                    "window (s of event time)",
                    "counted",
                    "views (reference)",
                    "views + clicks (reference)",
                    "expected for the cut",
                    "side of the swap",
                    "last event emitted at (s)",
                ],
                [
                    [
                        f"{w['start_s']:.0f}–{w['start_s'] + WINDOW_MS / 1000:.0f}",
                        str(w["count"]),
                        str(w["views"]),
                        str(w["views_clicks"]),
                        str(w["expected"]),
                        w["side"],
                        fmt_num(w["emitted_s"], 1),
                    ]
                    for w in m["windows"]
                ],
                note=(
                    f"{params['engine']} window count, {m['events']:,} events at "
                    f"{params['rate']:,}/s on {params['hosts']} emulated hosts over sdn; swap "
                    f"requested {m['requested_s']:.1f} s after activation, committed after "
                    f"{m['to_commit_s']:.2f} s, done after {m['swap_s']:.2f} s; first event "
                    f"through the new filter: #{m['cut']:,} "
                    f"(event time {m['swap_event_time_s']:.1f} s). Every window equals the "
                    f"reference for that cut: {m['exact']}; "
                    f"{m['windows_off']} (campaign, window) counts differ. sdn only: the tcp "
                    "transport has no reconfiguration executor."
                ),
            )
        )
        res.ratios.append(
            Ratio.against(
                "logic swap: mean window count after / before the swap (views+clicks / views)",
                ratio(m["mean_after"], m["mean_before"]),
                at_least=1.5,
            )
        )
        res.ratios.append(Ratio("logic swap: seconds from the swap request to its commit",
                                m["to_commit_s"]))  # fmt: skip
        res.ratios.append(Ratio("logic swap: seconds from the request to the update's end",
                                m["swap_s"]))  # fmt: skip
        lost = Ratio("logic swap: counted events lost (reference for the cut - counted)", m["lost"])
        lost.target, lost.met = "= 0", m["lost"] == 0 and m["exact"]
        res.ratios.append(lost)
        ws = m["windows"]
        xs = [w["start_s"] for w in ws] + [ws[-1]["start_s"] + WINDOW_MS / 1000]
        res.plots.append(
            time_series(
                bench.out_dir / "fig14_logic_swap.png",
                f"Fig. 14: windowed count through a filter swap ({params['engine']} count, sdn)",
                {
                    "views (reference)": (xs, [w["views"] for w in ws] + [ws[-1]["views"]]),
                    "views + clicks (reference)": (
                        xs,
                        [w["views_clicks"] for w in ws] + [ws[-1]["views_clicks"]],
                    ),
                    "counted": (xs, [w["count"] for w in ws] + [ws[-1]["count"]]),
                },
                "events per 10 s window (all campaigns)",
                markers=[(m["swap_event_time_s"], "swap: first event through the new filter", "")],
                xlabel="event time (s)",
                note=(
                    f"swap committed {m['to_commit_s']:.2f} s after the request; "
                    f"lost {m['lost']}, exact per window: {m['exact']}"
                ),
            )
        )
        return res
