"""Layers import downward only (docs/style.md): checked on the source, not by convention.

The shared core (wire format, topology, runtime, coordinator, ...) imports none
of controller/, apps/, mininet_env/, pyspark_bridge/, benchmarks/; controller/
and apps/ never import mininet_env/ or pyspark_bridge/.  ``typhoon_cli/`` is the
top layer that composes everything: it may import any package, and no package
imports it.  No file is exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = "typhoon_cli"
RULES = {
    "typhoon": {"controller", "apps", "mininet_env", "pyspark_bridge", "benchmarks", TOP},
    "controller": {"apps", "mininet_env", "pyspark_bridge", "benchmarks", TOP},
    "apps": {"mininet_env", "pyspark_bridge", "benchmarks", TOP},
    "pyspark_bridge": {"controller", "apps", "mininet_env", "benchmarks", TOP},
    "mininet_env": {"benchmarks", TOP},
    "benchmarks": {TOP},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


CASES = [(pkg, path) for pkg in RULES for path in sorted((ROOT / pkg).rglob("*.py"))]


@pytest.mark.parametrize(("pkg", "path"), CASES, ids=[str(p.relative_to(ROOT)) for _, p in CASES])
def test_imports_go_downward(pkg, path):
    bad = imported_packages(path) & RULES[pkg]
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
