"""Typhoon against Bytewax, the peer a Python user would pick (issue 33 item 6).

Two workloads, the same data in every system, run side by side in one bench
run: in each round every system runs each workload once, the order rotated
round by round so that the machine's drift hits all alike.

* **forward**: ``count`` tuples ``[src, seq, ts, 100-byte payload]`` from one
  source to a sink that checks every sequence number; tuples/s at the sink
  from its first arrival to its last (every tuple).  Typhoon: ``sequence_source``
  -> ``BenchSink`` on one host, two worker processes, batch 100, on the sdn and
  the tcp transport: every tuple crosses processes.  Bytewax (``-p 2``): one
  source partition, ``redistribute``, a sink on each worker: a random worker
  per item, so about half cross (the table gives the share); ``-p 1`` passes
  objects inside one process.
* **wordcount**: ``sentences`` sentences of ``typhoon.operators.sources.
  generate_sentences`` (8 words, vocabulary 500, seed 7), split into words and
  counted per word.  Typhoon: ``topologies/wordcount_chained.yaml``'s shape (2
  source workers each chained to its split worker by ``forward``, 4 count workers:
  6 processes, docs/topology.md "Chaining"); Bytewax: ``flat_map`` + ``fold_final``
  (``count_final``'s work) on 1 or 2 processes.  Rate: words arriving at the
  count step per clock tick (``benchmarks.arrivals``), between 10% and 90% of
  all words (the steady-state window), divided by the words per sentence.

Every system's word counts are held against the counts computed from the
generator: a run whose counts differ, or whose forward lost or duplicated a
tuple, is a failed run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks import measure
from benchmarks.arrivals import Arrivals, steady_rate
from benchmarks.bytewax_runs import BytewaxRun, run_bytewax
from benchmarks.peer_checks import count_diff, expected_word_counts
from benchmarks.plots import bar_panels
from benchmarks.scenario import Bench, Ratio, Scenario, ScenarioResult, Table, register
from benchmarks.stats import fmt_num, fmt_rate, median, ratio
from benchmarks.testbed import RunResult, RunSpec
from benchmarks.topologies import forwarding, wordcount

SYSTEMS = ("sdn", "tcp", "bytewax -p 1", "bytewax -p 2")
WORKLOADS = ("forward", "wordcount")
BATCH = 100  # Typhoon's I/O batch and Bytewax's source batch
SIZE = 100  # forward payload bytes
WORDS, VOCABULARY, SEED = 8, 500, 7


@dataclass
class Outcome:
    """One run of one system on one workload, reduced to what the table shows."""

    system: str
    workload: str
    ok: bool
    error: str = ""
    rate: float | None = None  # forward: tuples/s at the sink; wordcount: sentences/s steady
    wall_s: float | None = None
    lost: int | None = None
    extra: int | None = None  # duplicates (forward) or counts above the expected
    crossed: float | None = None  # forward: share of tuples that crossed processes
    record: dict[str, Any] = field(default_factory=dict)


def typhoon_outcome(
    workload: str, run: RunResult, expected: dict[str, int] | None, words: int
) -> Outcome:
    """The numbers of a Typhoon run (``expected``: the word counts, for wordcount)."""
    out = Outcome(run.transport, workload, run.ok, run.error, wall_s=run.wall_s)
    if not run.ok:
        return out
    if workload == "forward":
        out.rate, out.crossed = measure.throughput(run), 1.0
        out.lost, out.extra = measure.lost(run), measure.duplicates(run)
        return out
    count = run.node_result("count")
    diff = count_diff(expected or {}, count.get("counts", {}))
    out.lost, out.extra = diff.lost, diff.extra
    words_s = steady_rate(Arrivals.from_dict(count.get("arrivals", {})))
    out.rate = None if words_s is None else words_s / words
    return out


def bytewax_outcome(
    system: str, run: BytewaxRun, count: int, expected: dict[str, int] | None, words: int
) -> Outcome:
    """The numbers of a Bytewax run, checked as a Typhoon run's are."""
    out = Outcome(system, run.flow, run.ok, run.error, wall_s=run.wall_s)
    if not run.ok:
        return out
    if run.flow == "forward":
        seq = run.sequence(count)
        out.rate, out.lost, out.extra = run.sink_rate(), seq.missing, seq.duplicates
        out.crossed = run.crossed() / seq.received if seq.received else None
    else:
        diff = count_diff(expected or {}, run.counts())
        out.lost, out.extra = diff.lost, diff.extra
        words_s = steady_rate(run.arrivals())
        out.rate = None if words_s is None else words_s / words
    return out


def fail_on_loss(out: Outcome) -> None:
    """A run that lost or added anything is a failed run, not a point."""
    if out.ok and (out.lost or out.extra):
        out.ok = False
        out.error = f"{out.lost} lost, {out.extra} extra against the expected {out.workload}"


def paired(
    outcomes: list[list[Outcome]], a: str, b: str, workload: str
) -> tuple[float | None, list[float | None]]:
    """Median over rounds of ``a``'s rate / ``b``'s on ``workload`` (same round), and the
    per-round ratios."""
    per_round = []
    for rnd in outcomes:
        by = {(o.system, o.workload): o for o in rnd}
        oa, ob = by.get((a, workload)), by.get((b, workload))
        ok = oa is not None and ob is not None and oa.ok and ob.ok
        per_round.append(ratio(oa.rate, ob.rate) if ok else None)  # type: ignore[union-attr]
    return median(per_round), per_round


@register
class Peers(Scenario):
    name = "peers"
    title = "Typhoon (sdn, tcp) against Bytewax"
    figure = "issue 33"
    order = 30

    FULL = {"forward": 500_000, "sentences": 200_000}
    QUICK = {"forward": 200_000, "sentences": 50_000}

    def run(self, bench: Bench) -> ScenarioResult:
        params = self.QUICK if bench.quick else self.FULL
        res = self.result(bench)
        expected = expected_word_counts(params["sentences"], SEED, WORDS, VOCABULARY)
        rounds: list[list[Outcome]] = []
        for rnd in range(bench.repeats):
            k = rnd % len(SYSTEMS)
            order = SYSTEMS[k:] + SYSTEMS[:k]
            outcomes = []
            for workload in WORKLOADS:
                for system in order:
                    outcomes.append(self.one(bench, system, workload, params, expected))
            rounds.append(outcomes)
        self.describe(res, bench, rounds, params)
        return res

    def one(
        self,
        bench: Bench,
        system: str,
        workload: str,
        params: dict[str, int],
        expected: dict[str, int],
    ) -> Outcome:
        count = params["forward"] if workload == "forward" else params["sentences"]
        label = f"peers {workload} {count}"
        if system in ("sdn", "tcp"):
            if workload == "forward":
                topology = forwarding("peers-fwd", size=SIZE, count=count)
            else:
                topology = wordcount("peers-wc", count, SEED, WORDS, VOCABULARY, chained=True)
            box: list[Outcome] = []

            def check(r: RunResult) -> None:
                out = typhoon_outcome(workload, r, expected, WORDS)
                fail_on_loss(out)
                r.ok, r.error = out.ok, out.error
                box.append(out)

            run = bench.run(RunSpec(system, 1, topology, batch_size=BATCH, label=label), check)
            return box[0] if box else typhoon_outcome(workload, run, expected, WORDS)
        processes = int(system.rsplit(" ", 1)[1])
        if workload == "forward":
            args: dict[str, Any] = {"count": count, "size": SIZE, "batch": BATCH}
        else:
            args = {"count": count, "seed": SEED, "words": WORDS, "vocabulary": VOCABULARY}
            args["batch"] = BATCH
        bw = run_bytewax(workload, processes, args, bench.testbed.workdir / "bytewax")
        out = bytewax_outcome(system, bw, count, expected, WORDS)
        fail_on_loss(out)
        record = {**bw.to_dict(), "transport": system, "label": label, "hosts": 1}
        record["ok"], record["error"] = out.ok, out.error
        bench.record(record, out.ok)
        status = "ok" if out.ok else f"FAILED: {out.error}"
        print(f"  {label} [{system}]: {status} ({bw.wall_s:.1f} s)", file=bench.out, flush=True)
        return out

    def describe(
        self, res: ScenarioResult, bench: Bench, rounds: list[list[Outcome]], params: dict[str, int]
    ) -> None:
        def med(system: str, workload: str, get: Callable[[Outcome], Any]) -> float | None:
            return median(
                get(o) for r in rounds for o in r if (o.system, o.workload) == (system, workload)
            )

        def total(system: str, workload: str, get: Callable[[Outcome], int | None]) -> str:
            vs = [get(o) for r in rounds for o in r if (o.system, o.workload) == (system, workload)]
            known = sum(v for v in vs if v is not None)
            return f"{known}" + ("?" if any(v is None for v in vs) else "")

        rows, summary = [], {}
        for s in SYSTEMS:
            runs = [o for r in rounds for o in r if o.system == s]
            failed = sum(1 for o in runs if not o.ok)
            fwd, wc = med(s, "forward", lambda o: o.rate), med(s, "wordcount", lambda o: o.rate)
            crossed = med(s, "forward", lambda o: o.crossed)
            rows.append(
                [
                    s,
                    fmt_rate(fwd),
                    "–" if crossed is None else f"{crossed:.0%}",
                    f"{total(s, 'forward', lambda o: o.lost)} / "
                    f"{total(s, 'forward', lambda o: o.extra)}",
                    fmt_num(med(s, "forward", lambda o: o.wall_s), 1),
                    fmt_rate(wc),
                    fmt_num(med(s, "wordcount", lambda o: o.wall_s), 1),
                    f"{total(s, 'wordcount', lambda o: o.lost)} / "
                    f"{total(s, 'wordcount', lambda o: o.extra)}",
                    f"{len(runs) - failed}/{len(runs)}",
                ]
            )
            summary[s] = {
                "forward_tuples_s": fwd,
                "forward_crossed": crossed,
                "wordcount_sentences_s": wc,
                "runs": [
                    {k: v for k, v in o.__dict__.items() if k != "record"}
                    for r in rounds
                    for o in r
                    if o.system == s
                ],
            }
        res.summary = {"params": params, "systems": summary}
        res.tables.append(
            Table(
                f"{self.title}: medians of {len(rounds)} rotated rounds",
                [
                    "system",
                    "forward tuples/s (sink, every tuple)",
                    "crossed processes",
                    "forward lost / dup",
                    "forward wall s",
                    "wordcount sentences/s (steady)",
                    "wordcount wall s",
                    "words lost / extra",
                    "ok runs",
                ],
                rows,
                note=(
                    f"forward: {params['forward']:,} tuples of {SIZE} B, tuples/s at the sink "
                    "from its first arrival to its last; wordcount: "
                    f"{params['sentences']:,} sentences of {WORDS} words (vocabulary "
                    f"{VOCABULARY}, seed {SEED}), words/s arriving at the count step between "
                    f"10% and 90% of all words, / {WORDS}. Wall: job start (processes) to end. "
                    "Typhoon: one emulated host, batch 100; wordcount 6 worker processes "
                    "(source[i] and split[i] chained). "
                    "Bytewax: host loopback, one worker per process, source batch 100. Word "
                    "counts of every run checked against the generator's (lost / extra = "
                    "occurrences missing / above it, summed over runs)."
                ),
            )
        )
        for workload, target in (("wordcount", 1.5), ("forward", 3.0)):
            for t in ("sdn", "tcp"):
                value, per_round = paired(rounds, t, "bytewax -p 2", workload)
                what = "steady sentences/s" if workload == "wordcount" else "sink tuples/s"
                res.ratios.append(
                    Ratio.against(f"peers {workload} {t} / bytewax -p 2, {what}", value, target)
                )
                res.summary[f"{workload}_{t}_over_bytewax_p2"] = per_round
        ok = all(o.ok for r in rounds for o in r)
        res.notes.append(
            "Counts equal across systems: "
            + (
                "yes, every run's word counts equal the generator's, every forward tuple "
                "arrived once."
                if ok
                else "**no** (see the failed runs)."
            )
        )
        res.plots.append(
            bar_panels(
                bench.out_dir / "peers.png",
                "Typhoon and Bytewax, same data (medians)",
                {
                    "forward: tuples/s at the sink": {
                        s: med(s, "forward", lambda o: o.rate) for s in SYSTEMS
                    },
                    "wordcount: sentences/s (steady)": {
                        s: med(s, "wordcount", lambda o: o.rate) for s in SYSTEMS
                    },
                },
            )
        )
