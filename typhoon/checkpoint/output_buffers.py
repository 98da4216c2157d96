"""Output buffers of upstream backup (SAND §4.1): what each link sent since the
receiver's last completed checkpoint, so that a sender can replay it to a
receiver that rolled back, without rolling back itself.

One buffer per receiver holds the entries sent to it in link order, data and
punctuations alike (anchors, watermarks, end of stream: a receiver restored to
epoch ``E`` must see them again), except marks, which belong to a generation.
An anchor entry splits the buffer into epochs.  ``purge(C)`` drops what precedes
anchor ``C`` once the checkpoint ``C`` is complete (no recovery goes back
further); ``after(E)`` is exactly what followed anchor ``E`` on the link, the
input the receiver's state at ``E`` does not include (Property 4.1: its state
at ``E`` depends only on what came before anchor ``E`` on each input).

Bounded: past ``limit`` bytes a sender either waits (``full``: a source stops
emitting until a purge; its anchors still go out, so a purge comes) or, where
waiting could hold back the anchor that would free it (a bolt), gives up the
oldest epochs (``trimmed``): they can no longer be replayed, and a failure that
needs them falls back to region rollback (``covers`` says no).  Tuples are never
lost by this: the buffer is only for recovery.  Pure bookkeeping, no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

START = -1  # "from the start of the link": nothing purged yet (epoch None in a restore)


@dataclass
class LinkBuffer:
    """The entries sent to one receiver since ``base`` (an epoch's anchor, or START)."""

    base: int = START
    lost: bool = False  # entries dropped by a trim: nothing is covered until the next anchor
    items: deque[tuple[int, bytes, int | None]] = field(default_factory=deque)
    anchors: dict[int, int] = field(default_factory=dict)  # epoch -> absolute index
    eos: int | None = None  # absolute index of the end of stream sent on the link
    nbytes: int = 0
    dropped: int = 0  # entries dropped from the front (``anchors`` hold absolute indexes)

    def covers(self, epoch: int | None) -> bool:
        """``after(epoch)`` is everything the link carried after anchor ``epoch``."""
        e = START if epoch is None else epoch
        if self.lost:
            return False
        return e == self.base or e in self.anchors or self._ended_before(e)

    def _ended_before(self, epoch: int) -> bool:
        """The sender finished on this link before anchor ``epoch``: the receiver checkpointed
        ``epoch`` after our end of stream, so its state holds all we sent; only the end of
        stream is still to come again."""
        return self.eos is not None and epoch > self.base and max(self.anchors, default=-2) < epoch

    def start_of(self, epoch: int | None) -> int:
        """Index into ``items`` of the first entry after anchor ``epoch``."""
        e = START if epoch is None else epoch
        if e == self.base:
            return 0
        if e in self.anchors:
            return self.anchors[e] - self.dropped + 1
        assert self.eos is not None
        return self.eos - self.dropped


class OutputBuffers:
    """Upstream backup of one worker: a :class:`LinkBuffer` per receiver."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # bytes over every link
        self.links: dict[int, LinkBuffer] = {}
        self.nbytes = 0
        self.uncoverable = False  # something went where the sender cannot tell (balanced)
        self.trimmed = 0  # entries given up to stay within the limit
        self.purged = 0  # entries dropped by purges
        self.replayed = 0  # entries sent again
        self.base = START  # where a link first sent to from now on starts

    def reset(self, epoch: int | None) -> None:
        """The sender itself went back to ``epoch``: what it sends from now on is the link's
        new history (its receivers went back with it)."""
        self.links = {}
        self.base = START if epoch is None else epoch
        self.nbytes = 0
        self.uncoverable = False

    def _link(self, dst: int) -> LinkBuffer:
        buf = self.links.get(dst)
        if buf is None:
            buf = self.links[dst] = LinkBuffer(base=self.base)
        return buf

    def record(
        self, dst: int, stream: int, payload: bytes, anchor: int | None = None, eos: bool = False
    ) -> None:
        """``payload`` went to ``dst`` on ``stream``; ``anchor``: it is that epoch's anchor;
        ``eos``: it is our end of stream on the link."""
        buf = self._link(dst)
        if buf.lost:
            if anchor is None:
                return  # not covered anyway: the next anchor starts a clean stretch
            buf.lost = False
            buf.base = anchor
            return
        buf.items.append((stream, payload, anchor))
        n = len(payload)
        buf.nbytes += n
        self.nbytes += n
        if anchor is not None:
            buf.anchors[anchor] = len(buf.items) - 1 + buf.dropped
        if eos and buf.eos is None:
            buf.eos = len(buf.items) - 1 + buf.dropped

    def balanced(self) -> None:
        """Data went to a load-balancer address: the switch picked the receiver."""
        self.uncoverable = True

    @property
    def full(self) -> bool:
        return self.nbytes >= self.limit

    def covers(self, dst: int, epoch: int | None) -> bool:
        if self.uncoverable:
            return False
        buf = self.links.get(dst)
        if buf is None:  # nothing sent to it yet: covered if nothing was purged either
            return (START if epoch is None else epoch) == self.base
        return buf.covers(epoch)

    def coverage(self) -> int | None:
        """The oldest epoch every link can be replayed from (START: the start), None if
        some link cannot be replayed at all (the metrics' ``backup_from``)."""
        if self.uncoverable or any(b.lost for b in self.links.values()):
            return None
        bases = [b.base for b in self.links.values()]
        return max(bases) if bases else self.base

    def after(self, dst: int, epoch: int | None) -> list[tuple[int, bytes]]:
        """Every entry sent to ``dst`` after anchor ``epoch`` (``covers`` must hold)."""
        if not self.covers(dst, epoch):
            raise ValueError(f"the buffer to {dst} does not reach back to epoch {epoch}")
        buf = self.links.get(dst)
        if buf is None:
            return []
        first = buf.start_of(epoch)
        out = [(stream, payload) for stream, payload, _ in list(buf.items)[first:]]
        self.replayed += len(out)
        return out

    def whole(self, dst: int) -> list[tuple[int, bytes]] | None:
        """Every entry ever sent to ``dst`` since this worker's start or rollback, None if
        some were purged or trimmed already."""
        buf = self.links.get(dst)
        if buf is None:
            return []
        if buf.dropped or buf.lost:
            return None
        return [(stream, payload) for stream, payload, _ in buf.items]

    def purge(self, epoch: int) -> None:
        """Checkpoint ``epoch`` is complete: drop what each link sent up to its anchor."""
        for buf in self.links.values():
            if buf.lost or epoch <= buf.base:
                continue
            if epoch not in buf.anchors:
                continue  # its anchor did not go out on this link yet
            self._drop_through(buf, epoch)
        self.base = max(self.base, epoch)

    def _drop_through(self, buf: LinkBuffer, epoch: int, trimming: bool = False) -> None:
        while buf.items:
            stream, payload, anchor = buf.items.popleft()
            buf.dropped += 1
            buf.nbytes -= len(payload)
            self.nbytes -= len(payload)
            if trimming:
                self.trimmed += 1
            else:
                self.purged += 1
            if buf.eos is not None and buf.eos < buf.dropped:
                buf.eos = None
            if anchor is not None:
                buf.anchors = {e: i for e, i in buf.anchors.items() if e > anchor}
                if anchor == epoch:
                    break
        buf.base = epoch

    def trim(self) -> None:
        """Over the limit where waiting is not safe: give up the oldest epoch of every
        link (a link with no later anchor gives up everything until its next one)."""
        while self.full and self.nbytes:
            buf = max(self.links.values(), key=lambda b: b.nbytes)
            later = sorted(e for e in buf.anchors if e > buf.base)
            if later:
                self._drop_through(buf, later[0], trimming=True)
                continue
            self.trimmed += len(buf.items)
            self.nbytes -= buf.nbytes
            buf.dropped += len(buf.items)
            buf.items.clear()
            buf.anchors.clear()
            buf.eos = None
            buf.nbytes = 0
            buf.lost = True
