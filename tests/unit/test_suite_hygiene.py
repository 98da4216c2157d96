"""The suite stays free of the flake classes issue 35 removed, by a static read of tests/.

* A fixed ``time.sleep`` of half a second or more is a wait for something the test
  could name: poll it with a deadline (``harness.wait``) instead.  A justified one (a
  scenario that must last, paced sampling) says so on its line: ``# sleep-ok: why``.
* An assertion comparing two measured durations or rates (``after_rate >= 0.8 *
  before_rate``, ``update_s < restart_s``) is a speed claim that a busy machine breaks:
  speed belongs in ``typhoon bench``; a test asserts counts and order.  Upper-case names
  are settings (``HEARTBEAT_S``), not measurements.

And the suite does not inherit the SIGINT disposition it was started with (tests/conftest.py).
"""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SLEEP_LIMIT_S = 0.5
SLEEP_OK = "# sleep-ok:"
# an identifier (or a string key) naming a measured duration or rate: one of its
# underscore-separated words, or a unit as its last word
MEASURED_WORDS = {"elapsed", "duration", "durations", "latency", "throughput", "rate", "rates"}
MEASURED_UNITS = {"s", "ms", "us", "seconds"}
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
# files another branch rewrites (issue 36, branch h-honest): drop each entry once merged
PENDING: dict[str, str] = {}  # file -> why it is exempt for now (none left)


def sources() -> list[Path]:
    return sorted(
        p
        for p in TESTS.rglob("*.py")
        if p.resolve() != Path(__file__).resolve() and str(p.relative_to(TESTS)) not in PENDING
    )


def measured(name: str) -> bool:
    """Does ``name`` look like a measured duration or rate (lower case: upper-case names
    are settings)?"""
    if not name or name.isupper():
        return False
    words = name.lower().split("_")
    return bool(MEASURED_WORDS.intersection(words)) or (
        len(words) > 1 and words[-1] in MEASURED_UNITS
    )


def constants(tree: ast.Module) -> dict[str, float]:
    """Module-level ``NAME = <number>`` assignments."""
    out: dict[str, float] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            if isinstance(value, int | float) and not isinstance(value, bool):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        out[target.id] = float(value)
    return out


def is_sleep(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr == "sleep" and isinstance(f.value, ast.Name) and f.value.id == "time"
    return isinstance(f, ast.Name) and f.id == "sleep"


def fixed_sleeps(path: Path) -> list[str]:
    """``time.sleep(N)`` with N a number (or a module constant) >= SLEEP_LIMIT_S, unless
    its line carries ``# sleep-ok:``."""
    text = path.read_text()
    tree = ast.parse(text)
    lines = text.splitlines()
    known = constants(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and is_sleep(node) and len(node.args) == 1):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, int | float):
            seconds = float(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in known:
            seconds = known[arg.id]
        else:
            continue  # computed: a pacing deadline, a backoff
        if seconds >= SLEEP_LIMIT_S and SLEEP_OK not in lines[node.lineno - 1]:
            found.append(
                f"{path.relative_to(TESTS)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
            )
    return found


def measured_names(expr: ast.AST) -> set[str]:
    """Identifiers and string subscripts in ``expr`` that name a measured duration or rate
    (lower case: upper-case names are settings)."""
    names = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            name = node.slice.value if isinstance(node.slice.value, str) else ""
        else:
            continue
        if measured(name):
            names.add(name)
    return names


def measured_comparisons(path: Path) -> list[str]:
    """``assert`` orderings (<, <=, >, >=) with a measured duration or rate on both sides."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in ast.walk(node.test):
            if not isinstance(cmp, ast.Compare):
                continue
            sides = [cmp.left, *cmp.comparators]
            for op, left, right in zip(cmp.ops, sides, sides[1:], strict=False):
                a, b = measured_names(left), measured_names(right)
                if isinstance(op, ORDERING) and a and b:
                    where = f"{path.relative_to(TESTS)}:{node.lineno}"
                    found.append(
                        f"{where}: {sorted(a)} vs {sorted(b)}: {lines[node.lineno - 1].strip()}"
                    )
    return found


def test_no_fixed_sleeps_used_to_wait():
    found = [hit for p in sources() for hit in fixed_sleeps(p)]
    assert not found, "wait for a condition with a deadline instead:\n" + "\n".join(found)


def test_no_assertion_compares_two_measured_durations_or_rates():
    found = [hit for p in sources() for hit in measured_comparisons(p)]
    assert not found, "a speed claim belongs in typhoon bench:\n" + "\n".join(found)


def test_the_checks_see_what_they_ban(tmp_path):
    """Each check flags its pattern (and not its look-alikes), so a pass means something."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import time\n"
        "WINDOW_S = 5.0\n"
        "HEARTBEAT_S = 2.0\n"
        "def test():\n"
        "    time.sleep(2.0)\n"
        "    time.sleep(WINDOW_S)\n"
        "    time.sleep(10)  # sleep-ok: the scenario lasts 10 s\n"
        "    time.sleep(0.05)\n"
        "    time.sleep(max(0.0, deadline - time.time()))\n"
        "    assert after_rate >= 0.8 * before_rate\n"
        "    assert max(updates_s) < restart_s\n"
        "    assert r['reroute_ms'] < r['detect_ms']\n"
        "    assert detection_s <= HEARTBEAT_S + 2.0\n"
        "    assert copies <= rate * 3 + 5\n"
        "    assert session['rate'] == rate\n"
        "    assert mean_rate(after) > 1.1 * rate_before\n"
        "    assert generated_s < separate\n"
    )
    global TESTS
    saved, TESTS = TESTS, tmp_path
    try:
        sleeps = fixed_sleeps(sample)
        compared = measured_comparisons(sample)
    finally:
        TESTS = saved
    assert [hit.split(":")[1] for hit in sleeps] == ["5", "6"]
    assert [hit.split(":")[1] for hit in compared] == ["10", "11", "12", "16"]


def test_children_start_with_the_default_sigint():
    """Started from a background job (SIGINT ignored), the session still hands its
    children the default disposition, so a child stopped with SIGINT stops."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    assert out.stdout.strip() == "True"


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by basename (rootdir-relative, no packages): two files of
    one name in different folders stop the whole run at collection ("import file
    mismatch"), which a run of one folder never shows."""
    seen: dict[str, list[str]] = {}
    for p in TESTS.rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(TESTS)))
    assert not {n: ps for n, ps in seen.items() if len(ps) > 1}
