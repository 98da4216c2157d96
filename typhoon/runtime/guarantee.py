"""Guaranteed processing in the framework layer (docs/guarantees.md).

Sources start an epoch every ``checkpoint_interval_ms`` with an anchor
punctuation; a worker aligns the anchors of its inputs (exactly once: holding a
sender's data past its anchor), writes its operator's state through
:mod:`typhoon.runtime.checkpoints` and passes the anchor on behind its output.
``ROLLBACK`` (or a mark punctuation of a newer generation) takes the worker back
to a global checkpoint.  A mixin of :class:`typhoon.runtime.framework.Framework`,
which holds the state it uses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from typhoon.checkpoint import CheckpointError, checkpoint_settings
from typhoon.checkpoint.progress import parts_of
from typhoon.operators import resolve_operator
from typhoon.runtime import checkpoints as ck
from typhoon.runtime.hooks import bind_operator
from typhoon.runtime.operator_swap import part_carry
from typhoon.runtime.transport import EOS_STREAM, Inbound

if TYPE_CHECKING:
    from typhoon.operators.base import Operator, Spout
    from typhoon.runtime.framework_parts import FrameworkParts

log = logging.getLogger(__name__)

COMPLETE_POLL_S = 0.2  # how often a transactional sink's worker looks for a global checkpoint
# senders whose mark may wait here for the UPSTREAM that announces them (more: counted, dropped)
MAX_EARLY_MARKS = 64


if TYPE_CHECKING:
    _Host = FrameworkParts
else:
    _Host = object  # at run time Framework is the host: nothing to inherit


class GuaranteedProcessing(_Host):
    """Checkpoint anchors, alignment, checkpoints, marks and rollback of one worker."""

    # the framework starts them, a rollback sets them again (declared here too: mypy cannot
    # type a protocol member read before a subclass sets it)
    pending_upstream: set[int]
    op: Operator

    def _init_guarantee(self, store: Any = None) -> None:
        """Checkpoint state; a worker started by a recovery restores its epoch here."""
        settings = checkpoint_settings(self.spec.topology)
        self.guarantee = settings.guarantee
        self.ckpt: ck.Checkpointer | None = None
        self.may_exit = True  # False while a finished worker may still have to roll back
        self.on_finish: Callable[[], None] | None = None
        self.gen = 0
        self.epoch: int | None = None  # newest epoch this worker checkpointed or restored
        self.discarded = 0  # rows of older generations dropped after a rollback
        self.rollbacks = 0
        # what each restore went back to (reports and tests: a recovery that found no
        # checkpoint restarts from the start, and that must be visible, not just exact)
        self.restored: list[int] = []  # epoch of every restore, -1: from the start
        self.replayed_from: Any = None  # the offset a spout last seeked to on a restore
        self.started = False
        self.deferred: list[int] = []  # checkpointed epochs whose anchor the operator holds
        # a source's position: tuples routed since the start of its input, checkpointed
        # with its offset, so that a rollback knows how many it emits again (replays:
        # generation -> tuples); routed counts per stream go on across rollbacks
        self.position_base = 0
        self.replays: dict[int, int] = {}
        self.notified = 0  # newest global checkpoint told to checkpoint_complete()
        self.next_complete_poll = 0.0
        # sender -> (generation, epoch) of its newest mark that came before an UPSTREAM
        # announced it (_not_upstream), and how many such marks were kept
        self.early_marks: dict[int, tuple[int, int | None]] = {}
        self.early_marks_kept = 0
        if self.guarantee == "none":
            return
        me = self.spec.assignment
        self.ckpt = ck.Checkpointer(
            settings.store_url, self.spec.topology.name, f"{me.node}-{me.index}", store
        )
        self.may_exit = False
        self.aligned = self.guarantee == "exactly_once"
        self.interval = settings.interval_ms / 1000.0
        self.next_anchor_at = self.now + self.interval
        self.link_gen: dict[int, int] = {}  # sender -> generation its link is in
        self.anchors: dict[int, set[int]] = {}  # epoch -> senders whose anchor arrived
        self.blocked: set[int] = set()  # senders past an anchor we are aligning (held)
        self.held: list[Inbound] = []
        self.marked: set[int] = set()  # receivers told our generation
        gen, epoch = self.spec.physical.generation_of(me.worker_id)
        if gen > 0:
            # a replacement written by a recovery: start in its region's generation, from
            # its epoch (typhoon.checkpoint.regions)
            self.gen = gen
            self._restore(epoch)

    def start(self) -> None:
        """The I/O layer is up: a worker started by a recovery tells its receivers."""
        self.started = True
        if self.ckpt is not None and self.gen > 0:
            self.io.await_generation(self.gen)  # where its relaunched receivers listen
            self._mark(self._targets())

    def _targets(self) -> list[int]:
        return sorted(set().union(*self.eos_targets.values())) if self.eos_targets else []

    def _admit(self, item: Inbound) -> bool:
        """Data of the current generation, not behind an anchor being aligned."""
        src = item.src
        if self.link_gen.get(src, 0) != self.gen:
            self.discarded += item.count()
            return False
        if src in self.blocked:
            self.held.append(item)
            return False
        return True

    def _punctuation(self, item: Inbound) -> None:
        src = item.src
        for p in item.payloads:
            kind, a, b = ck.punctuation(p)
            if kind == "eos" and a:
                self.left_upstream.add(src)  # drained or released: off this link for good
            if self.ckpt is None:
                if kind == "handoff":
                    self._handoff_from(src, a, b)
                elif kind == "wm":
                    self._watermark_from(src, p)
                elif kind in ("eos", ""):  # without a guarantee stream 0 carries EOS
                    self._eos_from(src)
                continue
            if kind == "mark":
                self._mark_from(src, a, None if b < 0 else b)
                continue
            if self.link_gen.get(src, 0) != self.gen:
                if kind == "eos" and a and src in self.pending_upstream:
                    self._eos_from(src)  # it left for good: it will not roll back
                    self._align()
                continue  # an older generation's punctuation: rolled back
            if src in self.blocked:
                self.held.append(Inbound(src, EOS_STREAM, [p]))
            elif kind == "anchor":
                self._anchor_from(src, a)
            elif kind == "handoff":
                self._handoff_from(src, a, b)
            elif kind == "wm":
                self._watermark_from(src, p)
            elif kind == "eos":
                self._eos_from(src)
                self._align()
            else:
                self.io.stats.drop("malformed_punctuation")

    def _anchor_from(self, src: int, epoch: int) -> None:
        self._note_anchor(src, epoch)
        if self.epoch is not None and epoch <= self.epoch:
            return
        self.anchors.setdefault(epoch, set()).add(src)
        if self.aligned:
            self.blocked.add(src)
        self._align()

    def _align(self) -> None:
        """Checkpoint each epoch whose anchor came from every input still sending."""
        while self.anchors:
            epoch = min(self.anchors)
            if self.pending_upstream - self._anchored(epoch):
                return
            del self.anchors[epoch]
            self._checkpoint(epoch)
            # a sender whose later anchor came already (it skipped this epoch here) stays held
            self.blocked = set().union(*self.anchors.values()) if self.aligned else set()
            held, self.held = self.held, []
            for it in held:
                self.deliver(it)

    def _checkpoint(self, epoch: int) -> None:
        """Write the state of ``epoch`` and pass the anchor on behind our output."""
        assert self.ckpt is not None
        self.flush(force=True)
        state: dict[str, Any] = {
            "epoch": epoch,
            "generation": self.gen,
            "worker": self.worker_id,
            "state": self.op.snapshot(),
            # whose state: a recovery after a swap in place carries it to today's operator
            "operator": [self.node.operator, self.node.args],
        }
        if self.context.timers.plain:
            state["timers"] = self.context.timers.snapshot()  # keyed ones are keyed state
        if self.keyed is not None and self.keyed.stores:
            state["keyed"] = self.keyed.pack()  # names the key whose state cannot be packed
        if self.is_spout:
            state["offset"] = cast("Spout", self.op).offset()
            state["exhausted"] = self.exhausted
            state["position"] = self._position()
        cut = self._cut_fields(epoch)  # None: key groups are moving, the part is no cut
        if cut is not None:
            self.ckpt.save(epoch, {**state, **cut})
        self.epoch = epoch
        if self._anchor_ready is None:
            self._broadcast_punctuation(ck.anchor_payload(epoch), self._targets())
            return
        self.deferred.append(epoch)
        self._anchor_ready(epoch)  # the operator learns the epoch of the snapshot just taken
        self._release_anchors()

    def _release_anchors(self) -> None:
        """Pass on each held anchor, oldest first, once the operator emitted what precedes it."""
        assert self._anchor_ready is not None
        while self.deferred and self._anchor_ready(self.deferred[0]):
            epoch = self.deferred.pop(0)
            self.flush(force=True)
            self._broadcast_punctuation(ck.anchor_payload(epoch), self._targets())

    def _broadcast_punctuation(self, payload: bytes, targets: list[int]) -> None:
        """One punctuation to each receiver, after and before every data path to it.

        Frames of one-to-many and balanced streams take other paths than a unicast
        punctuation: settling before means none of ours sent earlier comes after it,
        settling after means none sent later comes before it."""
        if not targets:
            return
        # unicast links deliver in order: only other paths need the (blocking) settles
        other_paths = any(not r.plain for r in self.routers.values())
        if other_paths:
            self.io.drain_balanced()
            self.io.settle(targets)
        for dst in targets:
            self.io.send(dst, EOS_STREAM, [payload])
        if other_paths:
            self.io.settle(targets)

    def maybe_anchor(self) -> None:
        """A source starts the next epoch every ``checkpoint_interval_ms``."""
        if self.now < self.next_anchor_at:
            return
        self.next_anchor_at = self.now + self.interval
        base = self.gen * ck.EPOCHS_PER_GENERATION
        self._checkpoint(max(base, self.epoch or 0) + 1)

    def _mark(self, targets: list[int]) -> None:
        self.marked.update(targets)
        self._broadcast_punctuation(ck.mark_payload(self.gen, self.epoch), targets)

    def _mark_from(self, src: int, gen: int, epoch: int | None) -> None:
        if gen > self.gen:
            self.rollback(gen, epoch)
        if gen >= self.link_gen.get(src, 0):
            self.link_gen[src] = gen

    def _not_upstream(self, item: Inbound) -> None:
        """What a worker that is not (yet) one of our senders sent: counted as
        ``not_upstream`` and never processed, except a mark under a guarantee, which
        waits for the UPSTREAM that announces its sender (``_announced``).

        A replacement started in a recovery generation marks its receivers as soon as
        it runs, while a receiver that is itself a replacement still starting learns
        its senders only at its own rejoin: the mark can come first.  Dropped, it left
        that link in no generation, every tuple of the sender was discarded as older
        than ours, and the job never ended."""
        kept = 0
        if self.ckpt is not None and item.stream == EOS_STREAM:
            src = item.src
            for p in item.payloads:
                kind, gen, epoch = ck.punctuation(p)
                if kind != "mark":
                    continue
                if src not in self.early_marks and len(self.early_marks) >= MAX_EARLY_MARKS:
                    break
                old = self.early_marks.get(src)
                if old is None or gen >= old[0]:
                    self.early_marks[src] = (gen, None if epoch < 0 else epoch)
                kept += 1
        self.early_marks_kept += kept
        dropped = item.count() - kept
        if dropped:
            self.io.stats.drop("not_upstream", dropped)

    def _announced(self, added: set[int], removed: list[int]) -> None:
        """UPSTREAM added ``added`` and removed ``removed``: a mark an added sender sent
        before counts now, as if it had come after (it may roll this worker back)."""
        for src in removed:
            self.early_marks.pop(src, None)
        for src in sorted(added):
            mark = self.early_marks.pop(src, None)
            if mark is not None:
                self._mark_from(src, *mark)

    def rollback(self, gen: int, epoch: int | None) -> None:
        """Go back to the global checkpoint ``epoch`` (None: the start) as generation ``gen``.

        Everything since is redone: output not sent yet is dropped, the operator is
        built again from its checkpointed state, a source seeks back, every sender
        is waited for again, and each receiver is told (mark) so that it drops what
        is still in flight from before.
        """
        if self.ckpt is None or gen <= self.gen:
            return
        # a mark of ``gen`` can come before the coordinator's peers of ``gen``: nothing of it
        # is sent before this worker knows where the workers relaunched for it listen
        self.io.await_generation(gen)
        log.info("worker %d: rollback to epoch %s as generation %d", self.worker_id, epoch, gen)
        self.rollbacks += 1
        self.gen = gen
        self.out.clear()
        self.out_since.clear()
        self.ready.clear()
        self.ready_since.clear()
        self.anchors.clear()
        self._reset_cut()
        self.blocked.clear()
        self.held = []
        self.deferred.clear()
        # senders that finished come back, except those a reconfiguration took away
        self.pending_upstream = (
            self.pending_upstream | self.finished_upstream
        ) - self.left_upstream
        self.finished_upstream.clear()
        # end of stream goes to today's receivers: dead ones were routed around
        self.eos_targets = {sid: set(r.hops) for sid, r in self.routers.items()}
        self.done = self.input_done = self.exhausted = False
        self.may_exit = False
        # per-link counts start over (the run report compares this generation's links);
        # tuples in and out keep counting: rates include what is replayed
        self.sent_to.clear()
        self.received_from.clear()
        self.sent_balanced.clear()
        old = self.op
        try:  # before the new instance opens: it may take over what the old one held
            getattr(old, "abandon", old.close)()
        except Exception:  # the old instance is gone either way
            log.exception("worker %d: closing the rolled-back operator", self.worker_id)
        node = self.node
        if self.keyed is not None:
            self.keyed.reset()  # the new instance opens over empty mappings, then restores
        self.context.timers.restore(None)
        self.op = resolve_operator(node.operator, node.engine)(**node.args)
        self.op.open(self.context)
        bind_operator(self, self.op)  # every hook, next_columns and process_columns too
        self._restore(epoch)
        self._backup_reset(epoch)
        self._reset_watermarks()
        self.next_anchor_at = self.now + self.interval
        if self.started:
            self._mark(self._targets())

    def _restore(self, epoch: int | None) -> None:
        self.epoch = epoch
        self.restored.append(-1 if epoch is None else epoch)
        saved: dict[str, Any] = {}
        if epoch is not None:
            assert self.ckpt is not None
            saved = self.ckpt.load(epoch)
            if part_carry(self.node, saved) is None:  # (else the old operator's: no state)
                self.op.restore(saved.get("state"))
            self.context.timers.restore(saved.get("timers"))
            if self.keyed is not None:
                self._restore_keyed(epoch, saved)  # each key on its current owner
            if self.is_spout:
                self.replayed_from = saved.get("offset")
                cast("Spout", self.op).seek(self.replayed_from)
        if self.is_spout:
            self._reposition(saved.get("position") if epoch is not None else 0)
        rewind = getattr(self.op, "rewind", None)
        if rewind is not None:
            rewind(self.gen, epoch)

    def _routed(self) -> int:
        return sum(r.emitted for r in self.routers.values())

    def _position(self) -> int:
        return self.position_base + self._routed()

    def _reposition(self, saved: Any) -> None:
        """A source restored to a checkpoint at position ``saved``: a rollback of this
        process knows how far it had come, so what lies between is replayed (a
        replacement starts at ``saved`` and cannot tell; an older checkpoint without a
        position neither)."""
        if type(saved) is not int:
            self.position_base = -self._routed()
            return
        if self.rollbacks:
            self.replays[self.gen] = max(0, self._position() - saved)
        self.position_base = saved - self._routed()

    def poll_complete(self) -> None:
        """Tell an operator with ``checkpoint_complete(epoch)`` (a transactional sink)
        of each newer global checkpoint: every active worker's part of an epoch it has
        itself written is in the store (what a recovery would restore), read from the
        store a few times a second."""
        hook = getattr(self.op, "checkpoint_complete", None)
        if hook is None or self.epoch is None or self.epoch <= self.notified:
            return
        if self.now < self.next_complete_poll:
            return
        self.next_complete_poll = self.now + COMPLETE_POLL_S
        assert self.ckpt is not None
        store = self.ckpt.store
        if store is None or self.ckpt.written is None:
            return
        parts = parts_of(self.spec.physical)
        mine = min(self.epoch, self.ckpt.written)
        try:
            epochs = [e for e in store.epochs() if self.notified < e <= mine]
            for epoch in reversed(epochs):
                if parts <= store.parts(epoch):
                    self.notified = epoch
                    hook(epoch)
                    return
        except CheckpointError as e:  # the store is down: commit later, the rows wait
            log.warning("worker %d: cannot read the checkpoint store: %s", self.worker_id, e)

    def job_complete(self) -> None:
        """COMPLETE: the job ended and cannot roll back; a sink commits what it holds."""
        hook = getattr(self.op, "job_complete", None)
        if hook is not None:
            hook()

    def _guarantee_metrics(self) -> dict[str, Any]:
        assert self.ckpt is not None
        return {
            **self.ckpt.metrics(),
            "generation": self.gen,
            "discarded": self.discarded,
            "rollbacks": self.rollbacks,
            # METRIC_RESP carries str-keyed dicts, not lists: restore number -> epoch
            "restored_epochs": {str(i): e for i, e in enumerate(self.restored, 1)},
            **_offset_metric(self.replayed_from),
            "replayed": {str(g): n for g, n in self.replays.items()},
            "held": len(self.held),
            "anchors_held": len(self.deferred),
            "early_marks": self.early_marks_kept,
            **self._cut_metrics(),
            **self._backup_metrics(),
        }


def _offset_metric(offset: Any) -> dict[str, Any]:
    """``replayed_from`` for the metrics: a source's offset as it is when it is a number,
    a string or a flat dict of them (every built-in source's), else as text; none yet: {}."""
    if offset is None:
        return {}
    flat = (int, float, str)
    if isinstance(offset, flat) and not isinstance(offset, bool):
        return {"replayed_from": offset}
    if isinstance(offset, dict) and all(
        isinstance(k, str) and isinstance(v, flat) and not isinstance(v, bool)
        for k, v in offset.items()
    ):
        return {"replayed_from": dict(offset)}
    return {"replayed_from": repr(offset)}
