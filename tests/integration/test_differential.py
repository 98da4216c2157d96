"""Generated topologies over sdn and tcp, each against its exact result (issue 11).

The fixed seed set ``CI_SEEDS`` covers 1-4 hosts, every fabric shape and every
grouping (tests/unit/test_topogen.py checks that); one test per cluster, so a
failure names the hosts and fabric, and its message names each failing seed
with the command that replays it.  More seeds: ``make fuzz-topologies N=200``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mininet_env.differential import CI_SEEDS, cluster_key, run_cases
from typhoon.topology.generate import generate

pytestmark = pytest.mark.integration

# which cluster each seed needs (the budget only sizes the sources: cheap to collect)
KEYS = {s: cluster_key(generate(s, budget=1_000)) for s in CI_SEEDS}
GROUPS = sorted(set(KEYS.values()))


@pytest.mark.parametrize("key", GROUPS, ids=[f"{h}hosts-{shape}" for h, shape in GROUPS])
def test_generated_topologies_are_exact_over_sdn_and_tcp(key, tmp_path: Path, capsys) -> None:
    cases = [generate(s) for s in CI_SEEDS if KEYS[s] == key]
    with capsys.disabled():
        print()
        outcomes = run_cases(cases, tmp_path)
    failed = [o for o in outcomes if not o.ok]
    assert len(outcomes) == len(cases)
    assert not failed, "\n".join(
        f"seed {o.case.seed} ({o.case.describe()}):\n  "
        + "\n  ".join(o.problems)
        + f"\n  replay: python -m mininet_env.differential --seed {o.case.seed}"
        for o in failed
    )
