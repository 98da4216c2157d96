"""The Nexmark queries (topologies/nexmark/) over the tcp transport: ``typhoon run --transport
tcp``, real worker processes, real sockets.

Each query file runs as it is, with 30,000 events (the ``--arg`` overrides
below, applied to the reference's arguments too); every sink's tuples in the run
report must equal what ``typhoon.operators.nexmark_reference`` computes from the
generated events: the bids arrive out of order (200 ms of disorder, the
watermark's bound), so the windowed queries are exact only if every watermark
travelled behind the data it covers and every window worker took the minimum of
its inputs.  Nothing may be late anywhere.  The report's per-source counts say
how many events each source emitted.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from typhoon.operators import nexmark_reference as ref
from typhoon.operators.nexmark import kind_count
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "topologies" / "nexmark"
COUNT = 30_000

pytestmark = pytest.mark.slow


def typhoon(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "typhoon_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ),
    )


def sources(name: str) -> list[str]:
    topo = load_topology(QUERIES / f"{name}.yaml")
    return [n for n, node in topo.nodes.items() if node.operator == "nexmark_source"]


def node_args(name: str) -> dict[str, dict]:
    """The args the run used: the file's, with the overrides below."""
    topo = copy.deepcopy(load_topology(QUERIES / f"{name}.yaml"))
    for n in sources(name):
        topo.nodes[n].args["count"] = COUNT
    return {n: node.args for n, node in topo.nodes.items()}


@pytest.mark.parametrize("name", ref.QUERIES)
def test_query_sinks_equal_the_reference(tmp_path, name):
    report_file = tmp_path / "report.json"
    overrides = [x for n in sources(name) for x in ("--arg", f"{n}.count={COUNT}")]
    work = ["--workdir", str(tmp_path / "work")]
    file = str(QUERIES / f"{name}.yaml")
    p = typhoon("run", file, "--transport", "tcp", "--report", str(report_file), "-q", *work,
                *overrides)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(report_file.read_text())
    assert report["ok"], report["problems"]
    args = node_args(name)
    for n in sources(name):
        kind = args[n]["kind"]
        assert report["results"][n]["emitted"] == kind_count(kind, COUNT), n
    want = ref.expected(name, args)
    for sink, value in want.items():
        got = ref.observed(name, sink, report["results"][sink]["tuples"])
        assert got == value, f"{name}: sink '{sink}' differs from the reference"
        assert value
    # no event came late for any window, join or interval (the reports of the workers that
    # have windows carry window_late; interval_join's merged result counts its late tuples)
    windowed = [w for w in report["workers"] if "window_late" in w]
    assert windowed or name in ("q0", "q1", "q2", "q3")
    assert all(w["window_late"] == 0 for w in windowed)
    if name == "q4":
        assert report["results"]["closing"]["late"] == 0
