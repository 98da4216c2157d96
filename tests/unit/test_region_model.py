"""Model check of region failover (``typhoon/checkpoint/regions.py``) on the real
framework layers of ``test_guarantee_model.py``'s model network.

The job is two independent chains (``src_a -> mid_a -> count_a`` and the same
with ``_b``), so two failover regions.  A kill starts the replacement in a new
generation from the newest checkpoint complete for its region's workers, and
only that region's other workers get the ROLLBACK.  Whatever the kill points
(one region, both, the same one twice), each chain's counts are exact under
``exactly_once``; the workers of a region no kill touched never roll back or
restore; a source's ``replayed`` metric is the number of tuples it emitted
again.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_guarantee_model import (
    REFERENCE,
    Net,
    Numbers,
    Tally,
    actions,
    model_operators,  # noqa: F401 - the module's fixture registers the model operators
    play,
)

from typhoon.checkpoint.progress import recovery_point
from typhoon.checkpoint.regions import REGION, failover_regions, roll_back, rollback_set
from typhoon.runtime.framework import Framework
from typhoon.wire import Control, ControlTuple

JOB = """
name: regions
config: {guarantee: exactly_once, checkpoint_interval_ms: 5}
spouts:
  - {id: src_a, operator: model_numbers, parallelism: 2}
  - {id: src_b, operator: model_numbers, parallelism: 1}
bolts:
  - {id: mid_a, operator: model_keyed, parallelism: 2}
  - {id: mid_b, operator: model_keyed, parallelism: 2}
  - {id: count_a, operator: model_tally, parallelism: 2}
  - {id: count_b, operator: model_tally, parallelism: 1}
streams:
  - {from: src_a, to: mid_a, grouping: shuffle}
  - {from: src_b, to: mid_b, grouping: shuffle}
  - {from: mid_a, to: count_a, grouping: {type: fields, fields: [key]}}
  - {from: mid_b, to: count_b, grouping: {type: fields, fields: [key]}}
"""


class RegionNet(Net):
    def __init__(self) -> None:
        super().__init__(job=JOB)
        self.touched: set[int] = set()  # workers of a region a kill rolled back
        self.replay_checks: list[tuple[Framework, int, int]] = []  # (source, gen, tuples)

    def kill(self, wid: int) -> None:
        """The worker dies; its region (and only it) goes back to the newest checkpoint
        complete for that region's workers (what fault_recovery.py does)."""
        self.lose_inbound(wid)
        self.generation += 1
        rollback = rollback_set(self.topo, self.phys, [wid])
        assert rollback.path == REGION and wid in rollback.workers
        region = set(rollback.workers)
        epoch = recovery_point(self.phys, self.store, region)
        self.check_recovery_point(epoch, region)
        self.restored.append(epoch)
        self.phys = roll_back(self.phys, region, self.generation, epoch)
        self.fws[wid] = self.start(self.phys, wid)
        self.touched |= region
        body = {"generation": self.generation, "epoch": -1 if epoch is None else epoch}
        for other in sorted(region - {wid}):
            self.controls.append((other, ControlTuple(Control.ROLLBACK, body)))

    def control(self, i: int) -> None:
        wid, ct = self.controls[i]
        fw = self.fws[wid]
        before = fw.op.next if isinstance(fw.op, Numbers) else None
        rolled = fw.rollbacks
        super().control(i)
        if before is not None and fw.rollbacks > rolled:
            # tuples it emits again: from the checkpoint's offset to where it had come
            start = Numbers.seeks[-1][1] if fw.epoch is not None else fw.op.index
            replay = (before - start) // fw.op.step
            self.replay_checks.append((fw, fw.gen, replay))

    def chain_counts(self, chain: str) -> dict[int, int]:
        merged: collections.Counter = collections.Counter()
        for wid, fw in self.fws.items():
            if isinstance(fw.op, Tally) and self.phys.by_id(wid).node == f"count_{chain}":
                merged.update(fw.op.counts)
        return dict(merged)

    def check(self) -> None:
        assert self.chain_counts("a") == REFERENCE
        assert self.chain_counts("b") == REFERENCE
        for wid, fw in self.fws.items():
            if wid not in self.touched:
                assert fw.rollbacks == 0 and fw.restored == [], (wid, fw.restored)
        for fw, gen, want in self.replay_checks:
            replayed = fw.metrics()["replayed"]
            assert replayed[str(gen)] == want, (fw.worker_id, gen, replayed, want)


def regions_of(net: RegionNet) -> list[list[int]]:
    return [sorted(r) for r in failover_regions(net.topo, net.phys)]


def test_the_models_job_has_two_regions():
    net = RegionNet()
    a, b = regions_of(net)
    nodes = {n: {net.phys.by_id(w).node for w in r} for n, r in (("a", a), ("b", b))}
    assert nodes == {"a": {"src_a", "mid_a", "count_a"}, "b": {"src_b", "mid_b", "count_b"}}


@pytest.mark.parametrize("second", ["same", "other", "none"])
def test_region_rollbacks_at_every_point_of_a_run_stay_exact(second):
    """A sweep over kill points and victims: the untouched region never rolls back, both
    chains count exactly, and most restores go to a checkpoint, not the start."""
    restored: list[int | None] = []
    replays = 0
    for point in range(0, 700, 29):
        net = RegionNet()
        a, b = regions_of(net)
        net.run_out(limit=point)
        first = a[point % len(a)]
        net.kill(first)
        net.run_out(limit=point // 3)
        if second == "same":
            net.kill(a[(point // 7) % len(a)])
        elif second == "other":
            net.kill(b[(point // 7) % len(b)])
        net.run_out()
        net.check()
        if second != "other":
            assert not set(b) & net.touched
        restored += net.restored
        replays += len(net.replay_checks)
    epochs = [e for e in restored if e is not None]
    assert len(epochs) > len(restored) // 2, restored
    assert replays, "no source rolled back in its process"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions, st.integers(0, 3))
def test_region_failover_is_exact_whatever_the_interleaving(script: list[Any], kills: int):
    net = RegionNet()
    play(net, script, kills)
    net.check()
