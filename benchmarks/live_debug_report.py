"""The live-debug benchmark's tables (``benchmarks/scenarios/live_debug.py``): pure arithmetic.

Three ways of watching the same source are measured in one run, each round
running all three: the SDN mirror copying every frame (no meter, as the paper's
Fig. 12), the SDN mirror sampled by the switch's meter (the debugger's default),
and the application-level copy (Storm's event logger).  A mirror that samples
is cheap because it copies little: the tables put what each watcher *saw* next
to what it cost, so a sampled ratio is never read as "every tuple watched".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.scenario import Table
from benchmarks.stats import fmt_count, fmt_num, fmt_rate, median

FULL, SAMPLED, APP = "mirror every tuple", "mirror sampled", "app copy"
VARIANTS = (FULL, SAMPLED, APP)
# the attach request's ``rate`` per mirror variant: "all" = no meter; None = the
# controller's default (``[live_debugger] mirror_rate``, 200 frames/s)
MIRROR_RATES: dict[str, str | None] = {FULL: "all", SAMPLED: None}
HYPERVISOR = "stolen by the hypervisor"

Per = dict[str, list[dict[str, Any]]]


def round_orders(rounds: int) -> list[tuple[str, ...]]:
    """The variants' order in each round: each goes first in turn (paired per round)."""
    out = []
    for rnd in range(rounds):
        k = rnd % len(VARIANTS)
        out.append(VARIANTS[k:] + VARIANTS[:k])
    return out


def emitted_between(marks: Sequence[Sequence[float]], start: float, end: float) -> int | None:
    """Tuples the source emitted between its first mark at/after ``start`` and its last
    at/before ``end`` (marks: ``[wall, emitted, copies, cpu s]``, every 0.5 s)."""
    inside = [m for m in marks if start <= m[0] <= end]
    if len(inside) < 2:
        return None
    return int(inside[-1][1] - inside[0][1])


def copies(consumer: dict[str, Any], watched: int | None) -> dict[str, Any]:
    """What reached the watcher and what was dropped on the way, from a run's consumer.

    Mirror: tuples the debug worker read from its copies; frames the switch's meter
    left out (sampling), the debug port dropped (its queue was full), the debug
    worker's ring dropped (decoder behind).  ``coverage``: frames the debug worker
    read over those the source sent on the observed links between the first and
    the last copy (read + sequence gaps; the same window, exact).  App copy: copies
    the event logger received over those the source sent (exact); dropped in
    flight: sent, never received.  ``watched``: tuples the source emitted from the
    copy going live to the detach (its 0.5 s marks), for scale.
    """
    reached = consumer.get("copies_seen")
    if "switch_copied" in consumer or "ring_dropped" in consumer:
        meter, queue = consumer.get("switch_sampled"), consumer.get("switch_dropped")
        ring = consumer.get("ring_dropped")
        unit = "frames"
        frames, gaps = consumer.get("frames"), consumer.get("lost_copies")
        known = frames is not None and gaps is not None and frames + gaps > 0
        coverage = frames / (frames + gaps) if known else None
    else:
        sent = consumer.get("copies_sent")
        meter, ring = 0, 0
        queue = sent - reached if sent is not None and reached is not None else None
        unit = "tuples"
        coverage = reached / sent if reached is not None and sent else None
    return {
        "reached": reached,
        "meter_dropped": meter,
        "queue_dropped": queue,
        "ring_dropped": ring,
        "drop_unit": unit,
        "watched_emitted": watched,
        "coverage": coverage,
    }


def _med(per: Per, v: str, key: str) -> float | None:
    return median(d.get(key) for d in per[v])


def _copies_med(per: Per, v: str, key: str) -> float | None:
    return median((d.get("copies") or {}).get(key) for d in per[v])


def rounds_table(per: Per, orders: list[tuple[str, ...]]) -> Table:
    """Throughput attached/before of the three watchers, one row per round (paired)."""
    rows = []
    for rnd, order in enumerate(orders):
        row = [str(rnd + 1), " → ".join(order)]
        for v in VARIANTS:
            d = per[v][rnd] if rnd < len(per[v]) else {}
            row.append(fmt_num(d.get("attached_over_before")))
        rows.append(row)
    return Table(
        "Throughput attached / before, paired per round (each round runs all three)",
        ["round", "order", *VARIANTS],
        rows,
    )


def copies_table(per: Per) -> Table:
    """What each watcher saw and what it lost, next to its cost (medians over the runs)."""
    rows = []
    for v in VARIANTS:
        unit = next((d["copies"]["drop_unit"] for d in per[v] if d.get("copies")), "")
        rows.append(
            [
                v,
                fmt_num(_med(per, v, "attached_over_before")),
                fmt_rate(_copies_med(per, v, "watched_emitted")),
                fmt_rate(_copies_med(per, v, "reached")),
                fmt_num(_copies_med(per, v, "coverage"), 4),
                fmt_count([(d.get("copies") or {}).get("meter_dropped") for d in per[v]]),
                fmt_count([(d.get("copies") or {}).get("queue_dropped") for d in per[v]]),
                fmt_count([(d.get("copies") or {}).get("ring_dropped") for d in per[v]]),
                unit,
                fmt_num(_med(per, v, "consumer_cpu_s"), 1),
            ]
        )
    return Table(
        "What each watcher saw: copies that reached it and copies dropped on the way "
        "(medians; drops summed over the runs)",
        [
            "variant",
            "attached/before",
            "tuples emitted while watched",
            "tuples that reached the watcher (session)",
            "share of the copies seen",
            "dropped by the meter (sampling)",
            "dropped at the port / in flight",
            "dropped in the debug worker's ring",
            "drops in",
            "watcher CPU s",
        ],
        rows,
        note=(
            "Mirror: the debug worker counts every tuple in every copy it reads over the "
            "session's life (it decodes and ships a sample of them); share: frames it read "
            "over frames the source sent between its first and last copy (read + sequence "
            "gaps); the switch's meter counters (sampling) and the "
            "debug port's tx_dropped (its queue was full) are frames of up to 100 tuples. "
            "'Mirror every tuple' has no meter (`typhoon debug attach --rate all`): what it "
            "misses, the port or the debug worker dropped. App copy: copies the event "
            "logger received; share: over the copies the source sent; in flight: sent by the "
            "source but not received."
        ),
    )


def total(cores: dict[str, float]) -> float:
    """Busy cores: every group but what the hypervisor took."""
    return sum(c for g, c in cores.items() if g != HYPERVISOR)


def cpu_rows(per: Per) -> dict[str, dict[str, tuple[float | None, float | None]]]:
    """group -> variant -> (cores before, cores attached): medians over the runs."""
    groups = sorted(
        {g for v in VARIANTS for d in per[v] for k in ("cpu_cores_before", "cpu_cores_attached")
         for g in (d.get(k) or {})}
    )  # fmt: skip
    out: dict[str, dict[str, tuple[float | None, float | None]]] = {}
    for g in [*groups, "total"]:
        out[g] = {}
        for v in VARIANTS:
            vals = []
            for key in ("cpu_cores_before", "cpu_cores_attached"):
                cores = [d.get(key) for d in per[v] if d.get(key)]
                vals.append(median(total(c) if g == "total" else c.get(g, 0.0) for c in cores))
            out[g][v] = (vals[0], vals[1])
    return out


def cpu_table(per: Per) -> Table:
    """Cores each process group used before and while attached (medians over the runs)."""
    rows = []
    for g, by_v in cpu_rows(per).items():
        row = [g]
        for v in VARIANTS:
            b, a = by_v[v]
            row += [
                fmt_num(b),
                fmt_num(a),
                fmt_num(a - b if a is not None and b is not None else None),
            ]
        rows.append(row)
    return Table(
        "CPU by process, cores (median over the runs): before the attach and while attached",
        ["process", *(f"{v} {c}" for v in VARIANTS for c in ("before", "attached", "added"))],
        rows,
        note=(
            "Sampled from /proc every 0.5 s (`benchmarks/cpu_sampler.py`) over the same "
            "stretches as the throughput; a process started inside a stretch (the debug "
            "worker) is charged from its start. The machine has 2 cores: what watching adds "
            "anywhere comes out of what source, sink and switch get."
        ),
    )


def table5(per: Per) -> Table:
    """Paper Table 5, with the serializations measured here."""
    ser = {v: fmt_num(_med(per, v, "serializations_per_tuple_attached")) for v in VARIANTS}
    latency = fmt_num(median(d.get("attach_latency_s") for v in (FULL, SAMPLED) for d in per[v]))
    return Table(
        "Table 5: Storm-style event logger vs Typhoon live debugger (as measured here)",
        ["property", "app copy (Storm's event logger)", "mirror (Typhoon)"],
        [
            [
                "debugging granularity",
                "the whole source node (a stream provisioned in the topology)",
                "one worker, one direction, with a filter",
            ],
            [
                "resources",
                "event-logger worker and its connections for the whole run",
                "a debug worker started on attach, stopped on detach",
            ],
            [
                "dynamic provisioning",
                "no (in the topology at deployment; switched on by SIGNAL)",
                f"yes: attach to live in {latency} s",
            ],
            [
                "serializations per tuple while watched",
                ser[APP],
                f"{ser[FULL]} (every tuple) / {ser[SAMPLED]} (sampled)",
            ],
        ],
    )
