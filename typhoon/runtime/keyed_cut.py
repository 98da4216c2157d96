"""Checkpoints that stay consistent across a rescale (docs/guarantees.md, "Rescaling").

A global checkpoint is a cut: each key group's state must be in exactly one
worker's part of an epoch, holding exactly the tuples before that epoch's
anchors.  A migration (``typhoon.runtime.migration``) moves a group's state
outside the anchors' channels, so a part written while it runs could hold a
group twice (the old owner before it shipped, the new owner after it loaded a
state that already counts tuples from after the anchor) or not at all (the
new owner's held tuples).  Such a part is **not written**: the epoch stays
incomplete in the store and a recovery takes a newer or an older one.  A part
is skipped when, at its snapshot,

* a migration of this worker is under way (prepared and not finished), or
  tuples wait here for a moving group's state;
* this worker loaded moved state that its old owner shipped after writing
  the same or a newer epoch (the state counts tuples from after that anchor):
  the old owner's part of that epoch already holds the group;
* a sender's anchor for the epoch never came because the sender started
  sending here after it had passed the epoch (a worker a rescale added, or a
  new sender): what it sent before its next anchor is from after the epoch.

Every part records the groups its keyed state holds and the version of the
key-group table it follows (``plan``).  A rollback restores each group on its
**current** owner (the one routing sends its replayed tuples to): a worker
whose part of the epoch holds exactly its groups loads it; otherwise it loads
its keys from every part of its node in that epoch (a scale-down since the
epoch).  A mixin of :class:`typhoon.runtime.framework.Framework`.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from typhoon.runtime.operator_swap import carried_keyed

if TYPE_CHECKING:
    from typhoon.runtime.framework_parts import FrameworkParts

log = logging.getLogger(__name__)


if TYPE_CHECKING:
    _Host = FrameworkParts
else:
    _Host = object  # at run time Framework is the host: nothing to inherit


class KeyedCheckpoints(_Host):
    """Which parts are part of a consistent cut, and where keyed state is restored."""

    def _init_keyed_cut(self) -> None:
        self.plan_version = self.spec.physical.version  # the key-group table followed
        self.keyed_taint = -1  # epochs up to this one hold moved state twice: not written
        self.last_anchor: dict[int, int] = {}  # sender -> its newest anchor's epoch
        self.skipped_epochs: set[int] = set()  # an anchor of a sender never came
        self.left_upstream: set[int] = set()  # senders drained or released off our links
        self.parts_skipped = 0
        self.restored_from: list[str] = []  # parts the last restore read keyed state from

    # ----- alignment -----------------------------------------------------------------------

    def _note_anchor(self, src: int, epoch: int) -> None:
        if epoch > self.last_anchor.get(src, -1):
            self.last_anchor[src] = epoch

    def _anchored(self, epoch: int) -> set[int]:
        """Senders done with ``epoch``: its anchor came, or a later one did (anchors on a
        link come in order, so this sender never sends ``epoch`` here)."""
        came = self.anchors.get(epoch, set())
        passed = {s for s, e in self.last_anchor.items() if e > epoch and s not in came}
        if passed & self.pending_upstream:
            self.skipped_epochs.add(epoch)
        return came | passed

    def _reset_cut(self) -> None:
        """A rollback: anchors start over in the new generation."""
        self.last_anchor.clear()
        self.skipped_epochs.clear()

    # ----- writing -------------------------------------------------------------------------

    def _migrating(self) -> bool:
        return bool(
            getattr(self, "migration", None) is not None
            or self.holding
            or self.holding_keys
            or self.hold_from
            or self.held_rows
        )

    def _cut_fields(self, epoch: int) -> dict[str, Any] | None:
        """What a part of ``epoch`` records about key groups; None: the part must not be
        written (module docstring)."""
        skipped = epoch in self.skipped_epochs
        self.skipped_epochs = {e for e in self.skipped_epochs if e > epoch}
        out: dict[str, Any] = {"plan": self.plan_version}
        if self.keyed is not None:
            if self._migrating() or epoch <= self.keyed_taint:
                skipped = True
            out["groups"] = sorted(self.keyed.owned)
        if skipped:
            self.parts_skipped += 1
            log.info("worker %d: part of epoch %d not written (key groups moving)",
                     self.worker_id, epoch)  # fmt: skip
            return None
        return out

    def _moved_in(self, shipped_after: int | None) -> None:
        """Moved state arrived; its old owner had written ``shipped_after`` before."""
        if shipped_after is not None and shipped_after > self.keyed_taint:
            self.keyed_taint = shipped_after

    # ----- restoring -----------------------------------------------------------------------

    def _restore_keyed(self, epoch: int, saved: dict[str, Any]) -> None:
        """Each key on its current owner: this part if it holds exactly our groups (or
        predates the record), else our keys from every part of the node."""
        keyed, ckpt = self.keyed, self.ckpt
        assert keyed is not None and ckpt is not None  # (a rollback of keyed state)
        groups = saved.get("groups")
        if groups is None or (set(groups) == keyed.owned and not keyed.pinned):
            keyed.restore(carried_keyed(self.node, saved))  # (a part of before a swap too)
            self.restored_from = [ckpt.part]
            return
        keyed.reset()
        store = ckpt.store
        assert store is not None  # ``saved`` was read from it
        mine = re.compile(re.escape(self.node.name) + r"-\d+")
        parts = sorted(p for p in store.parts(epoch) if mine.fullmatch(p))
        for part in parts:
            other = saved if part == ckpt.part else ckpt.load_part(epoch, part)
            keyed.load_owned(carried_keyed(self.node, other))
        self.restored_from = parts
        log.info("worker %d: keyed state of epoch %d restored from %s",
                 self.worker_id, epoch, parts)  # fmt: skip

    def _cut_metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"plan": self.plan_version, "parts_skipped": self.parts_skipped}
        if self.restored_from:
            out["restored_from"] = {str(i): p for i, p in enumerate(self.restored_from)}
        return out
