"""Layers import downward only (docs/style.md): checked on the source, not by convention.

The shared core (wire format, topology, runtime, coordinator, ...) imports none
of controller/, apps/, mininet_env/, pyspark_bridge/; controller/ and apps/
never import mininet_env/ or pyspark_bridge/.  ``typhoon/cli.py`` is the top
layer that composes everything, so it alone may reach into mininet_env.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = {
    "typhoon": {"controller", "apps", "mininet_env", "pyspark_bridge", "benchmarks"},
    "controller": {"apps", "mininet_env", "pyspark_bridge", "benchmarks"},
    "apps": {"mininet_env", "pyspark_bridge", "benchmarks"},
}
TOP_LAYER = {ROOT / "typhoon" / "cli.py"}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


CASES = [
    (pkg, path)
    for pkg in RULES
    for path in sorted((ROOT / pkg).rglob("*.py"))
    if path not in TOP_LAYER
]


@pytest.mark.parametrize(("pkg", "path"), CASES, ids=[str(p.relative_to(ROOT)) for _, p in CASES])
def test_imports_go_downward(pkg, path):
    bad = imported_packages(path) & RULES[pkg]
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
