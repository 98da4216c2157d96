"""Reliable, credit-paced links between workers over the switch (docs/flow_control.md).

A *link* carries data frames from one sender to one destination address: a
receiver's worker address (a unicast link, id 0) or the one-to-many address of a
stream (a multicast link, id = that stream: the switch copies every frame to each
*member*).  Every frame of a link has a sequence number, +1 per frame, modulo
2**32; the frames of one link follow one OpenFlow rule per bridge, so the switch
keeps them in order, and a gap means a frame was dropped.

Reliability (selective repeat).  The sender keeps every frame it sent until each
member has *consumed* it.  A receiver delivers a link's frames in sequence order
only: a frame after a gap waits (at most a window of them), and the receiver asks
for what is missing with a NACK ``[link, from, to)`` at once; the sender writes
those frames again (to the link's own address: on a multicast link the other
members drop the copies as duplicates).  A lost tail has no later frame to reveal
it: a sender whose frames stay unconfirmed for ``probe_s`` sends a SYNC carrying
its next sequence number on the link's own path (for a multicast link, to the
group address: the same rule as the data, so it cannot overtake it), and each
member answers with a NACK for what it lacks, or a GRANT.

Flow control.  A GRANT ``[link, consumed, received]`` carries a receiver's
cumulative counts; the sender may have at most ``window`` frames of a link beyond
any member's *consumed* count, and at most ``budget`` bytes (kernel truesize, see
:mod:`typhoon.runtime.truesize`) over all its links together -- the share of the
switch's socket buffers this worker may fill (:mod:`typhoon.topology.budgets`).
Receivers grant when the sender asks: a data frame flagged ACK_REQ (the sender sets
it every quarter window, or every quarter of its byte share on the link), a SYNC,
a duplicate, or a periodic refresh that repairs a lost grant.

Joining and restarts.  Before its first frame to a member, the sender sends that
member a SYNC with a *base*: where its part of the link starts.  A receiver
without state for a link takes the base of such a SYNC, or starts at frame 0;
frames of a link it knows nothing about are dropped and answered with a RESYNC,
which makes the sender send the base again (and repeat what followed).  A SYNC
base outside what the receiver holds (the sender restarted under the same id)
resets the receiver's state.

Everything here is pure bookkeeping: frames are opaque bytes, time is passed in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

U32 = 1 << 32
MASK = U32 - 1

# credit frame kinds (the ``stream`` field of a CREDIT frame); entries are u32 values
GRANT = 0  # receiver -> sender [link, consumed, received]
SYNC = 1  # sender -> receiver [link, next] or [link, next, base]
LB_GRANT = 2  # load-balanced streams, typhoon.runtime.lb_credits
LB_SYNC = 3
NACK = 4  # receiver -> sender [link, from, to): send these frames again
RESYNC = 5  # receiver -> sender [link]: I hold no state for this link, send me its base

# frames per link beyond a receiver's consumed count; the byte budget binds first for
# large frames.  32 stalled forward.yaml's source on every ~32nd frame of 9,000 bytes (496
# waits for credit in 16,133 frames); 128 cut that to 55-90, but then a slow operator
# (300 us per tuple) held the controller's METRIC_REQ behind tens of seconds of queued data.
# With 64 KB frames 32 ran forward.yaml about as fast.  128 again since urgent control
# tuples overtake queued data (docs/flow_control.md, "The 128-frame window again"); a
# topology may ask for another with config: {sdn: {window: N}}.  Receivers' TAP queues hold
# DEFAULT_TXQUEUELEN frames (runtime/tap.py).
DEFAULT_WINDOW = 128
MAX_WINDOW = 1 << 20  # frames kept for retransmission per link, far below 2**31
PROBE_S = 0.02  # unconfirmed frames this old make the sender probe with a SYNC
REFRESH_S = 0.1  # a receiver refreshes its grant this often while a link is in use
LINGER_S = 1.0  # ... and for this long after its last frame
NACK_S = 0.01  # a gap still open after this long is NACKed again
RETX_GUARD_S = 0.002  # the same frames are not sent again within this
ACK_SHARE = 4  # the sender asks for a grant every window // ACK_SHARE frames


def diff32(a: int, b: int) -> int:
    """``a - b`` for counters modulo 2**32, as a signed value in [-2**31, 2**31)."""
    d = (a - b) & MASK
    return d - U32 if d >= 1 << 31 else d


def check_window(window: int) -> int:
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"window must be an int in 1..{MAX_WINDOW}, got {window!r}")
    return window


def unwrap(value: int, ref: int) -> int:
    """The integer ``<= ref`` nearest to ``ref`` that equals ``value`` modulo 2**32."""
    return ref - ((ref - value) & MASK)


# --------------------------------------------------------------------------- sender side


@dataclass(slots=True)
class Member:
    """What a sender knows of one receiver of a link (sequence numbers unwrapped)."""

    consumed: int  # frames the receiver handed to its operator (credit returns)
    received: int  # frames it holds in order (no need to send them again)
    until: float = math.inf  # left the link: owes confirmation of frames below this
    dead: bool = False  # stopped answering: frames to it are written off
    lost: int = 0  # frames written off for it besides those a dead member lacks
    base_sent: bool = False  # the SYNC with its base went out
    asked: float | None = None  # oldest request for a grant that nothing answered
    last_probe: float = -math.inf
    retx_from: int = -1  # start of the last retransmission for it, and when
    retx_at: float = -math.inf

    def end(self, nxt: int) -> int:
        """Sequence number after the last frame this member must get."""
        return nxt if self.until == math.inf else int(min(nxt, self.until))


@dataclass(slots=True)
class OutLink:
    """The sender's side of one link: frames kept for retransmission, and its members."""

    key: int  # receiver id (unicast) or MULTICAST_KEY + stream (multicast)
    link: int  # 0 (unicast) or the stream of the one-to-many address
    next: int = 0  # sequence number of the next new frame (unwrapped)
    base: int = 0  # sequence number of frames[0]
    frames: deque = field(default_factory=deque)  # kept frames [base, next): bytes
    costs: deque = field(default_factory=deque)  # their truesize
    members: dict[int, Member] = field(default_factory=dict)
    unmarked: int = 0  # frames since the last ACK_REQ
    unmarked_bytes: int = 0
    sent_at: float = -math.inf  # when the newest frame went out
    progress_at: float = -math.inf  # when a member last confirmed something new
    frames_sent: int = 0  # statistics: new frames, frames sent again
    retransmitted: int = 0

    def live(self) -> Iterable[Member]:
        return (m for m in self.members.values() if not m.dead)

    def inflight(self) -> int:
        """Frames some live member has not consumed yet."""
        return self.next - self.base

    def unconfirmed(self) -> bool:
        """Some live member lacks a frame it must get."""
        nxt = self.next
        return any(m.received < m.end(nxt) for m in self.live())

    def frame(self, seq: int) -> bytes:
        return self.frames[seq - self.base]


MULTICAST_KEY = 1 << 16  # OutLink keys of multicast links: MULTICAST_KEY + stream


class Sender:
    """Every outgoing link of one worker, and the byte budget they share.

    ``budget``: bytes of truesize allowed in flight over all links (None: frames
    only).  A frame counts from the moment it is written until every live member
    consumed it.
    """

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        budget: int | None = None,
        probe_s: float = PROBE_S,
        retx_guard_s: float = RETX_GUARD_S,
    ) -> None:
        self.window = check_window(window)
        self.budget = budget
        self.probe_s = probe_s
        self.retx_guard_s = retx_guard_s
        self.port_bytes = 0
        self.links: dict[int, OutLink] = {}
        self.mark_every = max(1, window // ACK_SHARE)

    # ----- links and members -----------------------------------------------------------

    def unicast(self, dst: int) -> OutLink:
        ol = self.links.get(dst)
        if ol is None:
            ol = self.links[dst] = OutLink(dst, 0)
            ol.members[dst] = Member(0, 0)
        return ol

    def multicast(self, stream: int) -> OutLink:
        key = MULTICAST_KEY + stream
        ol = self.links.get(key)
        if ol is None:
            ol = self.links[key] = OutLink(key, stream)
        return ol

    def find(self, link: int, src: int) -> tuple[OutLink | None, Member | None]:
        """The link and member a credit frame from ``src`` about ``link`` refers to."""
        ol = self.links.get(src if link == 0 else MULTICAST_KEY + link)
        if ol is None:
            return None, None
        return ol, ol.members.get(src)

    def set_members(self, ol: OutLink, dsts: Iterable[int]) -> list[int]:
        """A multicast link's receivers are ``dsts`` from now on; returns the new ones.

        A member that joins gets the frames from the next one on; a member that
        leaves stays until it confirmed the frames sent while it was one.
        """
        wanted = set(dsts)
        joined = []
        for d in wanted:
            m = ol.members.get(d)
            if m is None or m.until != math.inf:
                ol.members[d] = Member(ol.next, ol.next)
                joined.append(d)
        for d, m in list(ol.members.items()):
            if d not in wanted and m.until == math.inf:
                m.until = ol.next
        self._settle(ol)
        return sorted(joined)

    def needs_base(self, ol: OutLink) -> list[Member]:
        """Live members whose base SYNC has not gone out (each returned once)."""
        out = []
        for m in ol.members.values():
            if not m.base_sent and not m.dead:
                m.base_sent = True
                out.append(m)
        return out

    # ----- sending ---------------------------------------------------------------------

    def port_full(self, cost: int = 0) -> bool:
        """The bytes in flight leave no room for a frame of ``cost``."""
        budget = self.budget
        return budget is not None and self.port_bytes > 0 and self.port_bytes + cost > budget

    def lacking(self, ol: OutLink) -> list[int]:
        """Live members without credit for one more frame of ``ol``."""
        limit = ol.next - self.window
        return [d for d, m in ol.members.items() if not m.dead and m.until == math.inf
                and m.consumed <= limit]  # fmt: skip

    def can_send(self, ol: OutLink, cost: int = 0) -> bool:
        if self.port_full(cost):
            return False
        limit = ol.next - self.window
        for m in ol.members.values():
            if m.consumed <= limit and not m.dead and m.until == math.inf:
                return False
        return True

    def wants_ack(self, ol: OutLink, cost: int) -> bool:
        """Should the frame about to be sent on ``ol`` ask for a grant (ACK_REQ)?"""
        if ol.unmarked + 1 >= self.mark_every:
            return True
        budget = self.budget
        if budget is None:
            return False
        busy = sum(1 for o in self.links.values() if o.frames) or 1
        return ol.unmarked_bytes + cost >= budget // (ACK_SHARE * busy)

    def on_send(self, ol: OutLink, frame: bytes, cost: int, now: float, marked: bool) -> int:
        """A new frame of ``ol`` was written; returns its sequence number."""
        seq = ol.next
        ol.next = seq + 1
        if not ol.frames:
            ol.progress_at = now  # the probe clock starts with the first unconfirmed frame
        ol.frames.append(frame)
        ol.costs.append(cost)
        self.port_bytes += cost
        ol.sent_at = now
        ol.frames_sent += 1
        if marked:
            ol.unmarked = 0
            ol.unmarked_bytes = 0
        else:
            ol.unmarked += 1
            ol.unmarked_bytes += cost
        if not any(True for _ in ol.live()):
            self._settle(ol)  # nobody to wait for: nothing stays in flight
        return seq

    # ----- confirmations ---------------------------------------------------------------

    def on_grant(self, ol: OutLink, m: Member, consumed: int, received: int, now: float) -> bool:
        """A GRANT; returns True if it revived a member marked dead."""
        c = unwrap(consumed, ol.next)
        r = unwrap(received, ol.next)
        if r < c:
            return False  # malformed: ignored
        revived = m.dead
        if revived:
            self._revive(ol, m, c, r)
        if c > m.consumed or r > m.received:
            ol.progress_at = now
        m.consumed = max(m.consumed, c)
        m.received = max(m.received, r, m.consumed)
        m.asked = None
        self._settle(ol)
        return revived

    def on_nack(self, ol: OutLink, m: Member, start: int, stop: int, now: float) -> range:
        """A NACK: the frames to send again (an empty range when there is nothing to do)."""
        lo = unwrap(start, ol.next)
        hi = unwrap(stop, ol.next)
        if hi <= lo or hi - lo > ol.next - ol.base:
            hi = ol.next  # ``to`` unknown or garbled: everything after ``from``
        m.asked = None
        if lo > m.received:
            m.received = lo  # it holds everything before the gap
            ol.progress_at = now
        lo = max(lo, ol.base, m.received)
        hi = min(hi, m.end(ol.next))
        if lo >= hi or m.dead:
            return range(0)
        if lo == m.retx_from and now - m.retx_at < self.retx_guard_s:
            return range(0)  # the frames are on their way already
        m.retx_from, m.retx_at = lo, now
        ol.retransmitted += hi - lo
        return range(lo, hi)

    def _revive(self, ol: OutLink, m: Member, consumed: int, received: int) -> None:
        """A member marked dead answered: what we released meanwhile is gone (counted
        lost), it skips those frames (a SYNC with its base tells it where it is now)."""
        m.dead = False
        have = max(received, m.received)
        m.lost += max(0, ol.base - have)
        m.consumed = max(consumed, m.consumed, ol.base)
        m.received = max(have, ol.base)
        m.base_sent = False

    def on_resync(self, ol: OutLink, m: Member, now: float) -> range:
        """A RESYNC: the member lost our base (or never had it: a receiver that got
        nothing before it was marked dead); it gets the base again, then the frames."""
        if m.dead:
            self._revive(ol, m, m.consumed, m.received)
            ol.progress_at = now
        m.base_sent = False
        m.retx_from = -1
        lo = max(m.received, ol.base)
        hi = m.end(ol.next)
        if lo >= hi:
            return range(0)
        m.retx_from, m.retx_at = lo, now
        ol.retransmitted += hi - lo
        return range(lo, hi)

    def _settle(self, ol: OutLink) -> None:
        """Release frames every live member consumed; forget members that are done."""
        nxt = ol.next
        low = nxt
        for d, m in list(ol.members.items()):
            if m.until != math.inf and (m.dead or m.consumed >= m.until):
                if ol.link:  # a multicast member that left and confirmed all it owed
                    del ol.members[d]
                continue
            if not m.dead:
                low = min(low, m.consumed)
        frames, costs = ol.frames, ol.costs
        freed = 0
        while ol.base < low and frames:
            frames.popleft()
            freed += costs.popleft()
            ol.base += 1
        if not frames:
            ol.base = nxt
        self.port_bytes -= freed

    # ----- timers ----------------------------------------------------------------------

    def probes_due(self, now: float) -> list[OutLink]:
        """Links whose unconfirmed frames waited ``probe_s`` without progress."""
        out = []
        for ol in self.links.values():
            if ol.frames and now - ol.progress_at >= self.probe_s and ol.unconfirmed():
                if now - max((m.last_probe for m in ol.live()), default=-math.inf) >= (
                    self.probe_s
                ):
                    out.append(ol)
        return out

    def probed(self, ol: OutLink, now: float) -> None:
        for m in ol.live():
            m.last_probe = now
            if m.asked is None:
                m.asked = now

    def start_wait(self, ol: OutLink, dsts: Iterable[int], now: float) -> None:
        """A wait for credit begins: ``dsts`` are asked from now on."""
        for d in dsts:
            m = ol.members.get(d)
            if m is not None and m.asked is None:
                m.asked = now

    def unanswered_for(self, d: int, now: float) -> float:
        """Seconds since we first asked ``d`` for a grant without an answer (0: answered).

        A live receiver, even one too busy to consume, answers every SYNC; only a
        hung or dead one stays silent.
        """
        oldest = None
        for ol in self.links.values():
            m = ol.members.get(d)
            if m is not None and m.asked is not None and not m.dead:
                oldest = m.asked if oldest is None else min(oldest, m.asked)
        return 0.0 if oldest is None else max(0.0, now - oldest)

    def mark_dead(self, d: int) -> bool:
        """``d`` stopped answering: its frames in flight are written off on every link.

        Returns True if it was alive until now.
        """
        was_alive = False
        for ol in self.links.values():
            m = ol.members.get(d)
            if m is None or m.dead:
                continue
            was_alive = True
            m.dead = True
            m.asked = None
            self._settle(ol)
        return was_alive

    def is_dead(self, d: int) -> bool:
        return any(
            ol.members.get(d) is not None and ol.members[d].dead for ol in self.links.values()
        )

    def holders(self) -> list[int]:
        """Live receivers that hold some of our bytes (their grants would free them)."""
        out = set()
        for ol in self.links.values():
            if ol.frames:
                for d, m in ol.members.items():
                    if not m.dead and m.consumed < m.end(ol.next):
                        out.add(d)
        return sorted(out)

    def owed_by(self, d: int) -> list[OutLink]:
        """Links on which live member ``d`` has not received every frame it must get."""
        out = []
        for ol in self.links.values():
            m = ol.members.get(d)
            if m is not None and not m.dead and m.received < m.end(ol.next):
                out.append(ol)
        return out

    def lost(self) -> dict[int, int]:
        """Frames written off per receiver: what dead members lack, what they skipped."""
        out: dict[int, int] = {}
        for ol in self.links.values():
            for d, m in ol.members.items():
                n = m.lost + (max(0, m.end(ol.next) - m.received) if m.dead else 0)
                if n:
                    out[d] = out.get(d, 0) + n
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "frames": sum(ol.frames_sent for ol in self.links.values()),
            # new frames per unicast link ("dst") and per one-to-many address ("all:stream")
            "frames_to": {
                (str(k) if ol.link == 0 else f"all:{ol.link}"): ol.frames_sent
                for k, ol in self.links.items()
            },
            "retransmitted": sum(ol.retransmitted for ol in self.links.values()),
            "lost": sum(self.lost().values()),
            "inflight_bytes": self.port_bytes,
        }


# --------------------------------------------------------------------------- receiver side


@dataclass(slots=True)
class InLink:
    """The receiver's side of one link (sequence numbers modulo 2**32)."""

    expect: int = 0  # next sequence number to deliver
    consumed: int = 0  # frames handed to the framework
    granted: int = 0  # ``consumed`` when the last grant went out
    ooo: dict = field(default_factory=dict)  # frames after a gap: seq -> (frame, size)
    nack_at: float = -math.inf
    nack_from: int = -1
    last_grant: float = -math.inf
    last_rx: float = -math.inf


class Receiver:
    """Every incoming link of one worker: ordering, gaps, duplicates and grants.

    Keys are (sender id, link id).  ``ooo_limit`` bounds how far past a gap frames
    are kept (a sender cannot be more than a window ahead of what we consumed).
    """

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        refresh_s: float = REFRESH_S,
        linger_s: float = LINGER_S,
        nack_s: float = NACK_S,
    ) -> None:
        self.window = check_window(window)
        self.ooo_limit = 2 * window
        self.refresh_s = refresh_s
        self.linger_s = linger_s
        self.nack_s = nack_s
        self.links: dict[tuple[int, int], InLink] = {}
        self.urgent: set[tuple[int, int]] = set()
        self._next_refresh = -math.inf
        # counters
        self.gaps = 0  # frames found missing (each was NACKed)
        self.duplicates = 0  # frames that arrived twice (dropped)
        self.unsynced = 0  # frames of a link we held no state for (dropped, RESYNC sent)

    def get(self, key: tuple[int, int]) -> InLink | None:
        return self.links.get(key)

    def start(self, key: tuple[int, int], base: int) -> InLink:
        """(Re)start a link at sequence number ``base``."""
        old = self.links.get(key)
        il = self.links[key] = InLink(base & MASK, base & MASK, base & MASK)
        if old is not None:
            il.last_grant = old.last_grant
        return il

    def accept(self, il: InLink, seq: int, item: object, now: float) -> tuple[list, bool]:
        """A data frame ``item`` with ``seq`` arrived; returns (items now in order, gap?).

        ``gap`` is True while frames are missing before ones we hold: the caller
        NACKs :meth:`nack_range`.  A duplicate returns ([], False).
        """
        il.last_rx = now
        if il.last_grant == -math.inf:  # a new link: its first refresh is due in refresh_s
            il.last_grant = now
        d = diff32(seq, il.expect)
        if d == 0:
            out = [item]
            il.expect = (il.expect + 1) & MASK
            ooo = il.ooo
            while ooo:
                nxt = ooo.pop(il.expect, None)
                if nxt is None:
                    break
                out.append(nxt)
                il.expect = (il.expect + 1) & MASK
            return out, bool(ooo)
        if d > 0:
            if d < self.ooo_limit:
                il.ooo.setdefault(seq, item)
            # (further ahead than a sender may be: not kept, the NACK asks from here)
            return [], True
        self.duplicates += 1
        return [], False

    def nack_range(
        self, il: InLink, now: float, end: int | None = None, force: bool = False
    ) -> tuple[int, int] | None:
        """The range to NACK now, if any: [expect, first frame held after the gap), or
        [expect, ``end``) when nothing is held (a SYNC said ``end`` frames were sent).

        A gap NACKed within ``nack_s`` is not NACKed again unless ``force``.
        """
        if il.ooo:
            first = min(il.ooo, key=lambda s: diff32(s, il.expect))
        elif end is not None and diff32(end, il.expect) > 0:
            first = end
        else:
            return None
        if il.nack_from == il.expect:
            if not force and now - il.nack_at < self.nack_s:
                return None
        else:
            self.gaps += diff32(first, il.expect)  # a gap not seen before
        il.nack_from, il.nack_at = il.expect, now
        return il.expect, first

    def on_sync(self, key: tuple[int, int], nxt: int, base: int | None, now: float) -> InLink:
        """A SYNC says ``nxt`` frames were sent (and, with a base, where our part of the
        link starts): the link's state after it, started or reset if needed.  A grant
        is due; KeyError if we hold no state and no base came (the caller RESYNCs)."""
        il = self.links.get(key)
        if base is not None and (
            il is None or diff32(nxt, il.expect) < 0 or diff32(il.expect, base) < 0
        ):
            il = self.start(key, base)
        elif il is None:
            raise KeyError(key)
        il.last_rx = now
        self.urgent.add(key)
        return il

    def grant(self, key: tuple[int, int], il: InLink, now: float) -> tuple[int, int]:
        """(consumed, received) to send now; records the grant."""
        il.granted = il.consumed
        il.last_grant = now
        self.urgent.discard(key)
        return il.consumed, il.expect

    def pending(self, key: tuple[int, int]) -> int:
        """Frames of the link received in order but not consumed yet."""
        il = self.links.get(key)
        return 0 if il is None else max(0, diff32(il.expect, il.consumed))

    def due(self, now: float) -> list[tuple[int, int]]:
        """Links owed a grant now: asked for, or a refresh while the link is in use."""
        out = list(self.urgent)
        if now >= self._next_refresh:
            self._next_refresh = now + self.refresh_s / 2
            for key, il in self.links.items():
                if key in self.urgent or now - il.last_grant < self.refresh_s:
                    continue
                if il.consumed != il.granted or now - il.last_rx <= self.linger_s:
                    out.append(key)
        return out

    def open_gaps(self, now: float) -> list[tuple[tuple[int, int], InLink]]:
        """Links whose gap is still open ``nack_s`` after it was last NACKed."""
        return [
            (key, il)
            for key, il in self.links.items()
            if il.ooo and now - il.nack_at >= self.nack_s
        ]
