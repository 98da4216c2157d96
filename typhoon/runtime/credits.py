"""Credit-based flow control per sender -> receiver link (DESIGN §3, Heron seed §4.3).

Userspace Open vSwitch drops what a sender pushes faster than it forwards, so a
worker may only put a frame on a link when the receiver has granted room for it.
One credit = one frame.

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
  carrying its cumulative count of frames sent; frames of one flow stay in order
  through the switch, so the receiver knows that whatever it has not received by
  then is lost, counts it as consumed and answers with a grant at once.  The same
  message resynchronizes a restarted receiver (its counts start again at 0: the
  sender's are ahead) or a restarted sender (its count is behind the receiver's),
  and a sender sends one before its first frame on a link for that reason.  Credit
  frames themselves need no credit.

Bytes.  What a frame costs the switch is kernel memory, not a frame count: the
bridge reads each port through a packet socket whose receive buffer
(``net.core.rmem_default``, 208 KB by default) is charged the *truesize* of every
queued frame -- measured on kernel 6.x: 768 bytes for a 100-byte frame, 12.5 KB
for a 9014-byte jumbo frame.  When the switch thread is not scheduled, a sender's
frames pile up in that buffer and the kernel drops what does not fit.  So besides
the per-link frame window the sender keeps what it has in flight (sent, not yet
granted back) within ``budget`` bytes of estimated truesize, per link and over all
links of its port together (its frames all enter the switch through that one
socket).  The window is thus the smaller of 32 frames and 208 KB (16 jumbo frames;
32 small frames take only 26 KB), and the receiver grants when half of either was
consumed.  When only the port total blocks a sender, it asks the receivers holding
its bytes for their grants at once with a SYNC.

Everything here is pure bookkeeping; time is passed in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

U32 = 1 << 32
MASK = U32 - 1
GRANT = 0  # stream id of a credit frame receiver -> sender: cumulative grant
SYNC = 1  # stream id of a credit frame sender -> receiver: cumulative frames sent

DEFAULT_WINDOW = 32
MAX_WINDOW = 1 << 30  # cumulative differences must stay far inside the signed 32-bit range
DEFAULT_BUDGET = 212992  # Linux net.core.rmem_default
REFRESH_S = 0.1
LINGER_S = 1.0
SYNC_S = 0.1
REQUEST_S = 0.002  # at most one credit request (SYNC) per link this often


def diff32(a: int, b: int) -> int:
    """``a - b`` for counters modulo 2**32, as a signed value in [-2**31, 2**31)."""
    d = (a - b) & MASK
    return d - U32 if d >= 1 << 31 else d


def check_window(window: int) -> int:
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"window must be an int in 1..{MAX_WINDOW}, got {window!r}")
    return window


def truesize(frame_len: int) -> int:
    """Kernel memory one frame written to a TAP occupies in a socket queue (an upper bound).

    Measured on Linux 6.x (tun, no vnet header): a short frame is one linear buffer
    (data + ~700 bytes of overhead), a long one a 4 KB head plus pages.  Exact for
    100- and 9014-byte frames; frames of 1.5-3.6 KB are overestimated.
    """
    if frame_len <= 1500:
        return 704 + ((frame_len + 63) & ~63)
    return 4352 + 4096 * ((frame_len - 1500 + 4095) // 4096)


def default_budget() -> int:
    """The receive buffer the switch's packet sockets get: ``net.core.rmem_default``."""
    try:
        return int(Path("/proc/sys/net/core/rmem_default").read_text())
    except (OSError, ValueError):
        return DEFAULT_BUDGET


def byte_threshold(budget: int | None, max_frame: int) -> int | None:
    """Bytes (truesize) consumed from a sender after which the receiver grants.

    Half the budget, as half the frame window, but never more than a sender blocked
    by its budget can have in flight (``budget - truesize(max_frame)``), else the
    receiver would wait for bytes that cannot come.  None: frames only.
    """
    if budget is None:
        return None
    return max(1, min(budget // 2, budget - truesize(max_frame)))


# --------------------------------------------------------------------------- sender side


@dataclass(slots=True)
class _Out:
    grant: int  # latest cumulative grant from the receiver
    sent: int = 0  # cumulative frames sent on the link (mod 2**32)
    # frames in flight, oldest first: [cost, links still holding it], shared by a group
    inflight: deque = field(default_factory=deque)
    bytes: int = 0  # sum of the costs in ``inflight``
    synced: bool = False  # SYNC sent before the first frame
    dead: bool = False  # a credit wait timed out; cleared by the next grant
    last_sync: float = -math.inf
    asked: float | None = None  # oldest request for a grant (wait, SYNC) no grant answered


class SenderCredits:
    """Credits a worker holds for the links to its receivers.

    ``budget``: bytes of estimated truesize (:func:`truesize`) allowed in flight per
    link and over all links together; None counts frames only.
    """

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        budget: int | None = None,
        sync_s: float = SYNC_S,
        request_s: float = REQUEST_S,
    ) -> None:
        self.window = check_window(window)
        self.budget = budget
        self.sync_s = sync_s
        self.request_s = request_s
        self.port_bytes = 0
        self._links: dict[int, _Out] = {}

    def _link(self, dst: int) -> _Out:
        link = self._links.get(dst)
        if link is None:
            link = self._links[dst] = _Out(self.window)
        return link

    def available(self, dst: int) -> int:
        """Frames the sender may still put on the link by credit alone (0..window)."""
        link = self._link(dst)
        # a grant more than a window ahead only comes from a receiver that still counts
        # an earlier incarnation of this sender: never trust more than one window
        return max(0, min(self.window, diff32(link.grant, link.sent)))

    def _link_ok(self, link: _Out, cost: int) -> bool:
        if diff32(link.grant, link.sent) <= 0 or len(link.inflight) >= self.window:
            return False
        budget = self.budget
        return budget is None or not link.inflight or link.bytes + cost <= budget

    def port_full(self, cost: int = 0) -> bool:
        """The bytes in flight over all links leave no room for a frame of ``cost``."""
        budget = self.budget
        return budget is not None and self.port_bytes > 0 and self.port_bytes + cost > budget

    def can_send(self, dsts: Iterable[int], cost: int = 0) -> bool:
        """Room for one frame of ``cost`` bytes on every link of ``dsts``."""
        if self.port_full(cost):
            return False
        link = self._link
        ok = self._link_ok
        return all(ok(link(d), cost) for d in dsts)

    def lacking(self, dsts: Iterable[int], cost: int = 0) -> list[int]:
        """The links of ``dsts`` without room (credit or bytes) for one frame."""
        return [d for d in dsts if not self._link_ok(self._link(d), cost)]

    def hold(self, cost: int) -> None:
        """Bytes in flight that no link holds (load-balanced frames) enter the port total."""
        self.port_bytes += cost

    def release(self, cost: int) -> None:
        self.port_bytes = max(0, self.port_bytes - cost)

    def holders(self) -> list[int]:
        """Live links with frames in flight (whose grants would free port bytes)."""
        return [d for d, link in self._links.items() if link.inflight and not link.dead]

    def consume(self, dsts: Iterable[int], cost: int = 0) -> None:
        """One frame of ``cost`` bytes went to every link of ``dsts``.

        Links marked dead count the frame (their SYNC must say so) but hold no bytes.
        """
        entry = [cost, 0]
        for d in dsts:
            link = self._link(d)
            link.sent = (link.sent + 1) & MASK
            if not link.dead:
                link.inflight.append(entry)
                link.bytes += cost
                entry[1] += 1
        if entry[1]:
            self.port_bytes += cost

    def _release(self, link: _Out, keep: int) -> None:
        inflight = link.inflight
        while len(inflight) > keep:
            entry = inflight.popleft()
            link.bytes -= entry[0]
            entry[1] -= 1
            if not entry[1]:
                self.port_bytes -= entry[0]

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
        # frames still in flight: sent - (grant - window)
        self._release(link, max(0, self.window - diff32(link.grant, link.sent)))
        revived = link.dead
        link.dead = False
        link.asked = None
        return revived

    def needs_first_sync(self, dst: int) -> bool:
        """True exactly once per link: send a SYNC before the first frame."""
        link = self._link(dst)
        if link.synced:
            return False
        link.synced = True
        return True

    def sync_due(self, dst: int, now: float, interval: float | None = None) -> bool:
        """Rate limit for SYNCs on a link (one per ``interval``, default ``sync_s``);
        records the send when it returns True."""
        link = self._link(dst)
        if now - link.last_sync < (self.sync_s if interval is None else interval):
            return False
        link.last_sync = now
        if link.asked is None:  # a SYNC asks for a grant: the receiver answers at once
            link.asked = now
        return True

    def start_wait(self, dsts: Iterable[int], now: float) -> None:
        """A wait for credit begins: the first SYNC is due ``sync_s`` from now."""
        for d in dsts:
            link = self._link(d)
            link.last_sync = max(link.last_sync, now)
            if link.asked is None:
                link.asked = now

    def unanswered_for(self, dst: int, now: float) -> float:
        """Seconds since we first asked ``dst`` for a grant (a wait, a SYNC) without one.

        0 when every request was answered: a receiver that is alive, even one too
        busy to consume, answers each SYNC with a grant, so only a hung or dead one
        stays silent.
        """
        link = self._links.get(dst)
        if link is None or link.asked is None:
            return 0.0
        return max(0.0, now - link.asked)

    def mark_dead(self, dst: int) -> bool:
        """A credit wait on ``dst`` timed out; True if it was alive until now.

        Its frames in flight stop counting against the port.
        """
        link = self._link(dst)
        was_alive = not link.dead
        link.dead = True
        self._release(link, 0)
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
    cost: int = 0  # bytes (truesize) consumed since the last grant
    last_grant: float = -math.inf
    last_rx: float = -math.inf


class ReceiverCredits:
    """Grants a worker owes the senders it receives from.

    A grant is due when half the window -- in frames, or in bytes when the senders
    keep a byte budget (``half_bytes``, see :func:`byte_threshold`) -- was consumed.
    """

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        half_bytes: int | None = None,
        refresh_s: float = REFRESH_S,
        linger_s: float = LINGER_S,
    ) -> None:
        self.window = check_window(window)
        self.half = max(1, window // 2)
        self.half_bytes = half_bytes if half_bytes is not None else math.inf
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
        if link.last_grant == -math.inf:  # a new link: the first refresh is due in refresh_s
            link.last_grant = now

    def on_consume(self, src: int, n: int = 1, cost: int = 0) -> None:
        """``n`` frames from ``src`` (``cost`` bytes of truesize) reached the framework."""
        link = self._link(src)
        link.consumed = (link.consumed + n) & MASK
        link.cost += cost
        if diff32(link.consumed, link.granted) >= self.half or link.cost >= self.half_bytes:
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
        link.cost = 0
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
