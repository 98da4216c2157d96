"""Guaranteed processing as the controller (or the tcp runner) sees it: which
global checkpoint is complete, when a job is finished, where a recovery rolls
back to.  Pure: callers feed it METRIC_RESP bodies and the physical topology.

Workers write their own state per epoch (``typhoon.runtime.checkpoints``) and
report the newest epoch on disk in METRIC_RESP (``checkpoint_epoch``).  An
epoch is a global checkpoint once every active worker of the physical
topology has written it; a recovery starts from the newest one whose parts
all verify in the store (a corrupt part sends it to the one before).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from typhoon.checkpoint.settings import guarantee_of
from typhoon.topology.model import PhysicalTopology, Topology

log = logging.getLogger(__name__)


def guaranteed(topology: Topology) -> bool:
    return guarantee_of(topology) != "none"


def parts_of(physical: PhysicalTopology) -> set[str]:
    """Store part names of the active workers: node and index survive a replacement."""
    return {f"{w.node}-{w.index}" for w in physical.workers if w.active}


@dataclass
class JobProgress:
    """What the workers of one application said about checkpoints and their end."""

    epochs: dict[int, int] = field(default_factory=dict)  # worker -> newest epoch written
    finished: dict[int, int] = field(default_factory=dict)  # worker -> generation it ended in
    recorded: int | None = None  # newest global checkpoint recorded in the coordinator
    completed_generation: int | None = None  # COMPLETE sent for this generation
    told: dict[int, tuple[int, float]] = field(default_factory=dict)  # worker -> ROLLBACK sent
    behind_since: dict[int, float] = field(default_factory=dict)

    def behind(
        self,
        worker: int,
        metrics: Mapping[str, Any],
        physical: PhysicalTopology,
        now: float,
        grace: float = 2.0,
    ) -> dict[str, int] | None:
        """The ROLLBACK body for a worker left in an older generation than the physical
        topology's for ``grace`` seconds (the fault detector sends its own once the
        replacement is routed to; this catches one lost, or a controller restarted
        midway), at most once a second per worker; None if it is up to date."""
        gen = metrics.get("generation")
        # its failover region's generation: other regions may have recovered since
        want, epoch = physical.generation_of(worker)
        if not isinstance(gen, int) or gen >= want or want == 0:
            self.behind_since.pop(worker, None)
            return None
        if not any(w.worker_id == worker for w in physical.workers):
            return None
        since = self.behind_since.setdefault(worker, now)
        if now - since < grace:
            return None
        last = self.told.get(worker)
        if last is not None and last[0] == want and now - last[1] < 1.0:
            return None
        self.told[worker] = (want, now)
        return {"generation": want, "epoch": -1 if epoch is None else epoch}

    def heard(self, worker: int, metrics: Mapping[str, Any]) -> None:
        epoch = metrics.get("checkpoint_epoch")
        if isinstance(epoch, int) and epoch >= 0:
            self.epochs[worker] = epoch
        gen = metrics.get("generation", 0)
        if metrics.get("done"):
            self.finished[worker] = gen if isinstance(gen, int) else 0
        else:
            self.finished.pop(worker, None)

    def global_epoch(self, physical: PhysicalTopology) -> int | None:
        """The newest epoch every active worker has written (None: not one yet)."""
        active = [w.worker_id for w in physical.workers if w.active]
        if not active or any(w not in self.epochs for w in active):
            return None
        return min(self.epochs[w] for w in active)

    def to_complete(
        self, worker: int, metrics: Mapping[str, Any], physical: PhysicalTopology
    ) -> list[int]:
        """Workers to send COMPLETE after ``worker``'s reply: every worker, the first time
        all of them finished in the current generation; afterwards a finished worker that
        still replies (the COMPLETE it was sent may be lost)."""
        if self.completed_generation == physical.generation:
            return [worker] if metrics.get("done") else []
        if not self.complete(physical):
            return []
        self.completed_generation = physical.generation
        return [w.worker_id for w in physical.workers]

    def complete(self, physical: PhysicalTopology) -> bool:
        """Every active worker finished in the current generation (or a newer one)."""
        active = [w.worker_id for w in physical.workers if w.active]
        return bool(active) and all(
            self.finished.get(w, -1) >= physical.generation_of(w)[0] for w in active
        )


def recovery_point(
    physical: PhysicalTopology, store: Any, workers: set[int] | None = None
) -> int | None:
    """The epoch a recovery rolls ``workers`` (None: every worker) back to: the newest
    one whose parts all exist and verify in ``store`` (None: none yet, start over from
    the beginning).  A failover region's workers checkpoint apart from the others'
    (``typhoon.checkpoint.regions``), so only their parts count.

    With keyed state the parts must also hold every key group of each keyed node
    (:func:`holds_every_group`): after a scale-down the final workers' parts of an epoch
    are all there while the drained worker's part of it may not be (it was skipped while
    the groups moved), and its groups would be lost.
    """
    parts = parts_of(physical)
    if workers is not None:
        parts = {
            f"{w.node}-{w.index}" for w in physical.workers if w.active and w.worker_id in workers
        }
    keyed = {
        node: len(table)
        for node, table in physical.key_groups.items()
        if any(p.rpartition("-")[0] == node for p in parts)
    }
    if not keyed:
        return store.latest_complete(parts)
    return store.latest_complete(parts, accept=lambda e: holds_every_group(store, e, keyed))


def holds_every_group(store: Any, epoch: int, keyed: Mapping[str, int]) -> bool:
    """Whether the parts of ``epoch`` of each node in ``keyed`` (node -> its number of key
    groups) record every group between them (``typhoon/runtime/keyed_cut.py`` writes
    ``groups``).  A node with a part that records none (not keyed state, or a part from
    before the record) is not judged."""
    for node, count in keyed.items():
        mine = re.compile(re.escape(node) + r"-\d+")
        held: set[int] = set()
        for part in store.parts(epoch):
            if not mine.fullmatch(part):
                continue
            try:
                groups = msgpack.unpackb(
                    store.read(epoch, part), raw=False, strict_map_key=False
                ).get("groups")
            except (ValueError, AttributeError, msgpack.UnpackException):
                groups = None
            if not isinstance(groups, list):
                break
            held.update(g for g in groups if isinstance(g, int))
        else:
            if not held >= set(range(count)):
                log.warning(
                    "checkpoint epoch %d: the parts of %s hold %d of its %d key groups; "
                    "skipping it", epoch, node, len(held & set(range(count))), count,
                )  # fmt: skip
                return False
    return True
