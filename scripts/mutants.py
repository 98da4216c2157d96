"""Mutation check (`make test-mutants`): break a mechanism on purpose, the suite must notice.

Each mutant is one source edit, (file, exact anchor text, replacement), applied to
a copy of the working tree (the files git knows of, plus untracked ones that are not
ignored), and a short list of tests that must FAIL on that copy.  An anchor that is
not in its file exactly once stops the check with an error: a mutant must not rot
silently when the code it breaks moves.  The unmodified copy must pass every test
the mutants use, or nothing the table says means anything.

Prints ``mutant | tests | caught?`` and exits 1 if a mutant survives or the
unmodified tree fails, 2 if an anchor is missing.  Runtime tests start worker
processes: run it under the heavy lock on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str  # the mechanism it breaks, in words
    file: str
    anchor: str
    replacement: str
    tests: tuple[str, ...]
    integration: tuple[str, ...] = ()  # added with --integration (real OVS/Ryu; root)


MUTANTS = (
    Mutant(
        "no-signal-flush",
        "a SIGNAL control tuple no longer makes the operator flush (on_signal)",
        "typhoon/runtime/control.py",
        "        elif t == Control.SIGNAL:\n            self.op.on_signal(self.emit)\n",
        "        elif t == Control.SIGNAL:\n",
        ("tests/unit/test_key_origins.py",),
    ),
    Mutant(
        "fields-as-shuffle",
        "fields grouping routes round robin, like shuffle",
        "typhoon/runtime/policies.py",
        '        if policy == "fields":\n            return self._fields\n',
        '        if policy == "fields":\n            return self._round_robin\n',
        (
            "tests/unit/test_key_origins.py",
            "tests/runtime/test_tcp_runs.py::test_wordcount_counts_equal_reference",
        ),
        (
            "tests/integration/test_sdn_dataplane.py::test_wordcount_on_three_hosts_equals_reference",
        ),
    ),
    Mutant(
        "rollback-to-start",
        "a recovery finds no checkpoint (latest complete epoch: None), replays everything",
        "typhoon/checkpoint/progress.py",
        "    return store.latest_complete(parts_of(physical))\n",
        "    return None\n",
        (
            "tests/unit/test_guarantee_model.py",
            "tests/runtime/test_tcp_runs.py::test_tcp_exactly_once_survives_killed_workers[victims2]",
        ),
        (
            "tests/integration/test_guarantees.py::"
            "test_exact_after_the_source_and_two_consecutive_stages_die_at_once",
        ),
    ),
    Mutant(
        "no-mirror-copy",
        "the live debugger's mirror adds no copy to a debugged rule",
        "controller/rules/mirror.py",
        "            out.update(mirror_rule(rule, carrying))\n",
        "            out.add(rule)\n",
        ("tests/unit/test_controller_mirror.py",),
        ("tests/integration/test_all_apps.py::test_the_four_apps_serve_one_running_job",),
    ),
    Mutant(
        "equal-lb-weights",
        "the load balancer gives every live worker the same weight",
        "controller/load_balancing/balancer.py",
        "            weights[wid] = weight\n",
        "            weights[wid] = 1.0\n",
        ("tests/unit/test_balancer.py",),
        (
            "tests/integration/test_load_balancer.py::"
            "test_each_worker_gets_its_capacity_share_and_keeps_it",
        ),
    ),
)


class AnchorMissing(Exception):
    """A mutant's anchor is not in its file exactly once: re-anchor it."""


def tree_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return [p for p in out.decode().split("\0") if p and (root / p).is_file()]


def copy_tree(root: Path, dest: Path) -> None:
    for rel in tree_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def check_anchor(copy: Path, m: Mutant) -> str:
    """The file's text; raises AnchorMissing unless the anchor is in it exactly once."""
    path = copy / m.file
    text = path.read_text() if path.is_file() else ""
    found = text.count(m.anchor)
    if found != 1:
        raise AnchorMissing(f"mutant {m.name}: anchor found {found} times in {m.file}")
    return text


def apply(copy: Path, m: Mutant) -> None:
    text = check_anchor(copy, m)
    (copy / m.file).write_text(text.replace(m.anchor, m.replacement, 1))


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    try:
        p = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:.0f} s"
    tail = (p.stdout + p.stderr).strip().splitlines()
    return p.returncode, tail[-1] if tail else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="run only this mutant (repeatable)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    ap.add_argument(
        "--integration",
        action="store_true",
        help="also run each mutant's integration test (real OVS/Ryu/Mininet, root, minutes)",
    )
    args = ap.parse_args(argv)
    mutants = [
        replace(m, tests=m.tests + m.integration) if args.integration else m
        for m in MUTANTS
        if not args.only or m.name in args.only
    ]
    if args.only and len(mutants) != len(set(args.only)):
        known = ", ".join(m.name for m in MUTANTS)
        print(f"unknown mutant in {args.only}; known: {known}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="typhoon-mutants-") as tmp:
        base = Path(tmp) / "base"
        copy_tree(ROOT, base)
        # every anchor first: a missing one stops the check before anything runs
        try:
            for m in mutants:
                check_anchor(base, m)
        except AnchorMissing as e:
            print(f"test-mutants: {e}", file=sys.stderr)
            return 2
        tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        t0 = time.monotonic()
        rc, last = run_tests(base, tests, args.timeout)
        print(f"unmodified tree: {len(tests)} test targets, rc {rc} ({last}) "
              f"in {time.monotonic() - t0:.0f} s")  # fmt: skip
        if rc != 0:
            print("test-mutants: the unmodified tree fails its tests", file=sys.stderr)
            return 1
        rows = []
        for m in mutants:
            copy = Path(tmp) / m.name
            shutil.copytree(base, copy)
            apply(copy, m)
            t0 = time.monotonic()
            rc, last = run_tests(copy, m.tests, args.timeout)
            # 1: a test failed (caught); 0: all passed (survived); else the tests did not run
            caught = {0: "SURVIVED", 1: "caught"}.get(rc, f"ERROR rc {rc}")
            rows.append((m, caught, last, time.monotonic() - t0))
            shutil.rmtree(copy)
    width = max(len(m.name) for m, *_ in rows)
    print(f"\n{'mutant':<{width}} | caught?  | time | tests run")
    for m, caught, last, secs in rows:
        print(f"{m.name:<{width}} | {caught:<8} | {secs:3.0f} s | {', '.join(m.tests)}")
        print(f"{'':<{width}} |          |      |   ({m.what}; pytest: {last})")
    return 0 if all(c == "caught" for _, c, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
