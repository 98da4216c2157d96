"""The tables of this directory's README from its attach-*.json and startup-*.md files."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ATTACH_KEYS = (
    "attach -> first tuple printed",
    "attach -> first frame",
    "attach -> debug worker started",
    "debug worker started -> port up",
)


def attach_table() -> list[str]:
    out = [
        "| pair | run | UTC | load | " + " | ".join(ATTACH_KEYS) + " |",
        "|---" * (4 + len(ATTACH_KEYS)) + "|",
    ]
    pooled: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for i in range(1, 10):
        for v in ("before", "after"):
            path = HERE / f"attach-{v}-{i}.json"
            if not path.exists():
                continue
            doc = json.loads(path.read_text())
            med = doc["median"]
            for r in doc["rows"]:
                for k in ATTACH_KEYS:
                    if r.get(k) is not None:
                        pooled[v].setdefault(k, []).append(r[k])
            load = f"{min(doc['load']):.1f}-{max(doc['load']):.1f}"
            cells = [str(med.get(k)) for k in ATTACH_KEYS]
            out.append(f"| {i} | {v} | {doc['when'][11:19]} | {load} | " + " | ".join(cells) + " |")
    for v in ("before", "after"):
        cells = [
            f"{statistics.median(pooled[v][k]):.3f} ({len(pooled[v][k])})"
            if pooled[v].get(k)
            else "-"
            for k in ATTACH_KEYS
        ]
        out.append(f"| all | {v} | | | " + " | ".join(cells) + " |")
    return out


def md_value(text: str, header: str, column: str) -> float | None:
    """A value from the first table in ``text`` whose header row has ``column`` after the
    bold line ``header``."""
    part = text.split(header, 1)
    if len(part) < 2:
        return None
    rows = [ln for ln in part[1].splitlines() if ln.startswith("|")]
    names = [c.strip() for c in rows[0].strip("|").split("|")]
    values = [c.strip() for c in rows[2].strip("|").split("|")]
    return float(values[names.index(column)]) if column in names else None


def startup_table() -> list[str]:
    cols = [
        ("sdn, 3 hosts", "cluster up"),
        ("sdn, 3 hosts", "workers up"),
        ("sdn, 3 hosts", "sdn up"),
        ("steps of EmulatedCluster", "controller"),
        ("sdn, 3 hosts", "sdn down"),
        ("tcp, the same", "tcp workers up"),
    ]
    out = [
        "| pair | run | started UTC | load at start | " + " | ".join(c for _, c in cols) + " |",
        "|---" * (4 + len(cols)) + "|",
    ]
    per: dict[str, list[list[float]]] = {"before": [], "after": []}
    for i in range(1, 20):
        for v in ("before", "after"):
            path = HERE / f"startup-{v}-{i}.md"
            if not path.exists():
                continue
            text = path.read_text()
            m = re.search(r"started (\S+ \S+), .*?load average ([\d.]+)", text)
            vals = [md_value(text, h, c) for h, c in cols]
            per[v].append(vals)  # type: ignore[arg-type]
            when, load = (m[1][11:], m[2]) if m else ("?", "?")
            out.append(
                f"| {i} | {v} | {when} | {load} | "
                + " | ".join("-" if x is None else f"{x:.2f}" for x in vals)
                + " |"
            )
    for v in ("before", "after"):
        meds = [
            statistics.median(r[j] for r in per[v]) if per[v] else None for j in range(len(cols))
        ]
        out.append(
            f"| median | {v} | | | "
            + " | ".join("-" if x is None else f"{x:.2f}" for x in meds)
            + " |"
        )
    return out


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "both"
    if which in ("attach", "both"):
        print("\n".join(attach_table()))
    if which in ("startup", "both"):
        print("\n".join(startup_table()))
