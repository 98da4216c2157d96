"""Receiving side of the ``sdn`` I/O layer: frames read off the TAP port, checked,
and handed to the framework in order, urgent control first.

What arrives is decoded and checked (malformed frames, control not from the
controller address, frames for another worker are counted and dropped), data
goes through its link's receiver (:mod:`typhoon.runtime.links`) and waits in
``pending`` unconsumed until handed out.

A mixin of :class:`typhoon.runtime.sdn.SdnTransport`, which holds the state it uses
(declared, with the sibling mixins' methods it calls, in ``sdn_parts.py``).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from typhoon import wire
from typhoon.runtime import links as lk
from typhoon.runtime.transport import Inbound
from typhoon.runtime.truesize import truesize
from typhoon.wire import Control, ControlTuple, Frame, Kind, WireError

if TYPE_CHECKING:
    from typhoon.runtime.sdn_parts import SdnParts

log = logging.getLogger(__name__)

READ_BATCH = 512  # frames read per poll() before handing out what arrived
# frames handed to the framework per poll() (None: all that are queued).  A bound keeps
# the rest unconsumed (no credit goes back for it, ``queue_bytes`` counts it); urgent
# control does not need it: read during a slice it goes ahead of everything queued
HAND_OUT_FRAMES: int | None = None


if TYPE_CHECKING:
    _Host = SdnParts
else:
    _Host = object  # at run time SdnTransport is the host: nothing to inherit


class SdnReceiving(_Host):
    """Reading, checking and handing out the frames of a worker's port."""

    def poll(self, timeout: float) -> list[Inbound | ControlTuple]:
        # wake up in time to refresh grants and probe even when the framework is idle
        if self.pending or self.urgent or self._readable(min(timeout, 0.01)):
            self._read_batch()
        out = self._hand_out(HAND_OUT_FRAMES)
        self._housekeeping(self.clock())
        return out

    def waitable(self) -> int | None:
        return None if self.pending or self.urgent else self.fd

    def urgent_controls(self) -> list[ControlTuple]:
        """Read the port without waiting and return the urgent control tuples that arrived
        (the framework calls this between slices of its work on queued data).

        Data read meanwhile joins ``pending`` unconsumed: how far we read ahead is
        bounded by the senders' credit windows."""
        self._read_batch()
        self._housekeeping(self.clock())
        if not self.urgent:
            return []
        out = list(self.urgent)
        self.urgent.clear()
        return out

    def _serve_urgent(self) -> None:
        """Hand urgent control to the framework while a send waits for credit."""
        handler = self.on_urgent
        if handler is None:
            return
        while self.urgent:
            handler(self.urgent.popleft())

    def _readable(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a frame on the port."""
        return bool(self._poller.poll(max(0, math.ceil(timeout * 1000))))

    def _read_batch(self, limit: int = READ_BATCH) -> int:
        """Read up to ``limit`` frames without blocking; returns how many."""
        read, size, ingest = self.dev.read, self._read_size, self._ingest
        now = self.clock()
        n = 0
        while n < limit:
            try:
                raw = read(size)
            except OSError as e:  # e.g. EIO once the device is gone
                self.stats.drop("read_error")
                log.warning("worker %d: read from %s failed: %s", self.worker_id, self.name, e)
                break
            if raw is None:
                break
            n += 1
            ingest(raw, now)
        return n

    def _ingest(self, raw: bytes, now: float) -> None:
        """Decode and check one frame; credits take effect, the rest waits in ``pending``."""
        st = self.stats
        st.frames_in += 1
        st.bytes_in += len(raw)
        try:
            f = wire.decode_frame(raw, self.ethertype, self.mtu)
        except WireError:
            st.drop("malformed_frame")
            return
        kind = f.kind
        if kind == Kind.DATA:
            src = self._worker_id(f.src)
            if not src:
                st.drop("foreign_src")
                return
            link = self._link_of(f.dst)
            if link < 0:
                st.drop("not_for_me")
            elif f.flags & wire.LB:
                self.lb_rx.on_receive((src, f.stream), now)
                self.pending.append((f, src, len(raw), None, None))
                self.pending_bytes += len(raw)
            else:
                self._data(f, src, link, len(raw), now)
        elif kind == Kind.CREDIT:
            self._credit_frame(f, now)
        elif f.src != self.controller:
            st.drop("spoofed_control")
        elif f.dst != self.mac:
            st.drop("not_for_me")
        elif not self._urgent(f):
            self.pending.append((f, 0, len(raw), None, None))
            self.pending_bytes += len(raw)
            self.ctrl_pending += 1
            self._peek_routing(f)

    def _urgent(self, f: Frame) -> bool:
        """Queue a control frame whose tuples are all urgent (``wire.URGENT_CONTROL``) in
        ``urgent``, ahead of the data read before it; False: it keeps its place.

        A segmented frame keeps its place (reassembly goes in order; urgent tuples are
        small), so does a malformed one (counted when handed out)."""
        if not self.control_priority or f.flags & wire.SEG:
            return False
        try:
            cts = [wire.decode_control(p) for p in f.payloads]
        except WireError:
            return False
        if not cts or any(ct.type not in wire.URGENT_CONTROL for ct in cts):
            return False
        self.urgent.extend(cts)
        return True

    def _data(self, f: Frame, src: int, link: int, size: int, now: float) -> None:
        """A data frame of a link: in order it goes to ``pending``, after a gap it waits."""
        key = (src, link)
        rx = self.rx
        il = rx.get(key)
        if il is None:
            # the first frame of a link to us starts it; a one-to-many link starts only
            # with the base its sender tells each member (the switch copies its frames
            # to workers the sender does not count as members yet)
            if link or f.seq != 0:
                rx.unsynced += 1
                self._resync(key, now)
                return
            il = rx.start(key, 0)
        ready, gap = rx.accept(il, f.seq, (f, src, size, il, key), now)
        if ready:
            pending = self.pending
            for item in ready:
                pending.append(item)
                self.pending_bytes += item[2]
        if gap:
            r = rx.nack_range(il, now)
            if r is not None:
                self._credit_entries(src, lk.NACK, [link, *r])
        elif not ready:  # a duplicate: the sender is repeating what we have; tell it
            rx.urgent.add(key)

    def _resync(self, key: tuple[int, int], now: float) -> None:
        if now - self._resync_at.get(key, -math.inf) >= lk.NACK_S:
            self._resync_at[key] = now
            self._credit_entries(key[0], lk.RESYNC, [key[1]])

    def _peek_routing(self, f: Frame) -> None:
        """Note the next hops a queued ROUTING sets; the framework still applies it.

        Only a sender blocked on credit looks at them.  A malformed tuple is left
        for :meth:`_hand_out` to count; a segmented one is not peeked at.
        """
        if f.flags & wire.SEG:
            return
        for p in f.payloads:
            try:
                ct = wire.decode_control(p)
            except WireError:
                continue
            if ct.type != Control.ROUTING:
                continue
            stream, hops = ct.body.get("stream"), ct.body.get("next_hops")
            if isinstance(stream, int) and isinstance(hops, list):
                self.routing_ahead[stream] = frozenset(h for h in hops if isinstance(h, int))

    def _hand_out(self, limit: int | None = None) -> list[Inbound | ControlTuple]:
        """Turn pending frames into what poll() returns, urgent control first, then up to
        ``limit`` frames in arrival order; data frames count as consumed."""
        out: list[Inbound | ControlTuple] = list(self.urgent)
        self.urgent.clear()
        pending = self.pending
        st = self.stats
        rx = self.rx
        links = rx.links
        ack_req = wire.ACK_REQ
        n = len(pending) if limit is None else min(limit, len(pending))
        for _ in range(n):
            f, src, size, il, key = pending.popleft()
            self.pending_bytes -= size
            payloads = f.payloads
            if f.flags & wire.SEG:
                try:
                    payloads = self.reassembler.feed(f)
                except WireError:
                    st.drop("bad_segment")
                    payloads = []
            if not src:  # control tuple from the controller
                self.ctrl_pending -= 1
                for p in payloads:
                    try:
                        out.append(wire.decode_control(p))
                    except WireError:
                        st.drop("malformed_control")
                continue
            if il is None:  # load-balanced: the sender's group window gets the credit
                self.lb_rx.on_consume((src, f.stream), truesize(size))
            elif key is not None and links.get(key) is il:  # restarted meanwhile: not its frame
                il.consumed = (il.consumed + 1) & lk.MASK
                if f.flags & ack_req:
                    rx.urgent.add(key)
            if payloads:
                out.append(Inbound(src, f.stream, payloads))
        # the ROUTINGs handed out go to the framework now; those still queued stay ahead
        self.routing_ahead.clear()
        if self.ctrl_pending:
            for item in pending:
                if not item[1]:
                    self._peek_routing(item[0])
        return out
