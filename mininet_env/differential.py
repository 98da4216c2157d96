"""Differential topology testing: generated topologies over sdn and tcp against their exact result.

Each seed gives a topology (``typhoon.topology.generate``) with its hosts,
fabric shape and the result every sink must report.  The topology runs on an
emulated cluster over ``sdn`` and as local processes over ``tcp``; a case
passes when both run reports say ``ok`` (no tuple missing or duplicated on any
link, no frame written off, no switch drop rule hit) and every sink's result
equals the computed one in both runs.  Clusters are shared by the cases that
need the same hosts and fabric.

    python -m mininet_env.differential --seeds 200        # seeds 0..199
    python -m mininet_env.differential --seed 17 --seed 40
    make fuzz-topologies N=200

A failure prints its seed and the command that replays it; exit code 1.
"""

from __future__ import annotations

import argparse
import io
import logging
import secrets
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mininet_env.fabric import FabricPlan
from mininet_env.run import EmulatedCluster, SdnRunOptions, start_cluster
from typhoon.tcp_cluster import RunOptions, run_tcp
from typhoon.topology.generate import Case, generate

log = logging.getLogger(__name__)

RUN_TIMEOUT_S = 180.0
# the seeds CI runs (tests/integration/test_differential.py): 1-4 hosts, mesh, line and
# star at 3+ hosts, every grouping, named streams, batch 1; 6 clusters (test_topogen.py)
CI_SEEDS = (5, 17, 25, 26, 27, 33, 34, 37, 45, 48, 56, 73, 94)


@dataclass
class Outcome:
    """What one case showed."""

    case: Case
    problems: list[str] = field(default_factory=list)
    sdn_s: float | None = None
    tcp_s: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        c = self.case
        times = " ".join(
            f"{t} {s:.1f} s" for t, s in (("sdn", self.sdn_s), ("tcp", self.tcp_s)) if s is not None
        )
        verdict = "ok" if self.ok else "FAILED"
        return f"seed {c.seed}: {verdict} ({c.hosts} host(s), {c.fabric}; {times})"


def cluster_key(case: Case) -> tuple[int, str]:
    """Cases that can share a cluster: on 1 or 2 hosts every shape is the same wiring."""
    return case.hosts, case.fabric if case.hosts > 2 else "mesh"


def compare(transport: str, node: str, got: Any, want: dict[str, Any]) -> list[str]:
    """Sentences for each way a sink's result differs from the computed one."""
    where = f"{transport}: sink {node}"
    if not isinstance(got, dict):
        return [f"{where} reported no result (expected {want})"]
    if "tuples" in want:
        n, m = got.get("tuples"), want["tuples"]
        if n != m:
            diff = f"{m - n} missing" if n < m else f"{n - m} extra"
            return [f"{where}: {n} tuples, expected {m} ({diff})"]
        if (got.get("sum"), got.get("xor")) != (want["sum"], want["xor"]):
            return [f"{where}: {n} tuples as expected but a different checksum (wrong tuples)"]
        return []
    have, counts = got.get("counts") or {}, want["counts"]
    wrong = {k for k in set(have) | set(counts) if have.get(k, 0) != counts.get(k, 0)}
    if not wrong:
        return []
    short = sum(max(0, counts.get(k, 0) - have.get(k, 0)) for k in wrong)
    extra = sum(max(0, have.get(k, 0) - counts.get(k, 0)) for k in wrong)
    return [f"{where}: counts differ on {len(wrong)} key(s): {short} missing, {extra} extra"]


def check_report(transport: str, case: Case, report: dict[str, Any]) -> list[str]:
    problems = [f"{transport}: {p}" for p in report.get("problems") or []]
    if not report.get("ok") and not problems:
        problems.append(f"{transport}: run not ok (a worker failed or the run timed out)")
    results = report.get("results") or {}
    for node, want in sorted(case.expected.items()):
        problems += compare(transport, node, results.get(node), want)
    return problems


class Differential:
    """Runs cases; keeps one sdn cluster up for consecutive cases that fit it."""

    def __init__(self, workdir: Path, out: TextIO = sys.stderr, verbose: bool = False) -> None:
        self.workdir = workdir
        self.out = out
        self.log = out if verbose else io.StringIO()  # cluster chatter
        self.token = secrets.token_hex(2)
        self.cluster: EmulatedCluster | None = None
        self.key: tuple[int, str] | None = None
        self.runs = 0

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
            self.cluster, self.key = None, None

    def sdn_cluster(self, case: Case) -> EmulatedCluster:
        key = cluster_key(case)
        if self.cluster is not None and self.key == key:
            return self.cluster
        self.close()
        hosts, shape = key
        plan = FabricPlan(hosts=hosts, shape=shape, prefix=f"df{self.token}")
        options = SdnRunOptions(
            plan=plan,
            live=False,
            timeout=RUN_TIMEOUT_S,
            workdir=self.workdir / f"sdn-{hosts}{shape}",
        )
        cluster = start_cluster(options, self.log)
        self.cluster, self.key = cluster, key
        return cluster

    def _run_sdn(self, case: Case, name: str) -> dict[str, Any]:
        cluster = self.sdn_cluster(case)
        try:
            return cluster.run(case.topology(name))
        except BaseException:
            if name in cluster.manager.list():
                try:
                    cluster.kill(name)
                except Exception:
                    log.exception("could not remove the failed run %s", name)
            raise

    def _run_tcp(self, case: Case, name: str) -> dict[str, Any]:
        hosts = FabricPlan(hosts=case.hosts).host_names()
        options = RunOptions(hosts=hosts, live=False, timeout=RUN_TIMEOUT_S)
        return run_tcp(case.topology(name), options, out=self.log)

    def run(self, case: Case) -> Outcome:
        outcome = Outcome(case)
        for transport, runner in (("sdn", self._run_sdn), ("tcp", self._run_tcp)):
            self.runs += 1
            name = f"d{self.token}-{self.runs}-{transport}-{case.seed}"
            try:
                if transport == "sdn":
                    self.sdn_cluster(case)  # started before the clock: shared by cases
                t0 = time.monotonic()
                report = runner(case, name)
            except Exception as e:  # one broken case must not end the sweep
                log.debug("%s run of seed %s raised", transport, case.seed, exc_info=True)
                detail = traceback.format_exception_only(e)[-1].strip()
                outcome.problems.append(f"{transport}: the run raised {detail}")
                if transport == "sdn":
                    self.close()  # start the next case on a fresh cluster
                continue
            elapsed = time.monotonic() - t0
            if transport == "sdn":
                outcome.sdn_s = elapsed
            else:
                outcome.tcp_s = elapsed
            outcome.problems += check_report(transport, case, report)
        return outcome


def run_cases(
    cases: Iterable[Case], workdir: Path, out: TextIO = sys.stderr, verbose: bool = False
) -> list[Outcome]:
    """Run every case (grouped so that each cluster starts once); print one line each."""
    ordered = sorted(cases, key=lambda c: (cluster_key(c), c.seed))
    diff = Differential(workdir, out, verbose)
    outcomes = []
    try:
        for case in ordered:
            outcome = diff.run(case)
            outcomes.append(outcome)
            print(outcome.line(), file=out, flush=True)
            if not outcome.ok:
                print(f"  {case.describe()}", file=out)
                for p in outcome.problems:
                    print(f"  {p}", file=out)
                print(f"  replay: python -m mininet_env.differential --seed {case.seed}", file=out)
    finally:
        diff.close()
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mininet_env.differential",
        description="Generated topologies over sdn and tcp, checked against their exact result.",
    )
    parser.add_argument("--seeds", type=int, default=0, help="run seeds FIRST..FIRST+N-1")
    parser.add_argument("--first", type=int, default=0, help="first seed of --seeds")
    parser.add_argument("--seed", type=int, action="append", default=[], help="one seed")
    parser.add_argument(
        "--budget", type=int, default=60_000, help="tuple arrivals per topology (default 60000)"
    )
    parser.add_argument("--workdir", help="keep clusters' logs and reports here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print cluster output")
    args = parser.parse_args(argv)
    seeds = list(args.seed) + list(range(args.first, args.first + max(0, args.seeds)))
    if not seeds:
        parser.error("give --seeds N or --seed S")
    logging.basicConfig(level=logging.WARNING)
    cases = [generate(s, args.budget) for s in seeds]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="typhoon-diff-") as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        outcomes = run_cases(cases, workdir, sys.stdout, args.verbose)
    failed = [o.case.seed for o in outcomes if not o.ok]
    ratios = [o.sdn_s / o.tcp_s for o in outcomes if o.sdn_s and o.tcp_s]
    ratios.sort()
    median = ""
    if ratios:  # sdn on emulated hosts, tcp as local processes; worker start included
        median = f"; wall time sdn/tcp median {ratios[len(ratios) // 2]:.2f}"
    print(
        f"{len(outcomes) - len(failed)} of {len(outcomes)} seeds ok in "
        f"{time.monotonic() - t0:.0f} s{median}"
        + (f"; failed seeds: {' '.join(map(str, sorted(failed)))}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
