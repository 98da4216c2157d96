"""Live per-node rates from successive METRIC_RESP snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def data_tuples(counts: dict[str, int]) -> int:
    """Tuples of a METRIC_RESP's per-stream counts (``in`` or ``out``), stream 0 (control
    punctuation) left out."""
    return sum(v for k, v in counts.items() if k != "0")


@dataclass
class LiveRates:
    """Turns per-worker counters into per-node tuples/s between two polls."""

    nodes: list[str]
    last: dict[int, tuple[float, int, int]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    def update(self, elapsed: float, metrics: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """Record one poll; return ``{node: {"in": rate, "out": rate}}``."""
        rates: dict[str, dict[str, float]] = {n: {"in": 0.0, "out": 0.0} for n in self.nodes}
        for wid, m in metrics.items():
            now, tin, tout = m["time"], data_tuples(m["in"]), data_tuples(m["out"])
            prev = self.last.get(wid)
            self.last[wid] = (now, tin, tout)
            if prev is None or now <= prev[0]:
                continue
            dt = now - prev[0]
            r = rates.setdefault(m["node"], {"in": 0.0, "out": 0.0})
            r["in"] += (tin - prev[1]) / dt
            r["out"] += (tout - prev[2]) / dt
        self.history.append({"t": round(elapsed, 3), "rates": rates})
        return rates

    @staticmethod
    def format(elapsed: float, rates: dict[str, dict[str, float]]) -> str:
        parts = []
        for node, r in rates.items():
            text = []
            if r["in"]:
                text.append(f"in {r['in']:,.0f}/s")
            if r["out"]:
                text.append(f"out {r['out']:,.0f}/s")
            parts.append(f"{node} {' '.join(text) or 'idle'}")
        return f"[{elapsed:6.1f}s] " + " | ".join(parts)
