"""A running max with keyed state swapped in place over tcp mid-run, its state kept.

``keyed_source`` -> fields on ``key`` -> ``running_max`` x2 (runs alone: its input is
key-routed) -> one ``collect`` sink.  Once a third of the tuples were sent, ``running_max``
is swapped to ``running_max`` with ``count: true`` (typhoon.reconfig.swap_in_place):
the same workers, no new process, and every row the sink got is recomputed from the
source's generator (tests/running_max_check.py): the maxima go on across the cut, the
counts start at it, one cut per key, every tuple once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from running_max_check import check_swapped_running_max
from tcp_verbs import no_loss, run_verbs

from typhoon.reconfig import Swap
from typhoon.topology import load_topology_text

pytestmark = [pytest.mark.slow, pytest.mark.long]

SEED, KEYS, COUNT, SIZE = 11, 64, 8000, 8
JOB = f"""
name: tcpkeyswap
spouts:
  - {{id: source, operator: keyed_source, args: {{count: {COUNT}, keys: {KEYS},
     seed: {SEED}, size: {SIZE}, rate: 2000}}, parallelism: 1}}
bolts:
  - {{id: rmax, operator: running_max, parallelism: 2}}
  - {{id: sink, operator: collect, parallelism: 1}}
streams:
  - {{from: source, to: rmax, grouping: {{type: fields, fields: [key]}}}}
  - {{from: rmax, to: sink, grouping: global}}
"""


def test_a_keyed_running_max_swapped_in_place_over_tcp_goes_on_from_its_state(
    tmp_path: Path,
) -> None:
    t = load_topology_text(JOB, "tcpkeyswap.yaml")
    swap = Swap("rmax", "running_max", {"count": True})
    report, (rec,), _, cluster = run_verbs(tmp_path, t, [(1 / 3, swap)], "source")
    assert rec.state == "done" and not rec.added and not rec.removed, rec.to_dict()
    assert [s["what"].split(":")[0] for s in rec.steps] == [
        "write the new topology and physical version 2",
        "the controller compiles the new version (the same rules)",
        "SWAP",
        "commit",
    ], rec.steps
    no_loss(report)
    got = check_swapped_running_max(report["results"]["sink"]["tuples"], SEED, KEYS, COUNT, SIZE)
    assert got.old_rows and got.new_rows and got.keys_cut and got.carried, got
    assert got.old_rows + got.new_rows == COUNT
    rmax = [w for w in report["workers"] if w["node"] == "rmax"]
    assert len(rmax) == 2
    for w in rmax:
        (old,) = w["swapped"]  # the same worker: the old logic took a part, the new the rest
        assert old["operator"] == "running_max" and old["args"] == {}, old
        assert old["keyed"]["kept"] == ["max"] and old["keyed"]["added"] == ["count"], old
        assert 0 < old["tuples_in"] < sum(w["in"].values()), (old, w["in"])
    assert cluster.topology.nodes["rmax"].args == {"count": True}
    logs = {p.name for p in tmp_path.glob("worker-*.log")}
    assert len(logs) == 4, logs  # source, two running max workers, sink: nobody new
