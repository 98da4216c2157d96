"""``typhoon bench``: the command-line verb, added to ``typhoon`` by ``typhoon_cli``.

Only argparse here: the runner (Mininet, matplotlib, ...) is imported when the
verb runs, so ``typhoon --help`` and the other verbs stay fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_USAGE = 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``bench`` to the ``typhoon`` command line."""
    b = sub.add_parser(
        "bench",
        help="run the paper's experiments, sdn against tcp; write results, tables, plots",
        description=(
            "Run the benchmark scenarios on emulated clusters (needs root) and write "
            "results.md, results.json, machine.json and one PNG per figure to "
            "benchmarks/results/<date>/ (or --out)."
        ),
    )
    b.add_argument("--quick", action="store_true", help="short runs, fewer points (CI)")
    b.add_argument(
        "--only",
        action="append",
        metavar="SCENARIO",
        help="run only these scenarios (repeat or comma-separate); --list shows them",
    )
    b.add_argument("--out", help="output directory (default benchmarks/results/<date>[-quick])")
    b.add_argument("--repeats", type=int, help="interleaved rounds per point (1 quick, 3 full)")
    b.add_argument("--workdir", help="keep cluster logs and worker reports here")
    b.add_argument(
        "--tcp-mtu",
        type=int,
        metavar="BYTES",
        help="frame size of every tcp run (default: the topology's tcp.mtu, else 64000)",
    )
    b.add_argument("--list", action="store_true", help="list the scenarios and exit")
    b.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks.runner import BenchOptions, need_root, run_bench, select
    from benchmarks.scenario import scenarios
    from typhoon.runtime.tcp import MAX_MTU, MIN_MTU

    if args.list:
        for cls in scenarios():
            print(f"{cls.name:14} {cls.figure:10} {cls.title}")
        return 0
    if args.repeats is not None and args.repeats < 1:
        print("error: --repeats must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.tcp_mtu is not None and not MIN_MTU <= args.tcp_mtu <= MAX_MTU:
        print(f"error: --tcp-mtu must be {MIN_MTU}..{MAX_MTU}", file=sys.stderr)
        return EXIT_USAGE
    try:
        select(args.only or [])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    problem = need_root()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    options = BenchOptions(
        quick=args.quick,
        only=args.only or [],
        out=Path(args.out) if args.out else None,
        repeats=args.repeats,
        workdir=Path(args.workdir) if args.workdir else None,
        tcp_mtu=args.tcp_mtu,
    )
    return run_bench(options)
