"""Summarize this directory's forwarding sessions: sdn/tcp per cell and geometric
means, ovs-vswitchd CPU per tuple and per data frame, and one plot.

    python benchmarks/results/2026-11-27-forwarding-equal/summarize.py
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _ratio(cell: str) -> float:
    return float(cell.rstrip("×"))


def session(path: Path) -> dict:
    data = json.loads((path / "results.json").read_text())
    fw = data["scenarios"]["forwarding"]
    rows = fw["tables"][0]["rows"]
    cells = {(r[0], r[1], int(r[2])): _ratio(r[5]) for r in rows}
    plain = [v for (_, acker, _), v in cells.items() if acker == "no"]
    ovs: dict[str, list[float]] = {}
    lost = 0
    for run in fw["runs"]:
        sink = run["results"].get("sink", {})
        lost += sink.get("missing", 0) + sink.get("duplicates", 0)
        if "acked" in run["label"] or run.get("ovs_cpu_s") is None:
            continue
        key = f"{run['transport']} {'LOCAL' if run['hosts'] == 1 else 'REMOTE'}"
        ovs.setdefault(key, []).append(run["ovs_cpu_s"] / sink["received"] * 1e6)
    return {
        "name": path.name,
        "started": fw["started"],
        "load": fw["load"],
        "malloc": data["machine"].get("ovs_malloc", "?"),
        "cells": cells,
        "geomean": math.exp(statistics.fmean(math.log(v) for v in plain)),
        "local100": cells[("LOCAL", "no", 100)],
        # the whole run's: cluster start and stop included, so tcp's LOCAL runs count too
        "ovs_us": {k: statistics.median(v) for k, v in ovs.items()},
        "lost_or_dup": lost,
        "failed": fw["failures"],
    }


def main() -> int:
    sessions = [session(p) for p in sorted(HERE.iterdir()) if (p / "results.json").exists()]
    print(
        "| session | started (UTC) | load start → end | ovs-vswitchd malloc | sdn/tcp geometric"
        " mean, no acker | LOCAL batch 100 | ovs-vswitchd µs per tuple, LOCAL sdn / tcp |"
        " REMOTE sdn / tcp | lost + dup | failed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in sessions:
        tuned = "tuned" if s["malloc"].startswith("GLIBC_TUNABLES set") else "glibc default"
        print(
            f"| {s['name']} | {s['started'][11:16]} | {s['load'][0]} → {s['load'][1]} | {tuned}"
            f" | {s['geomean']:.2f} | {s['local100']:.2f}"
            f" | {s['ovs_us']['sdn LOCAL']:.2f} / {s['ovs_us']['tcp LOCAL']:.2f}"
            f" | {s['ovs_us']['sdn REMOTE']:.2f} / {s['ovs_us']['tcp REMOTE']:.2f}"
            f" | {s['lost_or_dup']} | {s['failed']} |"
        )
    keys = list(sessions[0]["cells"])
    print("\n| cell | " + " | ".join(s["name"] for s in sessions) + " |")
    print("|---" * (len(sessions) + 1) + "|")
    for k in keys:
        label = f"{k[0]} {'acker ' if k[1] == 'yes' else ''}batch {k[2]}"
        print(f"| {label} | " + " | ".join(f"{s['cells'][k]:.2f}" for s in sessions) + " |")
    if "--no-plot" not in sys.argv:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plain = [k for k in keys if k[1] == "no"]
        fig, ax = plt.subplots(figsize=(8, 3.6))
        width = 0.8 / len(sessions)
        for i, s in enumerate(sessions):
            xs = [j + i * width for j in range(len(plain))]
            ax.bar(
                xs, [s["cells"][k] for k in plain], width, label=f"{s['name']} ({s['geomean']:.2f})"
            )
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(1.3, color="red", lw=0.8, ls="--", label="target 1.3")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(plain))])
        ax.set_xticklabels([f"{k[0].lower()}\nb={k[2]}" for k in plain], fontsize=8)
        ax.set_ylabel("sdn/tcp tuples/s")
        ax.set_title("forwarding, equal 64,000-byte frames (geometric mean in the legend)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(HERE / "sdn_tcp_by_session.png", dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
