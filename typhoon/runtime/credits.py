"""Credit-based flow control per sender -> receiver link (DESIGN §3, Heron seed §4.3).

Userspace Open vSwitch drops what a sender pushes faster than it forwards, so a
worker may only put a frame on a link when the receiver has granted room for it.
One credit = one frame, whatever its size (the window is sized for full frames).

Loss tolerance: every count is CUMULATIVE modulo 2**32, never a delta, so any later
credit frame repairs a lost one.

* The receiver's grant to a sender is ``window + frames consumed from that sender``.
  It sends a grant (credit frame, stream :data:`GRANT`) when half a window was
  consumed since its last grant (as in Heron: the sender never runs dry while the
  receiver keeps up), and refreshes it every ``refresh_s`` while the link is in use
  (repairs a lost grant even when no traffic is left to trigger one).
* The sender's room on a link is ``grant - frames sent``; before any grant it has an
  implicit initial window.  A one-to-many frame needs room on every link of the
  group and takes one credit from each.
* Lost DATA frames would leak credit (never consumed, never granted back).  A sender
  that has waited for ``sync_s`` sends a SYNC (credit frame, stream :data:`SYNC`)
  carrying its cumulative count of frames sent; frames on a link stay in order, so
  the receiver knows that whatever it has not received by then is lost, counts it
  as consumed and answers with a grant.  The same message resynchronizes a restarted
  receiver (its counts start again at 0: the sender's are ahead) or a restarted
  sender (its count is behind the receiver's), and a sender sends one before its
  first frame on a link for that reason.  Credit frames themselves need no credit.

Everything here is pure bookkeeping; time is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

U32 = 1 << 32
MASK = U32 - 1
GRANT = 0  # stream id of a credit frame receiver -> sender: cumulative grant
SYNC = 1  # stream id of a credit frame sender -> receiver: cumulative frames sent

# 32 frames of at most 9014 bytes: 288 KB in flight per link, which the tap's
# txqueuelen (4096 frames) holds 128 times over and the switch's per-port ingress
# (a packet socket of rmem_default = 208 KB) absorbs because it drains while the
# sender writes (measured: no loss at 32 x 9000-byte frames; see tests/integration).
DEFAULT_WINDOW = 32
MAX_WINDOW = 1 << 30  # cumulative differences must stay far inside the signed 32-bit range
REFRESH_S = 0.1
LINGER_S = 1.0
SYNC_S = 0.1


def diff32(a: int, b: int) -> int:
    """``a - b`` for counters modulo 2**32, as a signed value in [-2**31, 2**31)."""
    d = (a - b) & MASK
    return d - U32 if d >= 1 << 31 else d


def check_window(window: int) -> int:
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"window must be an int in 1..{MAX_WINDOW}, got {window!r}")
    return window


# --------------------------------------------------------------------------- sender side


@dataclass(slots=True)
class _Out:
    grant: int  # latest cumulative grant from the receiver
    sent: int = 0  # cumulative frames sent on the link (mod 2**32)
    synced: bool = False  # SYNC sent before the first frame
    dead: bool = False  # a credit wait timed out; cleared by the next grant
    last_sync: float = -math.inf


class SenderCredits:
    """Credits a worker holds for the links to its receivers."""

    def __init__(self, window: int = DEFAULT_WINDOW, sync_s: float = SYNC_S) -> None:
        self.window = check_window(window)
        self.sync_s = sync_s
        self._links: dict[int, _Out] = {}

    def _link(self, dst: int) -> _Out:
        link = self._links.get(dst)
        if link is None:
            link = self._links[dst] = _Out(self.window)
        return link

    def available(self, dst: int) -> int:
        """Frames the sender may still put on the link (0..window)."""
        link = self._link(dst)
        # a grant more than a window ahead only comes from a receiver that still counts
        # an earlier incarnation of this sender: never trust more than one window
        return max(0, min(self.window, diff32(link.grant, link.sent)))

    def can_send(self, dsts: Iterable[int]) -> bool:
        """Room for one frame on every link of ``dsts``."""
        return all(self.available(d) > 0 for d in dsts)

    def lacking(self, dsts: Iterable[int]) -> list[int]:
        """The links of ``dsts`` without room for one frame."""
        return [d for d in dsts if self.available(d) <= 0]

    def consume(self, dsts: Iterable[int], n: int = 1) -> None:
        """``n`` frames went to every link of ``dsts``."""
        for d in dsts:
            link = self._link(d)
            link.sent = (link.sent + n) & MASK

    def sent(self, dst: int) -> int:
        """Cumulative frames sent to ``dst`` (the body of a SYNC)."""
        return self._link(dst).sent

    def on_grant(self, dst: int, cumulative: int) -> bool:
        """A grant arrived from ``dst``; True if it revived a link marked dead.

        The latest grant always wins: grants of one link arrive in order, and a grant
        below an earlier one means the receiver restarted (it resyncs on our SYNC).
        """
        link = self._link(dst)
        link.grant = cumulative & MASK
        revived = link.dead
        link.dead = False
        return revived

    def needs_first_sync(self, dst: int) -> bool:
        """True exactly once per link: send a SYNC before the first frame."""
        link = self._link(dst)
        if link.synced:
            return False
        link.synced = True
        return True

    def sync_due(self, dst: int, now: float) -> bool:
        """Rate limit for SYNCs on a stalled link (one per ``sync_s``); records the send."""
        link = self._link(dst)
        if now - link.last_sync < self.sync_s:
            return False
        link.last_sync = now
        return True

    def start_wait(self, dsts: Iterable[int], now: float) -> None:
        """A wait for credit begins: the first SYNC is due ``sync_s`` from now."""
        for d in dsts:
            link = self._link(d)
            link.last_sync = max(link.last_sync, now)

    def mark_dead(self, dst: int) -> bool:
        """A credit wait on ``dst`` timed out; True if it was alive until now."""
        link = self._link(dst)
        was_alive = not link.dead
        link.dead = True
        return was_alive

    def is_dead(self, dst: int) -> bool:
        link = self._links.get(dst)
        return link is not None and link.dead


# --------------------------------------------------------------------------- receiver side


@dataclass(slots=True)
class _In:
    received: int = 0  # cumulative frames read off the port from this sender
    consumed: int = 0  # cumulative frames handed to the framework (or known lost)
    granted: int = 0  # ``consumed`` when the last grant was sent
    last_grant: float = -math.inf
    last_rx: float = -math.inf


class ReceiverCredits:
    """Grants a worker owes the senders it receives from."""

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        refresh_s: float = REFRESH_S,
        linger_s: float = LINGER_S,
    ) -> None:
        self.window = check_window(window)
        self.half = max(1, window // 2)
        self.refresh_s = refresh_s
        self.linger_s = linger_s
        self._links: dict[int, _In] = {}
        self._urgent: set[int] = set()
        self._next_refresh = -math.inf

    def _link(self, src: int) -> _In:
        link = self._links.get(src)
        if link is None:
            link = self._links[src] = _In()
        return link

    def on_receive(self, src: int, now: float) -> None:
        """A frame from ``src`` was read off the port (it may wait before being consumed)."""
        link = self._link(src)
        link.received = (link.received + 1) & MASK
        link.last_rx = now

    def on_consume(self, src: int, n: int = 1) -> None:
        """``n`` frames from ``src`` were handed to the framework."""
        link = self._link(src)
        link.consumed = (link.consumed + n) & MASK
        if diff32(link.consumed, link.granted) >= self.half:
            self._urgent.add(src)

    def on_sync(self, src: int, sent: int) -> int:
        """``src`` says it has sent ``sent`` frames; returns how many were lost (or -1).

        -1 means the sender is behind what we counted: it restarted, so its count
        becomes ours (frames of the old incarnation still queued here will be
        granted when consumed: at most one window too much, once).  A grant is due
        after any SYNC.
        """
        link = self._link(src)
        d = diff32(sent, link.received)
        self._urgent.add(src)
        if d > 0:
            link.received = sent & MASK
            link.consumed = (link.consumed + d) & MASK
            return d
        if d < 0:
            link.received = sent & MASK
            link.consumed = sent & MASK
            link.granted = sent & MASK
            return -1
        return 0

    def grant(self, src: int, now: float) -> int:
        """The cumulative grant to send to ``src`` now (records that it was sent)."""
        link = self._link(src)
        link.granted = link.consumed
        link.last_grant = now
        self._urgent.discard(src)
        return (self.window + link.consumed) & MASK

    def pending(self, src: int) -> int:
        """Frames from ``src`` received but not consumed yet."""
        link = self._links.get(src)
        return 0 if link is None else max(0, diff32(link.received, link.consumed))

    def due(self, now: float) -> list[int]:
        """Senders owed a grant now: half a window consumed, a SYNC, or a refresh."""
        out = list(self._urgent)
        if now >= self._next_refresh:
            self._next_refresh = now + self.refresh_s / 2
            for src, link in self._links.items():
                if src in self._urgent or now - link.last_grant < self.refresh_s:
                    continue
                if link.consumed != link.granted or now - link.last_rx <= self.linger_s:
                    out.append(src)
        return out
