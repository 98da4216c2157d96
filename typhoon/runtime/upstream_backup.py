"""Upstream backup in the framework layer (SAND §4.1-4.2, docs/guarantees.md
"Partial rollback").

Under a guarantee with ``partial_rollback: true`` every worker keeps, per
receiver, what it sent since the newest checkpoint complete for its failover
region (:class:`typhoon.checkpoint.output_buffers.OutputBuffers`): the
transport is wrapped so that every entry that leaves is recorded, in link
order.  Twice a second the worker lists the store for the newest checkpoint
its region has written and purges through it.  Tuples of key groups whose
worker died stay on that worker's link for its replacement.  A ROLLBACK
carrying ``replay`` does not roll this worker back: it tells the listed
receivers the new generation (a mark, after which they drop what is still in
flight from before) and sends each of them again what followed the anchor of
the restored epoch on its link.  A mixin of
:class:`typhoon.runtime.framework.Framework`, which holds the state it uses.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from typhoon.checkpoint import CheckpointError
from typhoon.checkpoint.output_buffers import OutputBuffers
from typhoon.checkpoint.settings import partial_enabled
from typhoon.runtime import checkpoints as ck
from typhoon.runtime.policies import Router
from typhoon.runtime.transport import EOS_STREAM, rows_in
from typhoon.topology.config import DEFAULTS
from typhoon.topology.keygroups import NO_OWNER
from typhoon.topology.routing import receivers_of
from typhoon.wire import encode_rows

if TYPE_CHECKING:
    from typhoon.checkpoint.store import CheckpointStore
    from typhoon.runtime.framework_parts import FrameworkParts

log = logging.getLogger(__name__)

PURGE_POLL_S = 0.5  # how often a worker looks for a newer complete checkpoint
DEFAULT_BACKUP_MB = DEFAULTS.upstream_backup_mb  # per worker (0: no upstream backup)
FULL_WAIT_S = 0.01  # a source whose buffers are full looks again after this long
# a source waits at most this many checkpoint intervals for a purge, then trims like a
# bolt (its oldest epochs can no longer be replayed): a purge that never comes (the
# store is down, the region's parts changed) must not stop the job
MAX_WAIT_INTERVALS = 10


class BackedTransport:
    """The worker's transport, with every entry sent recorded in its output buffers."""

    def __init__(self, inner: Any, buffers: OutputBuffers, waits: bool) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_buffers", buffers)
        object.__setattr__(self, "_waits", waits)  # a source waits when full, a bolt trims

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def _record(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        buffers = self._buffers
        for p in payloads:
            anchor, eos = None, False
            if stream == EOS_STREAM:
                kind, a, _ = ck.punctuation(p)
                if kind == "mark":
                    continue  # a generation's, not the link's history
                if kind == "anchor":
                    anchor = a
                eos = kind == "eos"
            buffers.record(dst, stream, p, anchor, eos)
        if not self._waits and buffers.full:
            buffers.trim()

    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        self._inner.send(dst, stream, payloads)
        self._record(dst, stream, payloads)

    def send_group(
        self, group: int, dsts: list[int], payloads: list[bytes], stream: int | None = None
    ) -> None:
        self._inner.send_group(group, dsts, payloads, stream)
        for dst in dsts:
            self._record(dst, group if stream is None else stream, payloads)

    def send_balanced(self, stream: int, lb_node: int, slot: int, payloads: list[bytes]) -> None:
        self._inner.send_balanced(stream, lb_node, slot, payloads)
        self._buffers.balanced()

    def resend(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        """Send again what the buffers hold already (not recorded twice)."""
        self._inner.send(dst, stream, payloads)


def backup_limit(topology: Any) -> int:
    """Bytes of output buffers per worker (config ``upstream_backup_mb``; 0: none, as
    without ``partial_rollback``)."""
    if not partial_enabled(topology):
        return 0
    mb = (getattr(topology, "config", None) or {}).get("upstream_backup_mb", DEFAULT_BACKUP_MB)
    if isinstance(mb, bool) or not isinstance(mb, (int, float)) or mb < 0:
        raise ValueError(f"upstream_backup_mb must be a number >= 0, not {mb!r}")
    return int(mb * 1024 * 1024)


def newest_written(store: CheckpointStore, parts: set[str]) -> int | None:
    """The newest epoch with every one of ``parts`` written (listed, not read: a part
    that does not verify makes a recovery take an older epoch, which the buffers then
    do not reach, and it falls back to the region)."""
    for epoch in reversed(store.epochs()):
        if parts <= store.parts(epoch):
            return epoch
    return None


if TYPE_CHECKING:
    _Host = FrameworkParts
else:
    _Host = object  # at run time Framework is the host: nothing to inherit


class UpstreamBackup(_Host):
    """Output buffers, their purge and replay for one worker."""

    # the framework's transport, which _init_backup wraps in a BackedTransport (Any: it
    # stands in for a Transport by delegation, which FrameworkParts.io cannot say)
    io: Any

    def _init_backup(self) -> None:
        """After ``_init_guarantee``: a replacement's buffers start at its restored epoch."""
        self.backup: OutputBuffers | None = None
        self.backup_refused = 0
        self.replayed_gen: dict[int, int] = {}  # receiver -> newest generation replayed to it
        self.next_purge_poll = 0.0
        self.full_since: float | None = None
        self.orphans: dict[int, Router] = {}  # stream -> its route before a dead owner left
        self.backup_orphans = 0
        self.tuples_replayed: dict[int, int] = {}  # generation -> tuples resent for it
        limit = backup_limit(self.spec.topology)
        if self.ckpt is None or limit == 0:
            return
        self.backup = OutputBuffers(limit)
        self.backup.reset(self.epoch)
        self.io = BackedTransport(self.io, self.backup, waits=self.is_spout)
        self._region_parts()

    def _region_parts(self) -> None:
        """Store parts of this worker's failover region (``typhoon.checkpoint.regions``:
        the connected component of the worker graph; found here without networkx,
        which a worker does not load)."""
        topo, phys = self.spec.topology, self.spec.physical
        near: dict[int, set[int]] = {w.worker_id: set() for w in phys.workers}
        for w in phys.workers:
            for r in receivers_of(topo, phys, w.worker_id):
                if r in near and r != w.worker_id:
                    near[w.worker_id].add(r)
                    near[r].add(w.worker_id)
        region, todo = {self.worker_id}, [self.worker_id]
        while todo:
            for n in near.get(todo.pop(), ()):
                if n not in region:
                    region.add(n)
                    todo.append(n)
        self.purge_parts = {
            f"{w.node}-{w.index}" for w in phys.workers if w.active and w.worker_id in region
        }

    def _orphan_route(self, old: Router | None, new: Router) -> None:
        """A ROUTING installed ``new``.  Key groups whose worker is gone (a dead worker
        routed around, ``NO_OWNER``) would leave their tuples unrouted; under partial
        rollback this worker does not roll back, so it keeps them for the replacement:
        recorded on the dead owner's link (found with the route before), which the
        replay hands to the replacement (``replay_from``)."""
        if getattr(self, "backup", None) is None:
            return
        if NO_OWNER not in new.groups:
            self.orphans.pop(new.sid, None)
        elif old is not None and NO_OWNER not in old.groups:
            self.orphans[new.sid] = old

    def _unrouted(self, r: Router, values: list[Any]) -> None:
        """A tuple no receiver takes: counted, or kept for a dead owner's replacement."""
        old = self.orphans.get(r.sid) if self.backup is not None else None
        if old is not None:
            dst = old.select(values)
            if dst >= 0:
                assert self.backup is not None
                self.backup.record(dst, r.sid, encode_rows([values]))
                self.backup_orphans += 1
                return
        self.unrouted += 1

    def backup_full(self) -> bool:
        """A source's buffers are full: it emits again once a purge freed them, or trims
        them after ``MAX_WAIT_INTERVALS`` checkpoint intervals without one."""
        backup = self.backup
        if backup is None or not backup.full:
            self.full_since = None
            return False
        if self.full_since is None:
            self.full_since = self.now
        elif self.now - self.full_since >= MAX_WAIT_INTERVALS * self.interval:
            log.warning("worker %d: no purge for %.1f s: output buffers trimmed",
                        self.worker_id, self.now - self.full_since)  # fmt: skip
            backup.trim()
            self.full_since = None
            return backup.full
        return True

    def _backup_reset(self, epoch: int | None) -> None:
        """This worker went back to ``epoch``: its receivers did too."""
        if self.backup is not None:
            self.backup.reset(epoch)

    def poll_purge(self) -> None:
        """Purge through the newest checkpoint complete for this worker's region."""
        if self.backup is None or self.now < self.next_purge_poll:
            return
        self.next_purge_poll = self.now + PURGE_POLL_S
        assert self.ckpt is not None
        store = self.ckpt.store
        if store is None:
            return
        try:
            epoch = newest_written(store, self.purge_parts)
        except CheckpointError as e:  # the store is down: the buffers wait (a source too)
            log.warning("worker %d: cannot read the checkpoint store: %s", self.worker_id, e)
            return
        if epoch is not None:
            self.backup.purge(epoch)

    def replay(
        self, gen: int, epoch: int | None, receivers: list[int], links: list[int] | None = None
    ) -> bool:
        """Receivers that went back to ``epoch`` as generation ``gen`` get, after a mark
        of that generation, what followed anchor ``epoch`` on their link.  False (and
        nothing sent) when a buffer does not reach back that far.

        ``links[i]`` (default: ``receivers[i]``) is whose link that was: a replacement
        with a worker ID of its own gets what followed the anchor on its dead
        predecessor's link, then everything sent to it so far (it took none of it:
        it was waiting for this generation's mark).

        A receiver already told a generation at least as new (a later replay, or this
        worker's own rollback) is skipped: what it gets from the newer one covers it,
        and a second copy after an older mark would be taken as new data."""
        if links is None:
            links = list(receivers)
        elif len(links) != len(receivers):
            self.io.stats.drop("malformed_replay")  # one link per receiver, or none
            return False
        link_of = {
            d: src
            for d, src in zip(receivers, links, strict=True)
            if gen > max(self.gen, self.replayed_gen.get(d, 0))
        }
        receivers = sorted(link_of)
        if not receivers:
            return True
        self.push()  # batches counted as sent go out (and into the buffers) first
        backup = self.backup

        def coverable(d: int) -> bool:
            src = link_of[d]
            assert backup is not None
            return backup.covers(src, epoch) and (src == d or backup.whole(d) is not None)

        if backup is None or not all(map(coverable, receivers)):
            self.backup_refused += 1
            log.warning(
                "worker %d: cannot replay epoch %s to %s: falling back", self.worker_id,
                epoch, receivers,
            )  # fmt: skip
            return False
        log.info("worker %d: replays epoch %s to %s (generation %d)", self.worker_id, epoch,
                 receivers, gen)  # fmt: skip
        self.io.await_generation(gen)  # a relaunched receiver's address (tcp) first
        for dst in receivers:
            self.replayed_gen[dst] = gen
        self._broadcast_punctuation(ck.mark_payload(gen, epoch), sorted(receivers))
        io = self.io
        for dst in receivers:
            src = link_of[dst]
            entries = backup.after(src, epoch)
            if src != dst:
                sent_since = backup.whole(dst) or []
                backup.replayed += len(sent_since)
                entries += sent_since
            rows: dict[int, int] = {}
            run: list[bytes] = []  # consecutive entries of one stream go in one call
            for i, (stream, payload) in enumerate(entries):
                run.append(payload)
                if stream != EOS_STREAM:
                    rows[stream] = rows.get(stream, 0) + rows_in(payload)
                if i + 1 == len(entries) or entries[i + 1][0] != stream:
                    io.resend(dst, stream, run)
                    run = []
            # the receiver counts its links from its rollback: so does this end
            for key in [k for k in self.sent_to if k[0] == dst]:
                del self.sent_to[key]
            for stream, n in rows.items():
                self.sent_to[(dst, stream)] = n
            self.tuples_replayed[gen] = self.tuples_replayed.get(gen, 0) + sum(rows.values())
        return True

    def _backup_metrics(self) -> dict[str, Any]:
        b = self.backup
        if b is None:
            return {}
        start = b.coverage()
        return {
            "backup_bytes": b.nbytes,
            "backup_from": -2 if start is None else start,  # -2: cannot replay, -1: start
            "backup_trimmed": b.trimmed,
            "backup_replayed": b.replayed,  # entries
            # tuples resent per generation (METRIC_RESP carries str-keyed maps)
            "backup_replayed_tuples": {str(g): n for g, n in self.tuples_replayed.items()},
            "backup_refused": self.backup_refused,
            "backup_orphans": self.backup_orphans,  # kept for a dead key-group owner
        }
