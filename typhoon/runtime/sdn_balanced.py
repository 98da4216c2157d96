"""Load-balanced sending of the ``sdn`` I/O layer (``sdn`` grouping switched to the
switch's select group by the load-balancer app).

Frames go to the load-balancer slot addresses of the receiving node in turn, flagged
:data:`typhoon.wire.LB`; the switch picks the worker.  They are paced by one
group window per stream (:mod:`typhoon.runtime.lb_credits`); a frame the switch
drops on that path is counted lost, not sent again.

A mixin of :class:`typhoon.runtime.sdn.SdnTransport`, which holds the state it uses
(declared, with the sibling mixins' methods it calls, in ``sdn_parts.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from typhoon import wire
from typhoon.runtime import lb_credits as lb
from typhoon.runtime import links as lk
from typhoon.runtime.truesize import truesize
from typhoon.wire import Kind

if TYPE_CHECKING:
    from typhoon.runtime.sdn_parts import SdnParts

log = logging.getLogger(__name__)


if TYPE_CHECKING:
    _Host = SdnParts
else:
    _Host = object  # at run time SdnTransport is the host: nothing to inherit


class SdnBalancedSending(_Host):
    """Sending on load-balanced streams and draining them."""

    def set_balanced(self, stream: int, members: list[int]) -> None:
        group = self.lb_tx.get(stream)
        if group is None:
            group = self.lb_tx[stream] = lb.BalancedSender(
                self.window, self.tx.budget, window_bytes=self.window_bytes
            )
        group.set_members(members)

    def _lb_port_full(self, cost: int) -> bool:
        budget = self.tx.budget
        total = self.tx.port_bytes + self.lb_bytes
        return budget is not None and total > 0 and total + cost > budget

    def send_balanced(self, stream: int, lb_node: int, slot: int, payloads: list[bytes]) -> None:
        """Frames to one load-balancer slot of the receiving node, within the group window.

        One batch, one slot: the switch sends all its frames (segments of one payload
        included) to the same worker.
        """
        group = self.lb_tx.get(stream)
        if group is None:
            raise RuntimeError(f"stream {stream} has no balanced group (set_balanced first)")
        seq = self.lb_seq.get(stream, 0)
        frames = wire.pack_frames(
            wire.lb_mac(self.app_id, lb_node, slot), self.mac, Kind.DATA, stream, seq, payloads,
            self.mtu, self.ethertype, wire.LB,
        )  # fmt: skip
        self.lb_seq[stream] = (seq + len(frames)) & lk.MASK
        for r in group.needs_reset():
            # zero the receiver's counts for us before our first frame (we may have restarted)
            self._credit_entries(r, lb.LB_SYNC, [stream, 0])
        for frame in frames:
            size = len(frame)
            cost = truesize(size)
            if not (group.can_send(cost, size) and not self._lb_port_full(cost)) and (
                not self._wait_balanced(stream, group, cost, size)
            ):
                self.stats.drop("credit_timeout")
                continue
            if self._write(frame):
                group.on_send(cost, size)
                self.lb_bytes += cost

    def _wait_balanced(
        self, stream: int, group: lb.BalancedSender, cost: int, size: int = 0
    ) -> bool:
        """Wait for room in the group window (and the port budget); False: drop the frame.

        Receivers grant after a few frames each; while we wait we probe them (at most
        every ``PROBE_S``) so that credit they hold back, or frames that were lost,
        come back at once.  Receivers that stay silent until the credit timeout are
        dead: what they held is written off and the group carries on without them.
        """
        st = self.stats
        now = self.clock()
        st.credit_stalls += 1
        deadline = now + self.credit_timeout_s
        while True:
            if group.probe_due(now):
                self._lb_probe(stream, group, now)
            if self._readable(min(max(0.0, deadline - now), group.probe_s)):
                self._read_batch()
                self._serve_urgent()
            now = self.clock()
            self._housekeeping(now)
            if group.can_send(cost, size) and not self._lb_port_full(cost):
                return True
            if now >= deadline:
                dead = group.mark_unanswered_dead()
                if dead:
                    log.warning(
                        "worker %d: stream %d: no answer from worker(s) %s for %.1f s: "
                        "their frames are written off", self.worker_id, stream, dead,
                        self.credit_timeout_s,
                    )  # fmt: skip
                if group.can_send(cost, size) and not self._lb_port_full(cost):
                    return True
                if group.all_dead() or not dead:
                    return False
                deadline = now + self.credit_timeout_s

    def balanced_stats(self) -> dict[str, dict[str, int]]:
        return {str(sid): g.stats() for sid, g in self.lb_tx.items()}

    def drain_balanced(self) -> None:
        """Wait (probing) until the receivers consumed every balanced frame sent so far."""
        for stream, group in self.lb_tx.items():
            now = self.clock()
            deadline = now + self.credit_timeout_s
            while group.inflight() > 0 and now < deadline:
                if group.probe_due(now):
                    self._lb_probe(stream, group, now)
                if self._readable(group.probe_s):
                    self._read_batch()
                now = self.clock()
                self._housekeeping(now)
            if group.inflight() > 0:
                dead = group.mark_unanswered_dead()
                log.warning(
                    "worker %d: stream %d: %d balanced frame(s) unconfirmed at end of stream "
                    "(silent workers %s)", self.worker_id, stream, group.inflight(), dead,
                )  # fmt: skip
