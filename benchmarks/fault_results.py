"""One fault run's measurements and how the fault scenarios report them.

``benchmarks/scenarios/fault.py`` (port events versus heartbeats) and
``benchmarks/scenarios/recovery.py`` (each guarantee) kill a split worker of
wordcount and follow the count workers' input; a :class:`FaultRun` holds what
one run saw, :class:`FaultResults` turns the runs into the table, the headline
ratios and the plot (medians per variant).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.plots import time_series
from benchmarks.scenario import Bench, Ratio, ScenarioResult, Table
from benchmarks.stats import fmt_num, fmt_rate, fmt_ratio, median, ratio

VARIANTS = ("port events", "heartbeat only", "exactly once", "at least once")
METRICS_S = 0.25
BIN_S = 0.5
RECOVERED_S = 2.0  # the rate counts as recovered once this long at >= 80% of before
MAX_AFTER_S = 15.0  # longest a run follows an unrecovered rate after its usual window
Medians = dict[str, float | None]  # variant -> median over its runs


@dataclass
class FaultRun:
    """One run of one variant: the timeline and what the fault detector reported."""

    variant: str
    label: str
    ok: bool = False
    error: str = ""
    wall_s: float = 0.0
    killed: float = 0.0  # time.time() of the SIGKILL
    victim: int = 0
    incident: dict[str, Any] = field(default_factory=dict)
    series: list[tuple[float, float]] = field(default_factory=list)  # (s from kill, words/s)
    before: float | None = None  # count words/s in the pre-fault window
    after: float | None = None  # ... in the last seconds of the run (recovered)
    below_s: float | None = None
    deficit: float | None = None
    recovered_s: float | None = None
    sent: int | None = None  # sentences the source emitted
    received: int | None = None  # ... the split workers took in
    replacement_in: int = 0

    @property
    def detection_ms(self) -> float | None:
        if not self.incident:
            return None
        return (self.incident["detected_wall"] - self.killed) * 1000

    @property
    def kill_to_reroute_ms(self) -> float | None:
        d, r = self.detection_ms, self.incident.get("reroute_ms")
        return None if d is None or r is None else d + r

    @property
    def kill_to_acked_ms(self) -> float | None:
        d, r = self.detection_ms, self.incident.get("reroute_acked_ms")
        return None if d is None or r is None else d + r

    @property
    def lost(self) -> int | None:
        return None if self.sent is None or self.received is None else self.sent - self.received

    def record(self) -> dict[str, Any]:
        """The run's entry in ``results.json``."""
        return {
            "transport": "sdn",
            "hosts": 3,
            "label": self.label,
            "variant": self.variant,
            "ok": self.ok,
            "error": self.error,
            "wall_s": round(self.wall_s, 3),
            "victim": self.victim,
            "incident": self.incident,
            "detection_ms": self.detection_ms,
            "kill_to_reroute_ms": self.kill_to_reroute_ms,
            "kill_to_acked_ms": self.kill_to_acked_ms,
            "count_before_words_s": self.before,
            "count_after_words_s": self.after,
            "below_80pct_s": self.below_s,
            "deficit_words": self.deficit,
            "recovered_s": self.recovered_s,
            "sentences_sent": self.sent,
            "sentences_received": self.received,
            "sentences_lost": self.lost,
            "replacement_in": self.replacement_in,
            "series": [[round(t, 2), round(r, 1)] for t, r in self.series],
        }


class FaultResults:
    """The report half of the fault scenarios (a mixin of their ``Scenario``)."""

    title: str
    variants: tuple[str, ...]
    HEARTBEAT_S: float
    RATE: int
    WORDS: int
    comparison: str
    plot_file: str
    plot_title: str

    def describe(
        self,
        bench: Bench,
        res: ScenarioResult,
        runs: dict[str, list[FaultRun]],
        p: dict[str, float],
    ) -> None:
        variants = self.variants
        ok = {v: [r for r in runs[v] if r.ok] for v in variants}

        def med(v: str, f: Callable[[FaultRun], float | None]) -> float | None:
            return median(f(r) for r in ok[v])

        detect = {v: med(v, lambda r: r.detection_ms) for v in variants}
        reroute = {v: med(v, lambda r: r.incident.get("reroute_ms")) for v in variants}
        acked = {v: med(v, lambda r: r.kill_to_acked_ms) for v in variants}
        k2r = {v: med(v, lambda r: r.kill_to_reroute_ms) for v in variants}
        before = {v: med(v, lambda r: r.before) for v in variants}
        after = {v: med(v, lambda r: r.after) for v in variants}
        below = {v: med(v, lambda r: r.below_s) for v in variants}
        deficit = {v: med(v, lambda r: r.deficit) for v in variants}
        lost = {v: med(v, lambda r: r.lost) for v in variants}
        rejoin = {v: med(v, lambda r: r.incident.get("rejoined_ms")) for v in variants}
        back = {v: med(v, lambda r: r.recovered_s) for v in variants}
        rows = []
        for v in variants:
            rows.append(
                [
                    v,
                    fmt_num(detect[v], 1),
                    fmt_num(reroute[v], 2),
                    fmt_num(acked[v], 1),
                    fmt_num(k2r[v], 1),
                    fmt_num(rejoin[v], 0),
                    fmt_rate(before[v]),
                    fmt_rate(after[v]),
                    fmt_ratio(ratio(after[v], before[v])),
                    fmt_num(below[v], 1),
                    fmt_num(back[v], 1),
                    fmt_rate(deficit[v]),
                    fmt_rate(lost[v]),
                    f"{len(ok[v])}/{len(runs[v])}",
                ]
            )
        hb = self.HEARTBEAT_S
        res.tables.append(
            Table(
                f"{self.title}: a split worker of wordcount SIGKILLed (medians over runs)",
                [
                    "detection",
                    "kill -> detected ms",
                    "detected -> ROUTING written ms",
                    "kill -> ROUTING acked ms",
                    "kill -> rerouted ms",
                    "detected -> replacement routed ms",
                    "count words/s before",
                    "count words/s after",
                    "after/before",
                    "s below 80%",
                    "kill -> 80% again s",
                    "words short of pre-fault rate",
                    "sentences lost",
                    "runs ok",
                ],
                rows,
                note=(
                    f"1 source at {self.RATE:,} sentences/s of {self.WORDS} words, 2 split, 4 "
                    f"count workers on 3 emulated hosts; METRIC_RESP every {METRICS_S:g} s, "
                    f"heartbeat_timeout {hb:g} s; throughput in {BIN_S:g} s bins of the count "
                    f"workers' input. 'after' is the last {RECOVERED_S:g} s of the run; a run "
                    f"follows the rate until {p['post']:g} s after the reroute, longer "
                    f"(up to {MAX_AFTER_S:g} s more) until it has recovered. "
                    "'words short' integrates pre-fault rate minus rate from the kill to the "
                    "end (lost and late words). " + self.comparison
                ),
            )
        )
        res.ratios += self.headline(lost, back, k2r, detect, after, before, below)
        res.summary = {
            "rate_sentences_s": self.RATE,
            "heartbeat_timeout_s": hb,
            "bin_s": BIN_S,
            "variants": {
                v: {
                    "kill_to_detection_ms": detect[v],
                    "detection_to_reroute_ms": reroute[v],
                    "kill_to_acked_ms": acked[v],
                    "kill_to_reroute_ms": k2r[v],
                    "detection_to_rejoined_ms": rejoin[v],
                    "count_before_words_s": before[v],
                    "count_after_words_s": after[v],
                    "below_80pct_s": below[v],
                    "deficit_words": deficit[v],
                    "sentences_lost": lost[v],
                    "kill_to_80pct_again_s": back[v],
                }
                for v in variants
            },
        }
        shown = {v: ok[v][0] for v in variants if ok[v]}
        if shown:
            markers = [(0.0, "split worker killed", "")]
            for v, r in shown.items():
                if r.kill_to_reroute_ms is not None:
                    markers.append((r.kill_to_reroute_ms / 1000, f"rerouted ({v})", v))
                rj = r.incident.get("rejoined_ms")
                if rj is not None and r.detection_ms is not None:
                    markers.append(((r.detection_ms + rj) / 1000, f"replacement in ({v})", v))
            res.plots.append(
                time_series(
                    bench.out_dir / self.plot_file,
                    self.plot_title,
                    {
                        v: ([t for t, _ in r.series], [x for _, x in r.series])
                        for v, r in shown.items()
                    },
                    "words/s into the count workers",
                    markers,
                    xlabel="seconds since the kill",
                    note=f"first run of each variant; {BIN_S:g} s bins; heartbeat_timeout {hb:g} s",
                )
            )

    def headline(
        self,
        lost: Medians,
        back: Medians,
        k2r: Medians,
        detect: Medians,
        after: Medians,
        before: Medians,
        below: Medians,
    ) -> list[Ratio]:
        """The ratios of results.md's headline table (medians per variant)."""
        pe, ho, eo, al = VARIANTS
        hb = self.HEARTBEAT_S
        return [
            Ratio(
                "fault: sentences lost, exactly once",
                lost[eo],
                "0",
                None if lost[eo] is None else lost[eo] == 0,
            ),
            Ratio("fault: kill -> count rate back at 80%, exactly once (s)", back[eo]),
            Ratio(
                "fault: sentences lost, at least once",
                lost[al],
                "0",
                None if lost[al] is None else lost[al] == 0,
            ),
            Ratio(
                "fault: kill -> ROUTING written around the dead worker, port events (ms)",
                k2r[pe],
                "<= 100",
                None if k2r[pe] is None else k2r[pe] <= 100,
            ),
            Ratio(
                f"fault: kill -> detection, heartbeat only ({hb:g} s timeout) (s)", _s(detect[ho])
            ),
            Ratio(
                "fault: kill -> reroute time, heartbeat only / port events",
                ratio(k2r[ho], k2r[pe]),
            ),
            Ratio.against(
                "fault: count throughput after / before the kill, port events",
                ratio(after[pe], before[pe]),
                at_least=0.8,
            ),
            Ratio(f"fault: seconds below 80% of the pre-fault rate, {pe}", below[pe]),
            Ratio(f"fault: seconds below 80% of the pre-fault rate, {ho}", below[ho]),
        ]


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000
