"""The receiver's side of links: in-order delivery, gaps and NACKs, grants
(overview in :mod:`typhoon.runtime.links`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from typhoon.runtime.links.protocol import (
    DEFAULT_WINDOW,
    LINGER_S,
    MASK,
    NACK_S,
    REFRESH_S,
    check_window,
    diff32,
)

T = TypeVar("T")  # what the caller keeps of a frame until it is in order


@dataclass(slots=True)
class InLink:
    """The receiver's side of one link (sequence numbers modulo 2**32)."""

    expect: int = 0  # next sequence number to deliver
    consumed: int = 0  # frames handed to the framework
    granted: int = 0  # ``consumed`` when the last grant went out
    ooo: dict[int, Any] = field(default_factory=dict)  # frames after a gap: seq -> Receiver's T
    nack_at: float = -math.inf
    nack_from: int = -1
    last_grant: float = -math.inf
    last_rx: float = -math.inf


class Receiver(Generic[T]):
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

    def accept(self, il: InLink, seq: int, item: T, now: float) -> tuple[list[T], bool]:
        """A data frame ``item`` with ``seq`` arrived; returns (items now in order, gap?).

        ``gap`` is True while frames are missing before ones we hold: the caller
        NACKs :meth:`nack_range`.  A duplicate returns ([], False).
        """
        il.last_rx = now
        if il.last_grant == -math.inf:  # a new link: its first refresh is due in refresh_s
            il.last_grant = now
        d = diff32(seq, il.expect)
        if d == 0:
            out: list[T] = [item]
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
