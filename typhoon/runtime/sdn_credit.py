"""Credit frames of the ``sdn`` I/O layer (kind CREDIT, :mod:`typhoon.runtime.links`).

GRANT, NACK and RESYNC go receiver -> sender, SYNC sender -> receiver, on the
links' own paths; load-balanced streams have their group credits
(:mod:`typhoon.runtime.lb_credits`).  This module handles the credit frames that
arrive and sends the worker's own (grants, probes, NACKs) from the periodic
housekeeping.

A mixin of :class:`typhoon.runtime.sdn.SdnTransport`, which holds the state it uses
(declared, with the sibling mixins' methods it calls, in ``sdn_parts.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from typhoon import wire
from typhoon.runtime import lb_credits as lb
from typhoon.runtime import links as lk
from typhoon.wire import Frame, Kind, WireError

if TYPE_CHECKING:
    from typhoon.runtime.sdn_parts import SdnParts

log = logging.getLogger(__name__)


if TYPE_CHECKING:
    _Host = SdnParts
else:
    _Host = object  # at run time SdnTransport is the host: nothing to inherit


class SdnCredit(_Host):
    """Credit frames in and out: grants, SYNC probes, NACKs and resyncs."""

    # sdn.py starts them, this part reads and sets them (declared here and not only on
    # SdnParts: mypy cannot type a protocol member read before the subclass sets it)
    credit_seq: int
    lb_bytes: int
    _next_timer: float
    routed: set[int] | None

    def _credit_frame(self, f: Frame, now: float) -> None:
        st = self.stats
        self.credit_frames_in += 1
        src = self._worker_id(f.src)
        if not src:
            st.drop("foreign_src")
            return
        link = self._link_of(f.dst)
        if link < 0:
            st.drop("not_for_me")
            return
        if f.flags:
            st.drop("malformed_credit")
            return
        try:
            values = [wire.decode_credit(p) for p in f.payloads]
        except WireError:
            st.drop("malformed_credit")
            return
        kind, n = f.stream, len(values)
        if kind in (lb.LB_GRANT, lb.LB_SYNC):
            want = lb.GRANT_ENTRIES if kind == lb.LB_GRANT else lb.SYNC_ENTRIES
            if n != want or link:
                st.drop("malformed_credit")
            else:
                self._lb_credit(kind, values, src)
            return
        ok = {lk.GRANT: n == 3, lk.SYNC: n in (2, 3), lk.NACK: n == 3, lk.RESYNC: n == 1}
        # a SYNC names its link; one sent to a group address must name that group
        if not ok.get(kind) or (link and (kind != lk.SYNC or values[0] != link)):
            st.drop("malformed_credit")
            return
        if kind == lk.SYNC:
            self._on_sync(src, values, now)
            return
        ol, m = self.tx.find(values[0], src)
        if ol is None or m is None:  # (no link: no member either)
            st.drop("unexpected_credit")
            return
        if kind == lk.GRANT:
            if self.tx.on_grant(ol, m, values[1], values[2], now):
                log.info("worker %d: credit from worker %d again", self.worker_id, src)
                self._send_bases(ol)
        elif kind == lk.NACK:
            self._retransmit(ol, self.tx.on_nack(ol, m, values[1], values[2], now))
        else:  # RESYNC
            if m.dead:
                log.info("worker %d: worker %d answers again", self.worker_id, src)
            rng = self.tx.on_resync(ol, m, now)
            self._send_bases(ol)
            self._retransmit(ol, rng)

    def _on_sync(self, src: int, values: list[int], now: float) -> None:
        """A SYNC: answer with a NACK for what is missing, else a grant (at once)."""
        link, nxt = values[0], values[1]
        base = values[2] if len(values) == 3 else None
        key = (src, link)
        try:
            il = self.rx.on_sync(key, nxt, base, now)
        except KeyError:
            self.rx.unsynced += 1
            self._resync(key, now)
            return
        r = self.rx.nack_range(il, now, end=nxt, force=True)
        if r is not None:
            self._credit_entries(src, lk.NACK, [link, *r])
        self._grant(key, il, now)

    def _lb_credit(self, kind: int, values: list[int], src: int) -> None:
        """LB_GRANT (we are the sender) or LB_SYNC (we are a receiver): see lb_credits."""
        stream = values[0]
        if kind == lb.LB_SYNC:
            # answered at once: the counts must be those of the moment the probe arrived
            self._lb_grant(src, stream, self.lb_rx.on_probe((src, stream), values[1], self.clock()))
            return
        group = self.lb_tx.get(stream)
        if group is None:
            self.stats.drop("unexpected_credit")
            return
        released, revived = group.on_grant(src, *values[1:])
        self.lb_bytes = max(0, self.lb_bytes - released)
        if revived:
            log.info("worker %d: balanced credit from worker %d again", self.worker_id, src)

    def _credit_entries(self, wid: int, kind: int, values: list[int], dst: bytes = b"") -> None:
        frame = wire.pack_frames(
            dst or self._worker_mac(wid), self.mac, Kind.CREDIT, kind, self.credit_seq,
            [wire.encode_credit(v & lk.MASK) for v in values], self.mtu, self.ethertype,
        )[0]  # fmt: skip
        self.credit_seq = (self.credit_seq + 1) & lk.MASK
        if self._write(frame):
            self.credit_frames_out += 1

    def _grant(self, key: tuple[int, int], il: lk.InLink, now: float) -> None:
        consumed, received = self.rx.grant(key, il, now)
        self._credit_entries(key[0], lk.GRANT, [key[1], consumed, received])

    def _send_grants(self, now: float) -> None:
        links = self.rx.links
        for key in self.rx.due(now):
            il = links.get(key)
            if il is not None:
                self._grant(key, il, now)
        for key in self.lb_rx.due(now):
            self._lb_grant(key[0], key[1], self.lb_rx.grant(key, now))

    def _lb_grant(self, sender: int, stream: int, counts: tuple[int, int, int]) -> None:
        self._credit_entries(sender, lb.LB_GRANT, [stream, *counts])

    def _lb_probe(self, stream: int, group: lb.BalancedSender, now: float) -> None:
        probe, targets = group.start_probe(now)
        for r in targets:
            self._credit_entries(r, lb.LB_SYNC, [stream, probe])

    def _probe(self, ol: lk.OutLink, now: float) -> None:
        """SYNC on the link's own path: every member answers with a NACK or a grant."""
        self.tx.probed(ol, now)
        if ol.link:
            self._credit_entries(
                0, lk.SYNC, [ol.link, ol.next], wire.multicast_mac(self.app_id, ol.link)
            )
        else:
            self._credit_entries(ol.key, lk.SYNC, [0, ol.next])

    def _send_bases(self, ol: lk.OutLink) -> None:
        """Tell members that have not heard it where their part of the link starts."""
        for d, m in list(ol.members.items()):
            if not m.base_sent and not m.dead:
                m.base_sent = True
                self._credit_entries(d, lk.SYNC, [ol.link, ol.next, m.received])

    def routed_to(self, receivers: set[int]) -> None:
        self.routed = set(receivers)

    def _give_up_routed_around(self, now: float) -> None:
        """A unicast receiver the applied ROUTING left out that answered no SYNC for
        ``reroute_silence_s`` is dead (the controller routed around it): its frames are
        written off now, not at the credit timeout, and it is probed no more.  A receiver
        taken out alive (a scale-down) answers every SYNC and keeps its frames."""
        if self.routed is None:
            return
        tx = self.tx
        for d in sorted({ol.key for ol in tx.links.values() if not ol.link} - self.routed):
            silent = tx.unanswered_for(d, now)
            if silent >= self.reroute_silence_s and tx.mark_dead(d):
                log.warning(
                    "worker %d: worker %d, routed around, answered no SYNC for %.1f s: its "
                    "frames are written off and it is probed no more",
                    self.worker_id, d, silent,
                )  # fmt: skip

    def _housekeeping(self, now: float) -> None:
        """Grants due, SYNC probes for unconfirmed frames, NACKs for gaps still open."""
        self._send_grants(now)
        self.stats.seq_gaps = self.rx.gaps
        if now < self._next_timer:
            return
        self._next_timer = now + lk.NACK_S / 2
        self._give_up_routed_around(now)
        for ol in self.tx.probes_due(now):
            self._probe(ol, now)
        for key, il in self.rx.open_gaps(now):
            r = self.rx.nack_range(il, now)
            if r is not None:
                self._credit_entries(key[0], lk.NACK, [key[1], *r])
