"""Sending side of the ``sdn`` I/O layer: frames on reliable, paced links.

Batches of entries become frames (:func:`typhoon.wire.pack_frames`) on a link
per receiver or per one-to-many stream; frames are kept until the receiver
consumed them and sent again when lost; a send waits for the link's credit and
the port's byte budget (``docs/flow_control.md``), serving urgent control
meanwhile; a receiver that stays silent is dead.

A mixin of :class:`typhoon.runtime.sdn.SdnTransport`, which holds the state it uses
(declared, with the sibling mixins' methods it calls, in ``sdn_parts.py``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from typhoon import wire
from typhoon.runtime import links as lk
from typhoon.runtime.transport import EOS_STREAM
from typhoon.runtime.truesize import truesize
from typhoon.wire import Kind

if TYPE_CHECKING:
    from typhoon.runtime.sdn_parts import SdnParts

log = logging.getLogger(__name__)

REQUEST_S = 0.002  # at most one SYNC per link this often while the port budget blocks
SETTLE_S = 10.0  # longest a wait for a receiver to hold every frame (end of stream) lasts


if TYPE_CHECKING:
    _Host = SdnParts
else:
    _Host = object  # at run time SdnTransport is the host: nothing to inherit


class SdnSending(_Host):
    """Writing frames, retransmission, credit waits and settling of a worker's links."""

    def _write(self, frame: bytes) -> bool:
        try:
            self.dev.write(frame)
        except BlockingIOError:
            # the tap driver does not push back; wait briefly in case another device does
            time.sleep(0.001)
            try:
                self.dev.write(frame)
            except OSError:
                self.stats.drop("write_error")
                return False
        except OSError as e:
            self.stats.drop("write_error")
            log.warning("worker %d: write to %s failed: %s", self.worker_id, self.name, e)
            return False
        self.stats.frames_out += 1
        self.stats.bytes_out += len(frame)
        return True

    def _retransmit(self, ol: lk.OutLink, seqs: range) -> None:
        """Write frames of ``ol`` again (they are still counted in flight)."""
        if not seqs:
            return
        last = seqs[-1]
        for seq in seqs:
            frame = ol.frame(seq)
            if seq == last:  # the sender wants to hear at once that they arrived
                frame = wire.with_flags(frame, wire.ACK_REQ)
            self._write(frame)
        self.stats.retransmitted += len(seqs)

    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        ol = self.tx.unicast(dst)
        self.streams_of.setdefault(dst, set()).add(stream)
        frames = wire.pack_frames(
            self._worker_mac(dst), self.mac, Kind.DATA, stream, ol.next, payloads, self.mtu,
            self.ethertype,
        )  # fmt: skip
        # punctuation (end of stream, anchors, marks) asks for a grant at once: a receiver
        # that finishes on it confirms it before it exits, not in its last write (a TAP
        # destroyed right after loses what the switch has not read from it yet)
        self._transmit(ol, frames, ack_last=stream == EOS_STREAM)

    def send_group(
        self, group: int, dsts: list[int], payloads: list[bytes], stream: int | None = None
    ) -> None:
        if not dsts:
            return
        stream = group if stream is None else stream
        ol = self.tx.multicast(group)
        self.tx.set_members(ol, dsts)
        for d in dsts:
            self.streams_of.setdefault(d, set()).add(group)
        frames = wire.pack_frames(
            wire.multicast_mac(self.app_id, group), self.mac, Kind.DATA, stream, ol.next,
            payloads, self.mtu, self.ethertype,
        )  # fmt: skip
        self._transmit(ol, frames)

    def _transmit(self, ol: lk.OutLink, frames: list[bytes], ack_last: bool = False) -> None:
        """Write ``frames`` (numbered from ``ol.next``) within the link's credit.

        Frames that no live member would get are not written: they and the rest of
        the batch are counted lost (``credit_timeout``) and keep no sequence number.
        """
        tx = self.tx
        if ol.members and not any(True for _ in ol.live()) and not self._revive(ol):
            self._lose(ol, len(frames))
            return
        self._send_bases(ol)
        for i, frame in enumerate(frames):
            size = len(frame)
            cost = truesize(size)
            if not tx.can_send(ol, cost, size) and not self._wait_credit(ol, cost, size):
                self._lose(ol, len(frames) - i)
                return
            self._send_bases(ol)  # a member joined or revived while we waited
            marked = tx.wants_ack(ol, cost, size) or (ack_last and i == len(frames) - 1)
            if marked:
                frame = wire.with_flags(frame, wire.ACK_REQ)
            # a frame the port refused is kept all the same: a NACK brings it again
            self._write(frame)
            tx.on_send(ol, frame, cost, self.clock(), marked)

    def _lose(self, ol: lk.OutLink, n: int) -> None:
        """``n`` frames of ``ol`` not sent: every member is dead."""
        for m in ol.members.values():
            m.lost += n
        self.stats.drop("credit_timeout", n)

    def _wait_credit(self, ol: lk.OutLink, cost: int, size: int = 0) -> bool:
        """Wait until every live member of ``ol`` has room; False: no live member left.

        A member that answers no SYNC for ``credit_timeout_s`` is *dead* until a grant
        arrives from it: the frames it lacks are written off (counted lost for it)
        and the link carries on without it.  When only the port's byte budget
        blocks, the receivers holding its bytes are probed at once.

        A member is dead before the timeout when a ROUTING read meanwhile routes
        around it and it has answered no request for ``reroute_silence_s`` (the
        controller found it hung): the wait ends at once, so the framework gets to
        apply that ROUTING.  A receiver that still answers SYNCs is alive (a
        reconfiguration taking out a busy worker): it is waited for, nothing is lost.
        """
        tx, st = self.tx, self.stats
        now = self.clock()
        st.credit_stalls += 1
        tx.start_wait(ol, tx.lacking(ol, size), now)
        while True:
            lacking = tx.lacking(ol, size)
            if not lacking and tx.port_full(cost):
                # only the budget blocks: probe the links that hold our bytes
                for o in tx.links.values():
                    if (
                        o.frames
                        and now - max((m.last_probe for m in o.live()), default=-math.inf)
                        >= REQUEST_S
                    ):
                        self._probe(o, now)
                wait = REQUEST_S
            else:
                if now - max((m.last_probe for m in ol.live()), default=-math.inf) >= (tx.probe_s):
                    self._probe(ol, now)
                wait = tx.probe_s
            if self.on_wait is not None:  # live-unchained receivers in our process read on
                self.on_wait()
            if self._readable(wait):
                self._read_batch()
                self._serve_urgent()
            now = self.clock()
            # SYNCs from upstream are answered even now: a grant only ever covers
            # what was consumed, so this releases no back-pressure
            self._housekeeping(now)
            if tx.can_send(ol, cost, size):
                return True
            blocking = set(tx.lacking(ol, size))
            if tx.port_full(cost):
                blocking |= set(tx.holders())
            gone = [d for d in sorted(blocking) if self._gone(d, now)]
            for d in gone:
                if tx.mark_dead(d):
                    log.warning(
                        "worker %d: worker %d answered no SYNC for %.1f s: its frames are "
                        "written off",
                        self.worker_id, d, tx.unanswered_for(d, now) or self.credit_timeout_s,
                    )  # fmt: skip
            if gone:
                if not any(True for _ in ol.live()):
                    return False
                if tx.can_send(ol, cost, size):
                    return True

    def _gone(self, d: int, now: float) -> bool:
        """Is receiver ``d`` dead: silent past the credit timeout, or silent and routed
        around by a queued ROUTING?"""
        silent = self.tx.unanswered_for(d, now)
        if silent >= self.credit_timeout_s:
            return True
        if silent < self.reroute_silence_s or not self.routing_ahead:
            return False
        ahead = self.routing_ahead
        return any(s in ahead and d not in ahead[s] for s in self.streams_of.get(d, ()))

    def _revive(self, ol: lk.OutLink) -> bool:
        """Every member of ``ol`` is dead: probe them (at most every ``probe_s``), read
        without waiting; True if a grant brought one back."""
        now = self.clock()
        for d, m in ol.members.items():
            if m.dead and now - m.last_probe >= self.tx.probe_s:
                m.last_probe = now
                self._credit_entries(d, lk.SYNC, [ol.link, ol.next])
        self._read_batch()  # picks up a grant that answers an earlier probe
        return any(True for _ in ol.live())

    def settle(self, dsts: Iterable[int], timeout: float = SETTLE_S) -> list[int]:
        """Wait until every receiver of ``dsts`` holds every frame we sent it, on every
        link (end of stream must come after them); returns those that never confirmed.

        A frame sent on a one-to-many link and an end of stream sent to one receiver
        take different rules through the switch, which may reorder them.

        Urgent control (METRIC_REQ) is served meanwhile, as in a credit wait: a
        worker settling its end of stream with a dead receiver waits up to
        ``timeout``, and one that stopped answering would be declared dead by the
        fault detector's heartbeat and replaced (a second source, replaying).
        """
        tx = self.tx
        waiting = {d for d in dsts if tx.owed_by(d)}
        deadline = self.clock() + timeout
        while waiting:
            now = self.clock()
            if now >= deadline:
                break
            for d in sorted(waiting):
                for ol in tx.owed_by(d):
                    if now - max((m.last_probe for m in ol.live()), default=-math.inf) >= (
                        tx.probe_s
                    ):
                        self._probe(ol, now)
            if self.on_wait is not None:
                self.on_wait()
            if self._readable(tx.probe_s):
                self._read_batch()
                self._serve_urgent()
            self._housekeeping(self.clock())
            waiting = {d for d in waiting if tx.owed_by(d) and not self._gone(d, self.clock())}
        left = sorted(d for d in dsts if tx.owed_by(d))
        if left:
            log.warning("worker %d: frames unconfirmed by %s", self.worker_id, left)
        return left
