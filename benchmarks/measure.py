"""Numbers out of one run's result: throughput, loss, CPU per tuple, latency.

Throughput is measured at the sink, from its first to its last arrival: the
source's own count would include what still sits in socket buffers and
switch queues when it stops.  Every function returns None for a failed run,
so that medians skip it instead of counting a zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.testbed import RunResult


def sink_rates(run: RunResult, node: str = "sink") -> list[float] | None:
    """Tuples/s received by each worker of ``node`` (first to last arrival)."""
    if not run.ok:
        return None
    rates = []
    for w in run.node_result(node).get("per_worker", []):
        span = w["last_s"] - w["first_s"]
        rates.append(w["received"] / span if span > 0 else 0.0)
    return rates or None


def throughput(run: RunResult, node: str = "sink") -> float | None:
    """Tuples/s into ``node``, all its workers together."""
    rates = sink_rates(run, node)
    return sum(rates) if rates else None


def per_sink(run: RunResult, node: str = "sink") -> float | None:
    """Mean tuples/s of one worker of ``node`` (one-to-many: each gets every tuple)."""
    rates = sink_rates(run, node)
    return sum(rates) / len(rates) if rates else None


def lost(run: RunResult, node: str = "sink", acker: str = "acker") -> int | None:
    """Tuples that never arrived (sequence check), plus trees an acker never completed."""
    if not run.ok:
        return None
    missing = run.node_result(node).get("missing")
    if missing is None:
        return None
    pending = run.node_result(acker).get("pending", 0) if acker else 0
    return int(missing) + int(pending or 0)


def duplicates(run: RunResult, node: str = "sink") -> int | None:
    if not run.ok:
        return None
    dups = run.node_result(node).get("duplicates")
    return None if dups is None else int(dups)


def emitted(run: RunResult, node: str = "source") -> int:
    return sum(w["result"]["emitted"] for w in run.node_workers(node) if w.get("result"))


def cpu_us_per_tuple(run: RunResult, node: str = "source") -> float | None:
    """CPU microseconds the ``node`` worker(s) spent per tuple emitted (user + system)."""
    if not run.ok:
        return None
    n = emitted(run, node)
    cpu = sum(w.get("cpu_s") or 0.0 for w in run.node_workers(node))
    return cpu / n * 1e6 if n else None


def latency_quantiles(run: RunResult, node: str = "sink") -> list[float] | None:
    """Latency quantiles (q = i/1000, seconds) of the first worker of ``node``."""
    if not run.ok:
        return None
    workers = run.node_result(node).get("per_worker", [])
    return (workers[0].get("quantiles_s") or None) if workers else None


def percentile(quantiles: list[float] | None, p: float) -> float | None:
    """The ``p`` percentile (0..1) from a quantile list as :func:`latency_quantiles` gives."""
    if not quantiles:
        return None
    return quantiles[min(len(quantiles) - 1, round(p * (len(quantiles) - 1)))]


def sink_cpu_us_per_tuple(run: RunResult, node: str = "sink") -> float | None:
    """Mean over ``node``'s workers of CPU microseconds per tuple received."""
    if not run.ok:
        return None
    per = [
        (w.get("cpu_s") or 0.0) / w["result"]["received"] * 1e6
        for w in run.node_workers(node)
        if w.get("result") and w["result"].get("received")
    ]
    return sum(per) / len(per) if per else None


def total_cpu_us_per_tuple(run: RunResult, node: str = "source") -> float | None:
    """CPU microseconds per emitted tuple of every worker plus the switch (ovs-vswitchd).

    ``cores * 1e6`` divided by this is the rate the machine could sustain if the
    run were purely CPU-bound: a ceiling to hold a measured rate against.  The
    switch's share includes whatever else used Open vSwitch meanwhile.
    """
    if not run.ok:
        return None
    n = emitted(run, node)
    cpu = sum(w.get("cpu_s") or 0.0 for w in run.workers) + (run.ovs_cpu_s or 0.0)
    return cpu / n * 1e6 if n else None


def frame_sizes(measured: Mapping[tuple[Any, str], list[RunResult]]) -> dict[str, str]:
    """Each transport's frame size in runs keyed by (point, transport), for a table's
    note: "64,000", or "9,000 / 64,000" if its runs differ."""
    sizes: dict[str, set[int]] = {}
    for (_, transport), runs in sorted(measured.items(), key=lambda kv: kv[0][1]):
        sizes.setdefault(transport, set()).update(r.frame_bytes for r in runs if r.frame_bytes)
    return {t: " / ".join(f"{b:,}" for b in sorted(bs)) or "?" for t, bs in sizes.items()}
