"""The sender's side of links: frames kept until consumed, credit, probes, dead
receivers (overview in :mod:`typhoon.runtime.links`)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from typhoon.runtime.links.protocol import (
    ACK_SHARE,
    DEFAULT_WINDOW,
    DEFAULT_WINDOW_BYTES,
    DEFAULT_WINDOW_BYTES_MAX,
    PROBE_S,
    RATE_S,
    RETX_GUARD_S,
    check_window,
    check_window_bytes,
    paced_window,
    unwrap,
    window_fits,
)


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
    window_bytes: int = 0  # its byte window now (0: the sender's least, window_bytes)
    rate_at: float = -math.inf  # start of the interval its consumption rate is measured
    rate_pos: int = 0  # over, and the link's byte position it had consumed to then
    window_peak: int = 0  # the largest byte window it had (for the run report)

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
    frames: deque[bytes] = field(default_factory=deque)  # kept frames [base, next)
    costs: deque[int] = field(default_factory=deque)  # their truesize
    starts: deque[int] = field(default_factory=deque)  # ``sent_bytes`` before each of them
    sent_bytes: int = 0  # length of every frame ever sent on the link, summed
    members: dict[int, Member] = field(default_factory=dict)
    unmarked: int = 0  # frames since the last ACK_REQ
    unmarked_bytes: int = 0  # truesize since the last ACK_REQ
    unmarked_len: int = 0  # frame bytes since the last ACK_REQ
    mark_len: int = 0  # ... that ask for the next one (0: the sender's mark_bytes)
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

    def outstanding(self, m: Member) -> int:
        """Bytes of the frames ``m`` has not consumed yet (it reports frame counts; the
        sender kept each frame's length, so no byte count needs to cross the wire)."""
        i = m.consumed - self.base
        if m.consumed >= self.next or not self.starts:
            return 0
        return self.sent_bytes - self.starts[max(0, i)]

    def position(self, seq: int) -> int | None:
        """Bytes of frames sent on the link before frame ``seq`` (None: released)."""
        if seq >= self.next:
            return self.sent_bytes
        i = seq - self.base
        return self.starts[i] if 0 <= i < len(self.starts) else None

    def frame(self, seq: int) -> bytes:
        return self.frames[seq - self.base]


MULTICAST_KEY = 1 << 16  # OutLink keys of multicast links: MULTICAST_KEY + stream


class Sender:
    """Every outgoing link of one worker, and the byte budget they share.

    ``window`` frames and a byte window of frames (``window_bytes`` None or 0: frames
    only) per link beyond each member's consumed count: what the member consumed in
    the last ``PACE_S``, between ``window_bytes`` and ``window_bytes_max`` (None or 0:
    always ``window_bytes``); ``budget``: bytes of truesize
    allowed in flight over all links (None: frames only).  A frame counts from the
    moment it is written until every live member consumed it.
    """

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        budget: int | None = None,
        probe_s: float = PROBE_S,
        retx_guard_s: float = RETX_GUARD_S,
        window_bytes: int | None = DEFAULT_WINDOW_BYTES,
        window_bytes_max: int | None = DEFAULT_WINDOW_BYTES_MAX,
    ) -> None:
        self.window = check_window(window)
        self.window_bytes = check_window_bytes(window_bytes)
        most = check_window_bytes(window_bytes_max)
        # (a ceiling below the least, or no byte window at all: nothing to follow)
        self.paced = self.window_bytes is not None and (most or 0) > self.window_bytes
        self.window_bytes_max = max(most or 0, self.window_bytes or 0)
        self.mark_bytes = None if self.window_bytes is None else self.window_bytes // ACK_SHARE
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

    def lacking(self, ol: OutLink, size: int = 0) -> list[int]:
        """Live members without credit for one more frame of ``ol`` (``size`` bytes)."""
        return [d for d, m in ol.members.items() if not m.dead and m.until == math.inf
                and not self._room(ol, m, size)]  # fmt: skip

    def _room(self, ol: OutLink, m: Member, size: int) -> bool:
        if m.consumed <= ol.next - self.window:
            return False
        wb = self.window_bytes
        return wb is None or window_fits(ol.outstanding(m), size, m.window_bytes or wb)

    def can_send(self, ol: OutLink, cost: int = 0, size: int = 0) -> bool:
        """Room for a frame of ``size`` bytes (``cost`` of truesize) on ``ol``."""
        if self.port_full(cost):
            return False
        for m in ol.members.values():
            if not m.dead and m.until == math.inf and not self._room(ol, m, size):
                return False
        return True

    def wants_ack(self, ol: OutLink, cost: int, size: int = 0) -> bool:
        """Should the frame about to be sent on ``ol`` ask for a grant (ACK_REQ)?"""
        if ol.unmarked + 1 >= self.mark_every:
            return True
        mark = ol.mark_len or self.mark_bytes
        if mark is not None and ol.unmarked_len + size >= mark:
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
        ol.starts.append(ol.sent_bytes)
        ol.sent_bytes += len(frame)
        self.port_bytes += cost
        ol.sent_at = now
        ol.frames_sent += 1
        if marked:
            ol.unmarked = 0
            ol.unmarked_bytes = 0
            ol.unmarked_len = 0
        else:
            ol.unmarked += 1
            ol.unmarked_bytes += cost
            ol.unmarked_len += len(frame)
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
        if self.paced:
            self._pace(ol, m, now)
        self._settle(ol)
        return revived

    def _pace(self, ol: OutLink, m: Member, now: float) -> None:
        """Size ``m``'s byte window from the bytes it consumed over the last ``RATE_S``
        or more (``paced_window``), and the link's grant requests from its members'
        smallest window."""
        pos = ol.position(m.consumed)
        if pos is None:
            return
        if m.rate_at == -math.inf:
            m.rate_at, m.rate_pos = now, pos
            return
        dt = now - m.rate_at
        if dt < RATE_S:
            return
        least = self.window_bytes or 0
        m.window_bytes = paced_window((pos - m.rate_pos) / dt, least, self.window_bytes_max)
        m.window_peak = max(m.window_peak, m.window_bytes)
        m.rate_at, m.rate_pos = now, pos
        smallest = min((x.window_bytes or least for x in ol.live()), default=least)
        ol.mark_len = smallest // ACK_SHARE

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
        m.rate_at = -math.inf  # its rate starts anew
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
        frames, costs, starts = ol.frames, ol.costs, ol.starts
        freed = 0
        while ol.base < low and frames:
            frames.popleft()
            freed += costs.popleft()
            starts.popleft()
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
            # the largest byte window each unicast receiver had (it follows what it consumed)
            "window_peak": {
                str(k): max(ol.members[k].window_peak, self.window_bytes or 0)
                for k, ol in self.links.items()
                if ol.link == 0 and k in ol.members and self.window_bytes
            },
        }
