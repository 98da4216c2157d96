"""The ``sdn`` I/O layer: tuples as Ethernet frames on the worker's TAP port.

Every worker owns a TAP device (:mod:`typhoon.runtime.tap`) that its agent plugs
into the host's Open vSwitch bridge; the switch forwards frames on their
Ethernet addresses alone (docs/design.md §3).  This layer

* batches serialized tuples into frames (:func:`typhoon.wire.pack_frames`) on
  *links*: one per receiver, and one per one-to-many stream, whose frames the
  switch copies (the worker writes each frame once);
* makes every link reliable and paced (:mod:`typhoon.runtime.links`,
  ``docs/flow_control.md``): sequence numbers, receivers that deliver in order and
  NACK gaps, frames kept until consumed and sent again when lost, credit windows
  per link and a byte budget over the whole port (the worker's share of the
  switch's socket buffers).  While a sender waits for credit it keeps reading its
  port: credit frames count at once, everything else is queued for the next
  :meth:`SdnTransport.poll` *unconsumed*, so no credit goes back for it and
  back-pressure propagates upstream hop by hop.  A receiver that answers no SYNC
  for ``credit_timeout_s`` is dead, or at once when a ROUTING queued meanwhile
  routes around it (the controller found it hung): the wait ends and the
  framework applies that ROUTING;
* checks what arrives: malformed frames, control tuples not from the controller
  address, frames for another worker are counted in ``stats.drops`` and dropped
  (a worker never dies of a bad frame); segmented payloads are reassembled.

Credit frames (kind CREDIT, u32 entries, :mod:`typhoon.runtime.links` for the
kinds) travel on the links' paths: GRANT, NACK and RESYNC receiver -> sender,
SYNC sender -> receiver (to the group address on a one-to-many link), so the flow
rules of a link forward both directions.  Control tuples go to the controller
address (``reply``) without credit.

Load-balanced streams (``sdn`` grouping switched to the switch's select group by
the load-balancer app, :meth:`SdnTransport.send_balanced`): frames go to a
random load-balancer slot address of the receiving node, flagged
:data:`typhoon.wire.LB`; the switch picks the worker.  They are paced by one
group window per stream (:mod:`typhoon.runtime.lb_credits`); a frame the switch
drops on that path is counted lost, not sent again.

Spec (``WorkerSpec.transport``)::

    {"kind": "sdn",
     "tap": "ty007a0002",        # optional, default tap_name(app, worker)
     "mtu": 64000, "window": 128,  # window in frames per link
     "ethertype": 0x88B5,        # optional
     "credit_timeout_s": 10,     # a receiver silent this long is dead (frames dropped)
     "port_budget": 180224}      # bytes in flight (typhoon.topology.budgets); 0 = off

The port must be (re-)added to the bridge by the agent *after* the worker created
its TAP; when a worker is restarted under the same device name, the agent must
``del-port`` and then ``add-port`` again in two transactions: the switch marks the
old port LIVE again on its own but its userspace datapath never reads the new
device (measured on OVS 3.1).
"""

from __future__ import annotations

import logging
import math
import select
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from typhoon import wire
from typhoon.runtime import lb_credits as lb
from typhoon.runtime import links as lk
from typhoon.runtime.tap import DEFAULT_TXQUEUELEN, Tap, tap_name
from typhoon.runtime.transport import EOS_STREAM, Inbound, Transport
from typhoon.runtime.truesize import default_budget, truesize
from typhoon.wire import AddrClass, Control, ControlTuple, Frame, Kind, WireError

log = logging.getLogger(__name__)

READ_BATCH = 512  # frames read per poll() before handing out what arrived
# frames handed to the framework per poll() (None: all that are queued).  A bound keeps
# the rest unconsumed (no credit goes back for it, ``queue_bytes`` counts it); urgent
# control does not need it: read during a slice it goes ahead of everything queued
HAND_OUT_FRAMES: int | None = None
DEFAULT_CREDIT_TIMEOUT_S = 10.0
# a receiver the controller routes around that answered no request for credit for this
# long is dead at once, without waiting out the credit timeout (a live receiver, even
# a blocked one, answers every SYNC)
REROUTE_SILENCE_S = 1.0
REQUEST_S = 0.002  # at most one SYNC per link this often while the port budget blocks
LINGER_S = 2.0  # longest a finished worker waits for its receivers' confirmations
SETTLE_S = 10.0  # longest a wait for a receiver to hold every frame (end of stream) lasts


class Device(Protocol):
    """What the transport needs of its port (a :class:`Tap`; tests may fake it)."""

    def fileno(self) -> int: ...
    def read(self, size: int | None = None) -> bytes | None: ...
    def write(self, frame: bytes) -> int: ...
    def close(self) -> None: ...


class SdnTransport(Transport):
    """Worker-side I/O over a TAP port of an Open vSwitch bridge."""

    multicast = True
    switch_balancing = True

    def __init__(
        self,
        app_id: int,
        worker_id: int,
        tap: str | None = None,
        mtu: int = wire.DEFAULT_MTU,
        window: int = lk.DEFAULT_WINDOW,
        ethertype: int = wire.ETHERTYPE,
        credit_timeout_s: float = DEFAULT_CREDIT_TIMEOUT_S,
        port_budget: int | None = None,
        txqueuelen: int | None = DEFAULT_TXQUEUELEN,
        device: Device | None = None,
        clock: Callable[[], float] = time.monotonic,
        reroute_silence_s: float = REROUTE_SILENCE_S,
        control_priority: bool = True,
    ) -> None:
        super().__init__()
        if not wire.MIN_MTU <= mtu <= 65535:
            raise ValueError(f"mtu must be in {wire.MIN_MTU}..65535, got {mtu}")
        self.app_id = app_id
        self.worker_id = worker_id
        self.mac = wire.worker_mac(app_id, worker_id)
        self.controller = wire.controller_mac(app_id)
        self._mcast_prefix = wire.multicast_mac(app_id, 0)[:4]
        self.mtu = mtu
        self.ethertype = ethertype
        self.credit_timeout_s = float(credit_timeout_s)
        self.reroute_silence_s = min(float(reroute_silence_s), self.credit_timeout_s)
        self.clock = clock
        budget = default_budget() if port_budget is None else port_budget or None
        self.tx = lk.Sender(window, budget)
        self.rx = lk.Receiver(window)
        self.window = window
        # load-balanced streams: group windows as a sender, grants owed as a receiver
        self.lb_tx: dict[int, lb.BalancedSender] = {}
        self.lb_rx = lb.BalancedReceiver(
            lb.grant_threshold(window), budget / 8 if budget else math.inf
        )
        self.lb_seq: dict[int, int] = {}
        self.lb_bytes = 0  # balanced bytes in flight (they count against the budget too)
        self.name = tap or tap_name(app_id, worker_id)
        self.dev: Device = (
            device
            if device is not None
            else Tap(self.name, mtu=mtu, txqueuelen=txqueuelen, mac=self.mac)
        )
        self.fd = self.dev.fileno()
        self._poller = select.poll()  # not select.select: no FD_SETSIZE limit
        self._poller.register(self.fd, select.POLLIN)
        self._read_size = wire.ETH_HLEN + mtu + 64  # larger frames arrive truncated: malformed
        self.reassembler = wire.Reassembler()
        self.ctrl_seq = 0
        self.credit_seq = 0
        self.credit_frames_in = 0  # credit frames (grants, SYNCs, NACKs), also in stats.frames_*
        self.credit_frames_out = 0
        # frames read off the port but not handed out yet:
        # (frame, sender id or 0, bytes, its InLink or None, link key)
        self.pending: deque[tuple[Frame, int, int, Any, Any]] = deque()
        self.pending_bytes = 0
        self.ctrl_pending = 0  # control frames among them
        self.queued_at_take = 0  # pending bytes left when the framework last took input
        # urgent control tuples (wire.URGENT_CONTROL) read off the port: they go to the
        # framework ahead of everything in ``pending`` (off: every control frame in order)
        self.control_priority = control_priority
        self.urgent: deque[ControlTuple] = deque()
        # the framework's handler for urgent control while a send waits for credit
        self.on_urgent: Callable[[ControlTuple], None] | None = None
        self._src_ids: dict[bytes, int] = {}
        self._dst_macs: dict[int, bytes] = {}
        self._resync_at: dict[tuple[int, int], float] = {}
        # next hops of every stream that a ROUTING still in ``pending`` sets: a credit wait
        # gives up on a silent receiver the controller routes around (see _routed_around)
        self.routing_ahead: dict[int, frozenset[int]] = {}
        self.streams_of: dict[int, set[int]] = {}  # receiver -> streams we sent it
        self._next_timer = -math.inf

    @classmethod
    def from_spec(cls, spec: Any) -> SdnTransport:
        """Build from a :class:`~typhoon.runtime.spec.WorkerSpec` (``transport.kind == "sdn"``)."""
        p = spec.transport
        return cls(
            spec.physical.app_id,
            spec.worker_id,
            tap=p.get("tap") or None,
            mtu=int(p.get("mtu", wire.DEFAULT_MTU)),
            window=int(p.get("window", lk.DEFAULT_WINDOW)),
            ethertype=int(p.get("ethertype", wire.ETHERTYPE)),
            credit_timeout_s=float(p.get("credit_timeout_s", DEFAULT_CREDIT_TIMEOUT_S)),
            port_budget=int(p["port_budget"]) if p.get("port_budget") is not None else None,
            control_priority=bool(p.get("control_priority", True)),
        )

    @property
    def budget(self) -> int | None:
        return self.tx.budget

    def set_budget(self, budget: int) -> None:
        """A new byte budget (FLOW_CONTROL from the controller: the fabric's shares changed)."""
        self.tx.budget = budget or None
        self.lb_rx.bytes = budget / 8 if budget else math.inf
        for group in self.lb_tx.values():
            group.budget = budget or None

    # ----- addresses -----------------------------------------------------------------------

    def _worker_mac(self, wid: int) -> bytes:
        mac = self._dst_macs.get(wid)
        if mac is None:
            mac = self._dst_macs[wid] = wire.worker_mac(self.app_id, wid)
        return mac

    def _worker_id(self, mac: bytes) -> int:
        """Worker id of a source address of this application, or 0."""
        wid = self._src_ids.get(mac)
        if wid is None:
            try:
                a = wire.parse_mac(mac)
            except WireError:
                return 0
            if a.cls != AddrClass.WORKER or a.app_id != self.app_id:
                return 0
            wid = self._src_ids[bytes(mac)] = a.value
        return wid

    def _link_of(self, dst: bytes) -> int:
        """Link id of a frame for us: 0 (our address), the stream of a one-to-many
        address of this application, or -1 (not for us)."""
        if dst == self.mac:
            return 0
        if dst[:4] == self._mcast_prefix:
            return dst[4] << 8 | dst[5]
        return -1

    # ----- receiving -----------------------------------------------------------------------

    def poll(self, timeout: float) -> list[Inbound | ControlTuple]:
        # wake up in time to refresh grants and probe even when the framework is idle
        if self.pending or self.urgent or self._readable(min(timeout, 0.01)):
            self._read_batch()
        out = self._hand_out(HAND_OUT_FRAMES)
        self._housekeeping(self.clock())
        return out

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
        if m is None:
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
            elif links.get(key) is il:  # a link restarted meanwhile: not its frame
                il.consumed = (il.consumed + 1) & lk.MASK
                if f.flags & ack_req:
                    rx.urgent.add(key)
            if payloads:
                out.append(Inbound(src, f.stream, payloads))
        self.queued_at_take = self.pending_bytes
        # the ROUTINGs handed out go to the framework now; those still queued stay ahead
        self.routing_ahead.clear()
        if self.ctrl_pending:
            for item in pending:
                if not item[1]:
                    self._peek_routing(item[0])
        return out

    # ----- credit frames -------------------------------------------------------------------

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

    def _housekeeping(self, now: float) -> None:
        """Grants due, SYNC probes for unconfirmed frames, NACKs for gaps still open."""
        self._send_grants(now)
        self.stats.seq_gaps = self.rx.gaps
        if now < self._next_timer:
            return
        self._next_timer = now + lk.NACK_S / 2
        for ol in self.tx.probes_due(now):
            self._probe(ol, now)
        for key, il in self.rx.open_gaps(now):
            r = self.rx.nack_range(il, now)
            if r is not None:
                self._credit_entries(key[0], lk.NACK, [key[1], *r])

    # ----- sending -------------------------------------------------------------------------

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
            cost = truesize(len(frame))
            if not tx.can_send(ol, cost) and not self._wait_credit(ol, cost):
                self._lose(ol, len(frames) - i)
                return
            self._send_bases(ol)  # a member joined or revived while we waited
            marked = tx.wants_ack(ol, cost) or (ack_last and i == len(frames) - 1)
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

    def _wait_credit(self, ol: lk.OutLink, cost: int) -> bool:
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
        tx.start_wait(ol, tx.lacking(ol), now)
        while True:
            lacking = tx.lacking(ol)
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
            if self._readable(wait):
                self._read_batch()
                self._serve_urgent()
            now = self.clock()
            # SYNCs from upstream are answered even now: a grant only ever covers
            # what was consumed, so this releases no back-pressure
            self._housekeeping(now)
            if tx.can_send(ol, cost):
                return True
            blocking = set(tx.lacking(ol)) | (set(tx.holders()) if tx.port_full(cost) else set())
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
                if tx.can_send(ol, cost):
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
            if self._readable(tx.probe_s):
                self._read_batch()
            self._housekeeping(self.clock())
            waiting = {d for d in waiting if tx.owed_by(d) and not self._gone(d, self.clock())}
        left = sorted(d for d in dsts if tx.owed_by(d))
        if left:
            log.warning("worker %d: frames unconfirmed by %s", self.worker_id, left)
        return left

    # ----- load-balanced sending -----------------------------------------------------------

    def set_balanced(self, stream: int, members: list[int]) -> None:
        group = self.lb_tx.get(stream)
        if group is None:
            group = self.lb_tx[stream] = lb.BalancedSender(self.window, self.tx.budget)
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
            cost = truesize(len(frame))
            if not (group.can_send(cost) and not self._lb_port_full(cost)) and (
                not self._wait_balanced(stream, group, cost)
            ):
                self.stats.drop("credit_timeout")
                continue
            if self._write(frame):
                group.on_send(cost)
                self.lb_bytes += cost

    def _wait_balanced(self, stream: int, group: lb.BalancedSender, cost: int) -> bool:
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
            if group.can_send(cost) and not self._lb_port_full(cost):
                return True
            if now >= deadline:
                dead = group.mark_unanswered_dead()
                if dead:
                    log.warning(
                        "worker %d: stream %d: no answer from worker(s) %s for %.1f s: "
                        "their frames are written off", self.worker_id, stream, dead,
                        self.credit_timeout_s,
                    )  # fmt: skip
                if group.can_send(cost) and not self._lb_port_full(cost):
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

    # ----- control -------------------------------------------------------------------------

    def reply(self, ct: ControlTuple) -> None:
        frames = wire.pack_frames(
            self.controller, self.mac, Kind.CONTROL, 0, self.ctrl_seq, [wire.encode_control(ct)],
            self.mtu, self.ethertype,
        )  # fmt: skip
        self.ctrl_seq = (self.ctrl_seq + len(frames)) & lk.MASK
        for frame in frames:
            self._write(frame)

    # ----- housekeeping --------------------------------------------------------------------

    def queue_bytes(self) -> int:
        """Bytes read off the port but not handed out when the framework last took input
        (queued while blocked sending).

        Not what was read ahead since, while the framework works through what it
        took and serves urgent control between slices: a METRIC_RESP answered in
        the middle of a slice would count data that the next poll takes at once,
        and the load balancer's weights (``controller/load_balancer.py``, its queue
        term) moved with every answer.  Frames still in the TAP device's queue are
        not counted: the tun driver does not answer FIONREAD (EINVAL).
        """
        return self.queued_at_take

    def link_stats(self) -> dict[str, Any]:
        """What the links did: frames sent, sent again, written off; gaps found and
        still open; duplicates; frames unconfirmed.  For the run report."""
        tx, rx = self.tx, self.rx
        open_gaps = sum(
            lk.diff32(min(il.ooo, key=lambda s: lk.diff32(s, il.expect)), il.expect)
            for il in rx.links.values()
            if il.ooo
        )
        unconfirmed = {
            str(d): sum(ol.members[d].end(ol.next) - ol.members[d].received for ol in tx.owed_by(d))
            for d in tx.holders() + [d for ol in tx.links.values() for d in ol.members]
            if tx.owed_by(d)
        }
        return {
            **tx.stats(),
            "lost_to": {str(d): n for d, n in tx.lost().items()},
            "unconfirmed": unconfirmed,
            "gaps": rx.gaps,
            "open_gaps": open_gaps,
            "duplicates": rx.duplicates,
            "unsynced": rx.unsynced,
            "lb_lost": sum(g.lost for g in self.lb_tx.values()),
        }

    def linger(self, timeout: float = LINGER_S) -> None:
        """Before the port goes away, wait until every receiver holds our frames.

        Closing the TAP destroys the device, and frames the switch has not read
        from it yet die with it; a receiver may also still need some sent again.
        """
        everyone = {d for ol in self.tx.links.values() for d in ol.members}
        self.settle(everyone, timeout)

    def close(self) -> None:
        # senders may linger for our confirmation of what we consumed: send it now
        now = self.clock()
        for key, il in list(self.rx.links.items()):
            if il.consumed != il.granted:
                self._grant(key, il, now)
        self.dev.close()
