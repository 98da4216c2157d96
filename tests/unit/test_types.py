"""The type checker passes: mypy, strict on the wire format, the worker runtime and the
rule compiler (``[tool.mypy]`` in pyproject.toml; docs/testing.md).

Run here so that ``make test`` (and CI, which runs it) fails on a type error, not only
``make lint``.  The modules those packages import are read for their types but their
own errors are not reported; the config test keeps the strict set from shrinking.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STRICT = {"typhoon/wire": "typhoon.wire.*", "typhoon/runtime": "typhoon.runtime.*",
          "controller/rules": "controller.rules.*"}  # fmt: skip


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def test_strict_packages_are_checked_strictly():
    cfg = _config()
    assert set(STRICT) <= set(cfg["files"])
    strict = {
        m
        for o in cfg.get("overrides", [])
        if o.get("strict") is True
        for m in ([o["module"]] if isinstance(o["module"], str) else o["module"])
    }
    assert set(STRICT.values()) <= strict
    # nothing switched off again for a strict module
    for o in cfg.get("overrides", []):
        mods = [o["module"]] if isinstance(o["module"], str) else o["module"]
        if any(m.startswith(tuple(p.rstrip("*") for p in STRICT.values())) for m in mods):
            assert set(o) <= {"module", "strict"}, o


def test_mypy_finds_no_error():
    # the config's files and cache (.mypy_cache, ignored by git): a second run takes < 1 s
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.strip().splitlines()[-1].startswith("Success: no issues found"), out
