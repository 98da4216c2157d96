"""Credit-based flow control for frames the switch load-balances (``sdn`` grouping).

Per-link credits (:mod:`typhoon.runtime.links`) charge each frame to the link of
its receiver.  A frame sent to a node's load-balancer address has no known
receiver: the switch's select group picks one and rewrites the destination.  So:

* **The sender keeps one window per balanced stream (the *group window*)**, the
  same size as a link's (``window`` frames and ``window_bytes`` bytes of frames,
  and the byte budget), and counts every frame it sends to the group against it.
  The frames also count against the port's byte budget like any other.
* **Receivers return credit for the load-balanced frames they got.**  Such frames
  carry the header flag :data:`typhoon.wire.LB` (the switch rewrote the address, the
  flag survives) and their source address is the sender, so a receiver counts them
  per (sender, stream), apart from the link's own frames, and sends that sender an
  ``LB_GRANT`` credit frame with its cumulative *consumed* and *received* counts.
  The sender sums over the group:

      in flight = sent - lost - sum(consumed of live receivers) - sum(received of dead ones)

  and sends only while that is below the window.  Bytes in flight are the lengths
of the newest ``in flight`` frames it sent (settled oldest first, an estimate: the
receivers report frame counts); a frame larger than the byte window goes once
nothing is in flight.

Why this is lossless: whatever the switch does, at most ``window`` frames of the
stream are in flight, so no receiver can ever hold more than ``window``
unconsumed frames from this sender -- exactly the bound one per-link window gives
(the TAP queue sizing in :mod:`typhoon.runtime.tap` rests on it) -- and the port's
byte budget still caps what waits in the switch's socket.  A skewed split only
slows the sender down; it never overruns a receiver.

Receivers grant after a small share of the window (``window // 8`` frames or a
quarter of the byte threshold), not half of it: each one sees only its share of
the group's frames, and credit it keeps back is credit the whole group lacks.

Counts are cumulative modulo 2**32, as everywhere in flow control, so any later
credit frame repairs a lost one; the sender unwraps them per receiver.  What no
grant can repair is a frame that never arrives (the switch dropped it, or its
receiver died).  For that the sender *probes*: an ``LB_SYNC`` credit frame with a
probe id to every receiver it ever sent to, sent while it waits for credit.  A
receiver answers at once with the counts it has at that moment.  Frames from one
sender reach one receiver in order through the switch, so once every live
receiver has answered probe *k*, every frame sent before the probe that is in no
receiver's *received* count is lost: ``deficit = sent_at_probe - sum(received)``.
Measured on OVS 3.1, a probe (a plain unicast frame) now and then overtakes a
balanced frame sent just before it (those take a second pass through the
datapath, for the select group's hash), so one round's deficit may count a
frame still on its way: ``lost`` is the smaller deficit of the last two rounds.
A receiver that does not answer within the credit timeout is *dead*: the frames
it received but never consumed are written off (they died with it, as with any
dead worker) and it is left out of later rounds until it answers again.  A
receiver whose counts go backwards restarted: the same write-off.  Before its
first frame to a receiver the sender sends a reset probe (id 0) that zeroes the
receiver's counts for it, so a restarted *sender* starts from zero as well.

Pure bookkeeping; time is passed in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from typhoon.runtime.links import MASK, check_window_bytes, diff32, window_fits

LB_GRANT = 2  # credit frame kind: receiver -> sender, [stream, consumed, received, probe]
LB_SYNC = 3  # credit frame kind: sender -> receiver, [stream, probe]; probe 0 = reset
GRANT_ENTRIES = 4
SYNC_ENTRIES = 2
PROBE_S = 0.005  # a sender waiting for group credit probes at most this often
GRANT_SHARE = 8  # a receiver grants after window // GRANT_SHARE frames


# --------------------------------------------------------------------------- sender side


@dataclass(slots=True)
class _Member:
    consumed: int = 0  # unwrapped cumulative counts the receiver reported
    received: int = 0
    raw_consumed: int = 0  # the same, as last reported (mod 2**32)
    raw_received: int = 0
    reset_sent: bool = False
    dead: bool = False
    answered: int = 0  # last probe id it answered
    at_probe: int = 0  # its received count in that answer


class BalancedSender:
    """The group window of one balanced stream of one sender (module docstring).

    ``window_bytes``: bytes of frames allowed in flight to the group (None or 0: frames
    only); ``budget``: bytes of estimated truesize allowed in flight to the group
    (None: frames only); the caller also charges them to its port.
    """

    def __init__(
        self,
        window: int,
        budget: int | None = None,
        probe_s: float = PROBE_S,
        window_bytes: int | None = None,
    ) -> None:
        self.window = window
        self.window_bytes = check_window_bytes(window_bytes)
        self.budget = budget
        self.probe_s = probe_s
        self.members: list[int] = []
        self.known: dict[int, _Member] = {}
        self.sent = 0
        self.lost = 0
        self.costs: deque[int] = deque()  # byte cost of frames not settled yet, oldest first
        self.bytes = 0
        self.sizes: deque[int] = deque()  # frame lengths of the same frames
        self.wire_bytes = 0  # their sum
        self.settled = 0  # frames whose bytes were released
        self.probe_id = 0
        self.probe_sent = 0  # ``sent`` when the open probe went out
        self.deficit = 0  # sent - received, as of the last closed round
        self.waiting: set[int] = set()  # live receivers that have not answered it
        self.last_probe = -math.inf

    def set_members(self, members: Iterable[int]) -> None:
        """The node's workers now (ROUTING); receivers that left stay known until settled."""
        self.members = list(members)
        for r in self.members:
            self.known.setdefault(r, _Member())

    def needs_reset(self) -> list[int]:
        """Members not told to zero their counts for us yet (each is returned once)."""
        out = []
        for r in self.members:
            m = self.known[r]
            if not m.reset_sent:
                m.reset_sent = True
                out.append(r)
        return out

    def inflight(self) -> int:
        """Frames sent to the group and not yet consumed, lost or written off."""
        done = self.lost
        for m in self.known.values():
            done += m.received if m.dead else m.consumed
        return max(0, self.sent - done)

    def can_send(self, cost: int = 0, size: int = 0) -> bool:
        """Room in the group window for one frame of ``size`` bytes (``cost`` of truesize)."""
        if self.inflight() >= self.window:
            return False
        if not window_fits(self.wire_bytes, size, self.window_bytes):
            return False
        budget = self.budget
        return budget is None or not self.costs or self.bytes + cost <= budget

    def on_send(self, cost: int = 0, size: int = 0) -> None:
        self.sent += 1
        self.costs.append(cost)
        self.bytes += cost
        self.sizes.append(size)
        self.wire_bytes += size

    def on_grant(self, r: int, consumed: int, received: int, probe: int) -> tuple[int, bool]:
        """Counts from receiver ``r``; returns (bytes released, True if ``r`` was dead).

        Ignored (0, False) from a worker we never sent to: nothing of ours to count.
        """
        m = self.known.get(r)
        if m is None:
            return 0, False
        dc = diff32(consumed, m.raw_consumed)
        dr = diff32(received, m.raw_received)
        if dc < 0 or dr < 0:
            # the receiver restarted: what it held unconsumed died with the old process
            m.consumed = m.received
            dc, dr = consumed, received
        m.consumed += dc
        m.received += dr
        m.raw_consumed, m.raw_received = consumed & MASK, received & MASK
        revived = m.dead
        m.dead = False
        if probe and probe == self.probe_id and r in self.waiting:
            m.answered, m.at_probe = probe, m.received
            self.waiting.discard(r)
            if not self.waiting:
                self._close_round()
        return self._settle(), revived

    def _close_round(self, confirmed: bool = False) -> None:
        """Every live receiver answered the open probe: what none received is lost
        (if the round before missed it too, or ``confirmed``: module docstring)."""
        total = 0
        for m in self.known.values():
            total += m.at_probe if m.answered == self.probe_id and not m.dead else m.received
        deficit = max(0, self.probe_sent - total)
        self.lost = deficit if confirmed else min(deficit, self.deficit)
        self.deficit = deficit

    def _settle(self) -> int:
        """Release the bytes of frames no longer in flight (oldest first, an estimate)."""
        target = self.sent - self.inflight()
        released = 0
        while self.settled < target and self.costs:
            c = self.costs.popleft()
            self.bytes -= c
            released += c
            self.wire_bytes -= self.sizes.popleft()
            self.settled += 1
        return released

    def probe_due(self, now: float) -> bool:
        return now - self.last_probe >= self.probe_s

    def start_probe(self, now: float) -> tuple[int, list[int]]:
        """A new probe round: (probe id, receivers to send it to).

        Every known receiver gets it, dead ones too (an answer revives them); only
        live ones are waited for.
        """
        self.probe_id = (self.probe_id % MASK) + 1  # never 0: 0 is the reset probe
        self.probe_sent = self.sent
        self.last_probe = now
        targets = sorted(self.known)
        self.waiting = {r for r in targets if not self.known[r].dead}
        if not self.waiting:
            self._close_round()
        return self.probe_id, targets

    def mark_unanswered_dead(self) -> list[int]:
        """The credit wait timed out: receivers silent on the open probe are dead."""
        dead = sorted(self.waiting)
        for r in dead:
            self.known[r].dead = True
        self.waiting.clear()
        if dead:
            # what went to them and is in nobody's count died with them: no second round
            self._close_round(confirmed=True)
            self._settle()
        return dead

    def all_dead(self) -> bool:
        return bool(self.members) and all(self.known[r].dead for r in self.members)

    def stats(self) -> dict[str, int]:
        return {"sent": self.sent, "inflight": self.inflight(), "lost": self.lost}


# --------------------------------------------------------------------------- receiver side


@dataclass(slots=True)
class _In:
    received: int = 0  # cumulative load-balanced frames read off the port
    consumed: int = 0  # cumulative ones handed to the framework
    granted: int = 0  # ``consumed`` when the last grant went out
    cost: int = 0  # bytes consumed since the last grant
    last_grant: float = -math.inf
    last_rx: float = -math.inf


@dataclass
class BalancedReceiver:
    """Credit a worker owes the senders whose load-balanced frames it got.

    Keys are (sender, stream).  A grant is due after ``frames`` frames or
    ``bytes`` bytes consumed since the last one, and is refreshed every
    ``refresh_s`` while the sender is active (repairs a lost grant).
    """

    frames: int
    bytes: float = math.inf
    refresh_s: float = 0.1
    linger_s: float = 1.0
    links: dict[tuple[int, int], _In] = field(default_factory=dict)
    urgent: set[tuple[int, int]] = field(default_factory=set)
    next_refresh: float = -math.inf

    def _link(self, key: tuple[int, int]) -> _In:
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = _In()
        return link

    def on_receive(self, key: tuple[int, int], now: float) -> None:
        link = self._link(key)
        link.received = (link.received + 1) & MASK
        link.last_rx = now
        if link.last_grant == -math.inf:
            link.last_grant = now

    def on_consume(self, key: tuple[int, int], cost: int = 0) -> None:
        link = self._link(key)
        link.consumed = (link.consumed + 1) & MASK
        link.cost += cost
        if diff32(link.consumed, link.granted) >= self.frames or link.cost >= self.bytes:
            self.urgent.add(key)

    def on_probe(self, key: tuple[int, int], probe: int, now: float) -> tuple[int, int, int]:
        """A probe from the sender: the answer to send at once (a reset zeroes first)."""
        if probe == 0:
            self.links[key] = _In(last_rx=now, last_grant=now)
        return self.grant(key, now, probe)

    def grant(self, key: tuple[int, int], now: float, probe: int = 0) -> tuple[int, int, int]:
        """(consumed, received, probe) to send to the sender now; records the grant."""
        link = self._link(key)
        link.granted = link.consumed
        link.cost = 0
        link.last_grant = now
        self.urgent.discard(key)
        return link.consumed, link.received, probe

    def due(self, now: float) -> list[tuple[int, int]]:
        """Keys owed a grant now: enough consumed, or a refresh while the sender is active."""
        out = list(self.urgent)
        if now >= self.next_refresh:
            self.next_refresh = now + self.refresh_s / 2
            for key, link in self.links.items():
                if key in self.urgent or now - link.last_grant < self.refresh_s:
                    continue
                if link.consumed != link.granted or now - link.last_rx <= self.linger_s:
                    out.append(key)
        return out


def grant_threshold(window: int) -> int:
    """Frames a receiver consumes from a balanced sender before it grants."""
    return max(1, window // GRANT_SHARE)
