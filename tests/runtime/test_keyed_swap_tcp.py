"""A running max with keyed state swapped in place over tcp mid-run, its state kept.

``keyed_source`` -> fields on ``key`` -> ``running_max`` x2 (runs alone: its input is
key-routed) -> one ``collect`` sink.  Once a third of the tuples were sent, ``running_max``
is swapped to ``running_max`` with ``count: true`` (typhoon.reconfig.swap_in_place):
the same workers, no new process, and every row the sink got is recomputed from the
source's generator (tests/running_max_check.py): the maxima go on across the cut, the
counts start at it, one cut per key, every tuple once.  Under ``exactly_once`` a
worker killed right after the swap comes back with the new logic and its state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
from midrun_kill import checkpointed, run_killing
from running_max_check import check_swapped_running_max, swap_job
from tcp_verbs import no_loss, run_verbs

from typhoon.checkpoint.store import open_store
from typhoon.reconfig import Swap
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology_text

pytestmark = [pytest.mark.slow, pytest.mark.long]

SEED, KEYS, COUNT, SIZE = 11, 64, 8000, 8
JOB = swap_job("tcpkeyswap", SEED, KEYS, COUNT, SIZE, rate=2000)


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


def test_under_exactly_once_a_worker_killed_after_the_swap_recovers_the_new_logic(
    tmp_path: Path,
) -> None:
    """The same job under ``exactly_once`` (a checkpoint every 2 s): the swap runs in place
    right after the first global checkpoint, and the first running max worker is
    SIGKILLed as soon as the swap is done, before the next checkpoint.  The recovery
    restores that checkpoint, taken under the old operator, into the new one (the
    maxima go on from it, the counts start at it: as if the swap had been there) and
    replays; every row of the sink is exact and nothing is lost or counted twice."""
    t = load_topology_text(JOB.replace("tcpkeyswap", "tcpkeyswapeo"), "tcpkeyswapeo.yaml")
    t.config.update(
        guarantee="exactly_once", checkpoint_interval_ms=2000, checkpoint_store=str(tmp_path / "ck")
    )
    cluster = TcpCluster(t, RunOptions(live=False, timeout=120), workdir=tmp_path / "run")
    records: list[Any] = []
    at_kill: list[int | None] = []
    try:
        cluster.start()
        cluster.activate()
        store = open_store(str(tmp_path / "ck"), t.name)
        done = checkpointed(cluster, store)
        victim = cluster.physical.of_node("rmax")[0].worker_id

        def swapped() -> bool:  # polled by the killer: swap at the first checkpoint, then kill
            if not records:
                if done() is not None:
                    records.append(cluster.rescaler.request(Swap("rmax", "running_max",
                                                                 {"count": True})))  # fmt: skip
                return False
            return bool(records[0].state != "pending")

        clean = run_killing(cluster, [victim], swapped, at_kill=lambda: at_kill.append(done()))
        report = cluster.report(clean)
    finally:
        cluster.close()
    (rec,) = records
    assert rec.state == "done" and not rec.added, rec.to_dict()
    assert victim in cluster.recovered, cluster.recovered
    assert report["ok"], report["problems"]
    got = check_swapped_running_max(report["results"]["sink"]["tuples"], SEED, KEYS, COUNT, SIZE)
    assert got.old_rows and got.new_rows and got.carried, got
    (killed,) = [w for w in report["workers"] if w["worker"] == victim]
    (epoch,) = {e for e in killed["restored_epochs"] if e >= 0}
    assert at_kill == [epoch], (at_kill, killed["restored_epochs"])  # the one before the swap
    part = msgpack.unpackb(store.read(epoch, "rmax-0"), raw=False, strict_map_key=False)
    assert part["operator"] == ["running_max", {}], part["operator"]  # taken under the old
    assert cluster.topology.nodes["rmax"].args == {"count": True}
