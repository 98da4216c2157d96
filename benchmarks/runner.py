"""``typhoon bench``: run the scenarios and write ``benchmarks/results/<date>/``.

Output directory contents:

* ``results.md``: machine, headline ratios against their targets, one table
  and the plots per scenario;
* ``results.json``: the same numbers plus every run's record (per-worker
  counters, sequence checks, CPU);
* ``machine.json``: the machine description alone;
* one PNG per paper figure.

Running ``--only`` a scenario into a directory that already has results
replaces that scenario's results and keeps the others, so a day's partial
runs add up to one document.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from benchmarks import machine
from benchmarks.scenario import Bench, Scenario, ScenarioResult, run_scenario, scenarios
from benchmarks.testbed import Testbed

RESULTS_ROOT = Path(__file__).resolve().parent / "results"
REPEATS = {"quick": 1, "full": 3}


@dataclass
class BenchOptions:
    quick: bool = False
    only: list[str] = field(default_factory=list)  # scenario names; empty = all
    out: Path | None = None
    repeats: int | None = None  # rounds per point (default: 1 quick, 3 full)
    workdir: Path | None = None  # keep cluster logs and worker reports here
    tcp_mtu: int | None = None  # tcp runs' frame size (None: the topologies', else 64,000)


def default_out_dir(quick: bool) -> Path:
    return RESULTS_ROOT / (time.strftime("%Y-%m-%d") + ("-quick" if quick else ""))


def select(only: list[str]) -> list[type[Scenario]]:
    """The scenarios to run, in suite order; ValueError names an unknown one."""
    known = scenarios()
    if not only:
        return known
    by_name = {s.name: s for s in known}
    wanted = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ValueError(
            f"unknown scenario {', '.join(repr(n) for n in unknown)} (known: {', '.join(by_name)})"
        )
    return [s for s in known if s.name in wanted]


def run_bench(options: BenchOptions, out: TextIO = sys.stderr) -> int:
    """Run the selected scenarios, write the results; 1 if any run or scenario failed."""
    chosen = select(options.only)
    mode = "quick" if options.quick else "full"
    out_dir = options.out or default_out_dir(options.quick)
    out_dir.mkdir(parents=True, exist_ok=True)
    info = machine.describe()
    tmp = None
    if options.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="typhoon-bench-")
    workdir = options.workdir or Path(tmp.name)  # type: ignore[union-attr]
    testbed = Testbed(workdir, out, options.tcp_mtu)
    bench = Bench(testbed, out_dir, options.quick, options.repeats or REPEATS[mode], out=out)
    results: dict[str, ScenarioResult] = {}
    t0 = time.monotonic()
    try:
        for cls in chosen:
            print(f"{cls.name} ({cls.figure}), {mode} mode:", file=out, flush=True)
            result = run_scenario(cls(), bench)
            results[cls.name] = result
            status = f"error: {result.error}" if result.error else f"{result.failures} failed runs"
            print(f"{cls.name}: {result.elapsed_s:.0f} s, {status}", file=out, flush=True)
    finally:
        testbed.close()
        if tmp is not None:
            tmp.cleanup()
        info["load_average_end"] = machine.load_average()
        info["cluster_start_s"] = testbed.started_s
        if results:
            write_outputs(out_dir, info, results, time.monotonic() - t0)
            print(f"results in {out_dir}", file=out, flush=True)
    return 1 if any(r.failures for r in results.values()) else 0


def write_outputs(
    out_dir: Path, info: dict[str, Any], new: dict[str, ScenarioResult], elapsed_s: float
) -> None:
    """results.json (merged with what the directory holds), results.md, machine.json."""
    path = out_dir / "results.json"
    merged: dict[str, ScenarioResult] = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
            merged = {n: ScenarioResult.from_dict(d) for n, d in old["scenarios"].items()}
        except (ValueError, KeyError, TypeError):
            merged = {}  # an unreadable old file is replaced, not merged
    merged.update(new)
    order = {cls.name: (cls.order, cls.name) for cls in scenarios()}
    names = sorted(merged, key=lambda n: order.get(n, (99, n)))
    doc = {
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
        "last_run_s": round(elapsed_s, 1),
        "machine": info,
        "scenarios": {n: merged[n].to_dict() for n in names},
    }
    path.write_text(json.dumps(doc, indent=1))
    (out_dir / "machine.json").write_text(json.dumps(info, indent=1))
    (out_dir / "results.md").write_text(render_markdown(doc))


def _table(columns: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def render_markdown(doc: dict[str, Any]) -> str:
    """The human-readable results: machine, headline ratios, then each scenario."""
    info = doc["machine"]
    results = [ScenarioResult.from_dict(d) for d in doc["scenarios"].values()]
    lines = [f"# Typhoon benchmarks, {doc['written'][:10]}", ""]
    modes = sorted({r.mode for r in results})
    lines += [
        f"Mode: {', '.join(modes)}. Written {doc['written']} by `typhoon bench`; "
        "sdn and tcp runs interleaved, medians reported.",
        "",
        "## Machine",
        "",
    ]
    keys = [
        ("cpu", "CPU"),
        ("cores", "cores"),
        ("memory_gib", "memory (GiB)"),
        ("os", "OS"),
        ("kernel", "kernel"),
        ("python", "Python"),
        ("openvswitch", "Open vSwitch"),
        ("ovs_datapath", "OVS datapath"),
        ("ovs_malloc", "ovs-vswitchd malloc"),
        ("mininet", "Mininet"),
        ("ryu", "Ryu"),
        ("os_ken", "os-ken"),
        ("controller_backend", "controller on"),
        ("load_average_start", "load average at start"),
        ("load_average_end", "load average at end"),
    ]
    lines += _table(["", ""], [[label, str(info.get(k, "–"))] for k, label in keys])
    lines += ["", "## Headline ratios", ""]
    rows = []
    for r in results:
        for q in r.ratios:
            met = {True: "yes", False: "**no**", None: ""}[q.met]
            value = "–" if q.value is None else f"{q.value:.2f}"
            rows.append([q.name, value, q.target, met])
    lines += _table(["ratio", "value", "target", "met"], rows) if rows else ["(none)"]
    for r in results:
        lines += [
            "",
            f"## {r.title} ({r.figure})",
            "",
            f"`{r.name}`, {r.mode} mode, started {r.started}, {r.elapsed_s:.0f} s, "
            f"{len(r.runs)} runs, {r.failures} failed"
            + (f", load average {r.load[0]:g} -> {r.load[1]:g}." if len(r.load) == 2 else "."),
            "",
        ]
        if r.error:
            lines += [f"**The scenario failed:** {r.error}", ""]
        for t in r.tables:
            lines += [f"**{t.title}**", ""]
            lines += _table(t.columns, t.rows)
            if t.note:
                lines += ["", t.note]
            lines.append("")
        for png in r.plots:
            lines += [f"![{png}]({png})", ""]
        for n in r.notes:
            lines += [n, ""]
        failed = [run for run in r.runs if not run["ok"]]
        for run in failed[:10]:
            lines.append(f"- failed: {run['label']} [{run['transport']}]: {run['error']}")
        if failed:
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def need_root() -> str | None:
    """Why this process cannot run the benchmarks, or None."""
    if os.geteuid() != 0:
        return "typhoon bench needs root (Mininet hosts, Open vSwitch bridges, TAP devices)"
    return None
