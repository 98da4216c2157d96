"""The ``sdn`` I/O layer: tuples as Ethernet frames on the worker's TAP port.

Every worker owns a TAP device (:mod:`typhoon.runtime.tap`) that its agent plugs
into the host's Open vSwitch bridge; the switch forwards frames on their
Ethernet addresses alone (DESIGN §3).  This layer

* batches serialized tuples into frames (:func:`typhoon.wire.pack_frames`), one
  sequence counter per (receiver, stream), or per stream for the one-to-many
  address: the switch copies a multicast frame, the worker writes it once;
* paces every link with credits (:mod:`typhoon.runtime.credits`): a frame goes out
  only when its receiver(s) granted room for it.  While a sender waits it keeps
  reading its port: credit frames count at once, everything else is queued for the
  next :meth:`SdnTransport.poll` *unconsumed*, so no credit goes back for it and
  back-pressure propagates upstream hop by hop.  A receiver that answers no SYNC
  is dead after ``credit_timeout_s``, or at once when a ROUTING queued meanwhile
  routes around it (the controller found it hung): the wait ends and the
  framework applies that ROUTING;
* checks what arrives: malformed frames, control tuples not from the controller
  address, frames for another worker are counted in ``stats.drops`` and dropped
  (a worker never dies of a bad frame); sequence gaps per link are counted in
  ``stats.seq_gaps``; segmented payloads are reassembled.

Credit frames (kind CREDIT, one u32 entry) travel on the same path as data:
stream 0 (GRANT) receiver -> sender, stream 1 (SYNC) sender -> receiver, so the
flow rules of a link must forward both directions.  Control tuples go to the
controller address (``reply``) without credit.

Load-balanced streams (``sdn`` grouping switched to the switch's select group by
the load-balancer app, :meth:`SdnTransport.send_balanced`): frames go to a
random load-balancer slot address of the receiving node, flagged
:data:`typhoon.wire.LB`; the switch picks the worker.  They are paced by one
group window per stream instead of a link's (:mod:`typhoon.runtime.lb_credits`:
receivers return their credit with LB_GRANT frames, stream 2, and answer the
sender's LB_SYNC probes, stream 3, both several u32 entries).

Spec (``WorkerSpec.transport``)::

    {"kind": "sdn",
     "tap": "ty007a0002",        # optional, default tap_name(app, worker)
     "mtu": 9000, "window": 32,  # window in frames per link
     "ethertype": 0x88B5,        # optional
     "credit_timeout_s": 10,     # then the receiver counts as dead (frames dropped)
     "port_budget": 212992}      # optional, bytes in flight; default rmem_default, 0 = off

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
from collections.abc import Callable
from typing import Any, Protocol

from typhoon import wire
from typhoon.runtime import credits as cr
from typhoon.runtime import lb_credits as lb
from typhoon.runtime.tap import DEFAULT_TXQUEUELEN, Tap, tap_name
from typhoon.runtime.transport import Inbound, Transport
from typhoon.wire import AddrClass, Control, ControlTuple, Frame, Kind, WireError

log = logging.getLogger(__name__)

READ_BATCH = 512  # frames read per poll() before handing out what arrived
DEFAULT_CREDIT_TIMEOUT_S = 10.0
# a receiver the controller routes around that answered no request for credit for this
# long is dead at once, without waiting out the credit timeout (ten SYNC intervals: a
# live receiver, even a blocked one, answers every SYNC)
REROUTE_SILENCE_S = 1.0


LINGER_S = 2.0  # longest a finished worker waits for its receivers' confirmations
LINGER_SYNC_S = 0.05
LINGER_QUIET_S = 0.5  # wait this long for grants before asking for them


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
        window: int = cr.DEFAULT_WINDOW,
        ethertype: int = wire.ETHERTYPE,
        credit_timeout_s: float = DEFAULT_CREDIT_TIMEOUT_S,
        port_budget: int | None = None,
        txqueuelen: int | None = DEFAULT_TXQUEUELEN,
        device: Device | None = None,
        clock: Callable[[], float] = time.monotonic,
        reroute_silence_s: float = REROUTE_SILENCE_S,
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
        # bytes in flight a sender keeps within (see credits.py); 0 = count frames only
        budget = cr.default_budget() if port_budget is None else port_budget or None
        self.tx = cr.SenderCredits(window, budget)
        threshold = cr.byte_threshold(budget, wire.ETH_HLEN + mtu)
        self.rx = cr.ReceiverCredits(window, threshold)
        self.window, self.budget = window, budget
        # load-balanced streams: group windows as a sender, grants owed as a receiver
        self.lb_tx: dict[int, lb.BalancedSender] = {}
        self.lb_rx = lb.BalancedReceiver(
            lb.grant_threshold(window), threshold / 4 if threshold else math.inf
        )
        self.lb_seq: dict[int, int] = {}
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
        self.seq_out: dict[tuple[int, int], int] = {}  # (dst, stream), dst 0 = multicast
        self.seq_in: dict[tuple[bytes, bytes, int], int] = {}  # (src MAC, dst MAC, stream)
        self.reassembler = wire.Reassembler()
        self.ctrl_seq = 0
        self.credit_seq = 0
        self.lost_frames = 0  # data frames a SYNC proved lost in the network
        self.credit_frames_in = 0  # credit frames (grants and SYNCs), also in stats.frames_*
        self.credit_frames_out = 0
        # frames read off the port but not handed out yet: (frame, sender id or 0, bytes)
        self.pending: deque[tuple[Frame, int, int]] = deque()
        self.pending_bytes = 0
        self._src_ids: dict[bytes, int] = {}
        self._dst_macs: dict[int, bytes] = {}
        # next hops of every stream that a ROUTING still in ``pending`` sets: a credit wait
        # gives up on a silent receiver the controller routes around (see _routed_around)
        self.routing_ahead: dict[int, frozenset[int]] = {}
        self.group_dsts: dict[int, tuple[int, ...]] = {}  # one-to-many stream -> receivers

    @classmethod
    def from_spec(cls, spec: Any) -> SdnTransport:
        """Build from a :class:`~typhoon.runtime.spec.WorkerSpec` (``transport.kind == "sdn"``)."""
        p = spec.transport
        return cls(
            spec.physical.app_id,
            spec.worker_id,
            tap=p.get("tap") or None,
            mtu=int(p.get("mtu", wire.DEFAULT_MTU)),
            window=int(p.get("window", cr.DEFAULT_WINDOW)),
            ethertype=int(p.get("ethertype", wire.ETHERTYPE)),
            credit_timeout_s=float(p.get("credit_timeout_s", DEFAULT_CREDIT_TIMEOUT_S)),
            port_budget=int(p["port_budget"]) if p.get("port_budget") is not None else None,
        )

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

    def _for_me(self, dst: bytes) -> bool:
        # our own address, or the one-to-many address of any stream of this application
        return dst == self.mac or dst[:4] == self._mcast_prefix

    # ----- receiving -----------------------------------------------------------------------

    def poll(self, timeout: float) -> list[Inbound | ControlTuple]:
        # wake up in time to refresh grants even when the framework has nothing to do
        if self.pending or self._readable(min(timeout, 0.05)):
            self._read_batch()
        out = self._hand_out()
        self._send_grants(self.clock())
        return out

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
            elif not self._for_me(f.dst):
                st.drop("not_for_me")
            else:
                if f.flags & wire.LB:
                    self.lb_rx.on_receive((src, f.stream), now)
                else:
                    self.rx.on_receive(src, now)
                self.pending.append((f, src, len(raw)))
                self.pending_bytes += len(raw)
        elif kind == Kind.CREDIT:
            self._credit_frame(f)
        elif f.src != self.controller:
            st.drop("spoofed_control")
        elif f.dst != self.mac:
            st.drop("not_for_me")
        else:
            self.pending.append((f, 0, len(raw)))
            self.pending_bytes += len(raw)
            self._peek_routing(f)

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

    def _credit_frame(self, f: Frame) -> None:
        st = self.stats
        self.credit_frames_in += 1
        src = self._worker_id(f.src)
        if not src:
            st.drop("foreign_src")
            return
        if f.dst != self.mac:
            st.drop("not_for_me")
            return
        if f.stream in (lb.LB_GRANT, lb.LB_SYNC):
            self._lb_credit_frame(f, src)
            return
        if f.flags or len(f.payloads) != 1:
            st.drop("malformed_credit")
            return
        try:
            value = wire.decode_credit(f.payloads[0])
        except WireError:
            st.drop("malformed_credit")
            return
        if f.stream == cr.GRANT:
            if self.tx.on_grant(src, value):
                log.info("worker %d: credit from worker %d again", self.worker_id, src)
        elif f.stream == cr.SYNC:
            lost = self.rx.on_sync(src, value)
            if lost > 0:
                self.lost_frames += lost
            elif lost < 0:
                log.info("worker %d: worker %d restarted its link count", self.worker_id, src)
        else:
            st.drop("malformed_credit")

    def _lb_credit_frame(self, f: Frame, src: int) -> None:
        """LB_GRANT (we are the sender) or LB_SYNC (we are a receiver): see lb_credits."""
        want = lb.GRANT_ENTRIES if f.stream == lb.LB_GRANT else lb.SYNC_ENTRIES
        try:
            if f.flags or len(f.payloads) != want:
                raise WireError("bad entry count")
            values = [wire.decode_credit(p) for p in f.payloads]
        except WireError:
            self.stats.drop("malformed_credit")
            return
        stream = values[0]
        if f.stream == lb.LB_SYNC:
            # answered at once: the counts must be those of the moment the probe arrived
            self._lb_grant(src, stream, self.lb_rx.on_probe((src, stream), values[1], self.clock()))
            return
        group = self.lb_tx.get(stream)
        if group is None:
            self.stats.drop("unexpected_credit")
            return
        released, revived = group.on_grant(src, *values[1:])
        self.tx.release(released)
        if revived:
            log.info("worker %d: balanced credit from worker %d again", self.worker_id, src)

    def _hand_out(self) -> list[Inbound | ControlTuple]:
        """Turn pending frames into what poll() returns; data frames count as consumed."""
        out: list[Inbound | ControlTuple] = []
        pending = self.pending
        st = self.stats
        seq_in = self.seq_in
        consume = self.rx.on_consume
        truesize = cr.truesize
        self.routing_ahead.clear()  # every queued ROUTING goes to the framework now
        while pending:
            f, src, size = pending.popleft()
            self.pending_bytes -= size
            payloads = f.payloads
            if f.flags & wire.SEG:
                try:
                    payloads = self.reassembler.feed(f)
                except WireError:
                    st.drop("bad_segment")
                    payloads = []
            if not src:  # control tuple from the controller
                for p in payloads:
                    try:
                        out.append(wire.decode_control(p))
                    except WireError:
                        st.drop("malformed_control")
                continue
            if f.flags & wire.LB:
                # a group-wide sequence number: this receiver sees only its share
                self.lb_rx.on_consume((src, f.stream), truesize(size))
                if payloads:
                    out.append(Inbound(src, f.stream, payloads))
                continue
            consume(src, 1, truesize(size))
            key = (f.src, f.dst, f.stream)
            expect = seq_in.get(key)
            if expect is not None and f.seq != expect:
                gap = (f.seq - expect) & cr.MASK
                if gap < 1 << 31:  # a frame from the past (duplicate) is not a gap
                    st.seq_gaps += gap
            seq_in[key] = (f.seq + 1) & cr.MASK
            if payloads:
                out.append(Inbound(src, f.stream, payloads))
        return out

    # ----- credit frames -------------------------------------------------------------------

    def _credit(self, wid: int, stream: int, value: int) -> None:
        frame = wire.pack_frames(
            self._worker_mac(wid),
            self.mac,
            Kind.CREDIT,
            stream,
            self.credit_seq,
            [wire.encode_credit(value)],
            self.mtu,
            self.ethertype,
        )[0]
        self.credit_seq = (self.credit_seq + 1) & cr.MASK
        if self._write(frame):
            self.credit_frames_out += 1

    def _send_grants(self, now: float) -> None:
        for src in self.rx.due(now):
            self._credit(src, cr.GRANT, self.rx.grant(src, now))
        for key in self.lb_rx.due(now):
            self._lb_grant(key[0], key[1], self.lb_rx.grant(key, now))

    def _credit_entries(self, wid: int, stream: int, values: list[int]) -> None:
        frame = wire.pack_frames(
            self._worker_mac(wid), self.mac, Kind.CREDIT, stream, self.credit_seq,
            [wire.encode_credit(v & cr.MASK) for v in values], self.mtu, self.ethertype,
        )[0]  # fmt: skip
        self.credit_seq = (self.credit_seq + 1) & cr.MASK
        if self._write(frame):
            self.credit_frames_out += 1

    def _lb_grant(self, sender: int, stream: int, counts: tuple[int, int, int]) -> None:
        self._credit_entries(sender, lb.LB_GRANT, [stream, *counts])

    def _lb_probe(self, stream: int, group: lb.BalancedSender, now: float) -> None:
        probe, targets = group.start_probe(now)
        for r in targets:
            self._credit_entries(r, lb.LB_SYNC, [stream, probe])

    def _sync(self, dst: int) -> None:
        self._credit(dst, cr.SYNC, self.tx.sent(dst))

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

    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        key = (dst, stream)
        seq = self.seq_out.get(key, 0)
        frames = wire.pack_frames(
            self._worker_mac(dst), self.mac, Kind.DATA, stream, seq, payloads, self.mtu,
            self.ethertype,
        )  # fmt: skip
        self.seq_out[key] = (seq + len(frames)) & cr.MASK
        self._transmit(frames, (dst,))

    def send_group(
        self, group: int, dsts: list[int], payloads: list[bytes], stream: int | None = None
    ) -> None:
        if not dsts:
            return
        stream = group if stream is None else stream
        key = (0, stream)
        seq = self.seq_out.get(key, 0)
        frames = wire.pack_frames(
            wire.multicast_mac(self.app_id, group), self.mac, Kind.DATA, stream, seq, payloads,
            self.mtu, self.ethertype,
        )  # fmt: skip
        self.seq_out[key] = (seq + len(frames)) & cr.MASK
        dsts = tuple(dsts)
        self.group_dsts[group] = dsts
        self._transmit(frames, dsts)

    # ----- load-balanced sending -----------------------------------------------------------

    def set_balanced(self, stream: int, members: list[int]) -> None:
        group = self.lb_tx.get(stream)
        if group is None:
            group = self.lb_tx[stream] = lb.BalancedSender(self.window, self.budget)
        group.set_members(members)

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
        self.lb_seq[stream] = (seq + len(frames)) & cr.MASK
        for r in group.needs_reset():
            # zero the receiver's counts for us before our first frame (we may have restarted)
            self._credit_entries(r, lb.LB_SYNC, [stream, 0])
        tx, truesize = self.tx, cr.truesize
        for frame in frames:
            cost = truesize(len(frame))
            if not (group.can_send(cost) and not tx.port_full(cost)) and not self._wait_balanced(
                stream, group, cost
            ):
                self.stats.drop("credit_timeout")
                continue
            if self._write(frame):
                group.on_send(cost)
                tx.hold(cost)

    def _wait_balanced(self, stream: int, group: lb.BalancedSender, cost: int) -> bool:
        """Wait for room in the group window (and the port budget); False: drop the frame.

        Receivers grant after a few frames each; while we wait we probe them (at most
        every ``PROBE_S``) so that credit they hold back, or frames that were lost,
        come back at once.  Receivers that stay silent until the credit timeout are
        dead: what they held is written off and the group carries on without them.
        """
        tx, st = self.tx, self.stats
        now = self.clock()
        st.credit_stalls += 1
        deadline = now + self.credit_timeout_s
        while True:
            if group.probe_due(now):
                self._lb_probe(stream, group, now)
            if tx.port_full(cost):
                for d in tx.holders():
                    if tx.sync_due(d, now, tx.request_s):
                        self._sync(d)
            if self._readable(min(max(0.0, deadline - now), group.probe_s)):
                self._read_batch()
            now = self.clock()
            self._send_grants(now)
            if group.can_send(cost) and not tx.port_full(cost):
                return True
            if now >= deadline:
                dead = group.mark_unanswered_dead()
                if dead:
                    log.warning(
                        "worker %d: stream %d: no answer from worker(s) %s for %.1f s: "
                        "their frames are written off", self.worker_id, stream, dead,
                        self.credit_timeout_s,
                    )  # fmt: skip
                if group.can_send(cost) and not tx.port_full(cost):
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
                self._send_grants(now)
            if group.inflight() > 0:
                dead = group.mark_unanswered_dead()
                log.warning(
                    "worker %d: stream %d: %d balanced frame(s) unconfirmed at end of stream "
                    "(silent workers %s)", self.worker_id, stream, group.inflight(), dead,
                )  # fmt: skip

    def _transmit(self, frames: list[bytes], dsts: tuple[int, ...]) -> None:
        tx = self.tx
        for d in dsts:
            if tx.needs_first_sync(d):
                # tells a receiver that counted an earlier incarnation of us to start over
                self._sync(d)
        truesize = cr.truesize
        for frame in frames:
            cost = truesize(len(frame))
            if not tx.can_send(dsts, cost) and not self._wait_credit(dsts, cost):
                self.stats.drop("credit_timeout")
                continue
            if self._write(frame):
                tx.consume(dsts, cost)

    def _wait_credit(self, dsts: tuple[int, ...], cost: int) -> bool:
        """Wait until every live receiver of ``dsts`` has room; False: drop the frame.

        A receiver that let a wait time out is *dead* until a grant arrives from it:
        frames to it are dropped without waiting (a one-to-many frame still goes to
        the live receivers).  Each wait and each frame missed by a dead receiver is
        counted.  When only the port's byte budget blocks, the receivers holding its
        bytes are asked for their grants (a SYNC) instead of waiting for their
        half-window or refresh grants.

        A receiver is dead before the timeout when a ROUTING read meanwhile routes
        around it and it has answered no request for credit for ``reroute_silence_s``
        (the controller found it hung): the wait ends at once, so the framework gets
        to apply that ROUTING.  A receiver that still answers SYNCs is alive (a
        reconfiguration taking out a busy worker): it is waited for, nothing is lost.
        """
        tx, st = self.tx, self.stats
        now = self.clock()
        lacking = tx.lacking(dsts, cost)
        dead = [d for d in lacking if tx.is_dead(d)]
        if dead:
            for d in dead:
                if tx.sync_due(d, now):
                    self._sync(d)  # a probe: if it is alive after all, its grant revives it
            self._read_batch()  # without waiting: picks up the grant that answers a probe
            if tx.can_send(dsts, cost):
                return True
            lacking = tx.lacking(dsts, cost)
            dead = [d for d in lacking if tx.is_dead(d)]
        if dead:
            if len(dead) == len(dsts):
                return False
            st.drop("credit_timeout", len(dead))
            live = tuple(d for d in dsts if d not in dead)
            if tx.can_send(live, cost):
                return True
        else:
            live = dsts
        st.credit_stalls += 1
        tx.start_wait(lacking, now)
        deadline = now + self.credit_timeout_s
        while True:
            lacking = tx.lacking(live, cost)
            if not lacking and tx.port_full(cost):
                for d in tx.holders():
                    if tx.sync_due(d, now, tx.request_s):
                        self._sync(d)
                wait = tx.request_s
            else:
                for d in lacking:
                    if tx.sync_due(d, now):
                        self._sync(d)
                wait = tx.sync_s
            if self._readable(min(deadline - now, wait)):
                self._read_batch()
            now = self.clock()
            # SYNCs from upstream are answered even now: a grant only ever covers
            # what was consumed, so this releases no back-pressure
            self._send_grants(now)
            if tx.can_send(live, cost):
                return True
            gone = self._routed_around(live, cost, now) if self.routing_ahead else []
            if gone:
                rest = tuple(d for d in live if d not in gone)
                if not rest:
                    return False
                st.drop("credit_timeout", len(live) - len(rest))  # frames the dead ones miss
                live = rest
                if tx.can_send(live, cost):
                    return True
                continue
            if now >= deadline:
                blocking = tx.lacking(live, cost) or tx.holders()
                for d in blocking:
                    if tx.mark_dead(d):
                        log.warning(
                            "worker %d: no credit from worker %d for %.1f s: dropping its frames",
                            self.worker_id, d, self.credit_timeout_s,
                        )  # fmt: skip
                rest = [d for d in live if d not in blocking]
                if not rest:
                    return False
                st.drop("credit_timeout", len(live) - len(rest))  # frames the dead ones miss
                return True

    def _routed_around(self, live: tuple[int, ...], cost: int, now: float) -> list[int]:
        """Receivers blocking this wait that a queued ROUTING leaves out and that are
        silent; they are marked dead (a grant revives them, as after a timeout)."""
        tx, ahead = self.tx, self.routing_ahead
        blocking = set(tx.lacking(live, cost)) | set(tx.holders())
        gone = []
        for d in sorted(blocking):
            if tx.unanswered_for(d, now) < self.reroute_silence_s:
                continue
            streams = {s for (dst, s) in self.seq_out if dst == d}
            streams.update(s for s, ds in self.group_dsts.items() if d in ds)
            if any(s in ahead and d not in ahead[s] for s in streams):
                gone.append(d)
                tx.mark_dead(d)
                log.warning(
                    "worker %d: worker %d is routed around and answered no SYNC for %.1f s: "
                    "dropping its frames",
                    self.worker_id, d, tx.unanswered_for(d, now),
                )  # fmt: skip
        return gone

    # ----- control -------------------------------------------------------------------------

    def reply(self, ct: ControlTuple) -> None:
        frames = wire.pack_frames(
            self.controller, self.mac, Kind.CONTROL, 0, self.ctrl_seq, [wire.encode_control(ct)],
            self.mtu, self.ethertype,
        )  # fmt: skip
        self.ctrl_seq = (self.ctrl_seq + len(frames)) & cr.MASK
        for frame in frames:
            self._write(frame)

    # ----- housekeeping --------------------------------------------------------------------

    def queue_bytes(self) -> int:
        """Bytes read off the port but not handed out yet (queued while blocked sending).

        Frames still in the TAP device's queue are not counted: the tun driver does
        not answer FIONREAD (EINVAL).
        """
        return self.pending_bytes

    def linger(self, timeout: float = LINGER_S) -> None:
        """Before the port goes away, wait until every receiver confirmed our frames.

        Closing the TAP destroys the device, and frames the switch has not read
        from it yet die with it: without this wait the last frames of a finished
        worker could be lost under load.  SYNCs ask receivers for their grants.
        """
        start = self.clock()
        deadline = start + timeout
        while True:
            now = self.clock()
            waiting = self.tx.holders()
            if not waiting or now >= deadline:
                if waiting:
                    log.warning(
                        "worker %d: closing with unconfirmed frames to %s", self.worker_id, waiting
                    )
                return
            # receivers refresh their grants on their own (and grant when they close):
            # ask with SYNCs only when that did not happen, so a normal end sends none
            if now - start >= LINGER_QUIET_S:
                for d in waiting:
                    if self.tx.sync_due(d, now, LINGER_SYNC_S):
                        self._sync(d)
            if self._readable(0.01):
                self._read_batch()
            self._send_grants(now)

    def close(self) -> None:
        # senders may linger for our confirmation of what we consumed: send it now
        now = self.clock()
        for src in list(self.rx._links):
            if self.rx.pending(src) == 0:
                self._credit(src, cr.GRANT, self.rx.grant(src, now))
        self.dev.close()
