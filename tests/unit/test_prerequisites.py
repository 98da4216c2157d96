"""`make test` must fail, not pass, when its integration half cannot run.

A pytest run of one integration test with ``os.geteuid`` answering "not root"
(patched before pytest starts; the test itself never gets to touch the machine):
the run fails with the reason, and nothing is reported as skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NOT_ROOT = (
    "import os, sys, pytest\nos.geteuid = lambda: 1000\nsys.exit(pytest.main(sys.argv[1:]))\n"
)


def test_integration_tests_fail_without_root(tmp_path):
    test = "tests/integration/test_daemons.py::test_controller_daemon_serves_switches_and_rest"
    p = subprocess.run(
        [sys.executable, "-c", NOT_ROOT, f"{test}[ryu]", "-q", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "pt")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "integration tests need root" in out, out
    assert "skipped" not in out and "1 error" in out, out
