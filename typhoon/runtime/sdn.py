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
the load-balancer app, :meth:`SdnTransport.send_balanced`): frames go to the
load-balancer slot addresses of the receiving node in turn, flagged
:data:`typhoon.wire.LB`; the switch picks the worker.  They are paced by one
group window per stream (:mod:`typhoon.runtime.lb_credits`); a frame the switch
drops on that path is counted lost, not sent again.

Spec (``WorkerSpec.transport``)::

    {"kind": "sdn",
     "tap": "ty007a0002",        # optional, default tap_name(app, worker)
     "mtu": 64000, "window": 128,  # window in frames per link
     "window_bytes": 524288,     # ... and in bytes of frames (balanced groups, least of links)
     "window_bytes_max": 3145728,  # the most of a link's, which follows its receiver's rate
     "ethertype": 0x88B5,        # optional
     "credit_timeout_s": 10,     # a receiver silent this long is dead (frames dropped)
     "port_budget": 180224}      # bytes in flight (typhoon.port_budgets); 0 = off

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
from typing import TYPE_CHECKING, Any

from typhoon import wire
from typhoon.runtime import lb_credits as lb
from typhoon.runtime import links as lk
from typhoon.runtime.sdn_balanced import SdnBalancedSending
from typhoon.runtime.sdn_credit import SdnCredit
from typhoon.runtime.sdn_parts import Device
from typhoon.runtime.sdn_receive import SdnReceiving
from typhoon.runtime.sdn_send import SdnSending
from typhoon.runtime.tap import DEFAULT_TXQUEUELEN, Tap, tap_name
from typhoon.runtime.transport import Transport
from typhoon.runtime.truesize import default_budget
from typhoon.topology.config import SDN_DEFAULTS
from typhoon.wire import AddrClass, ControlTuple, Kind, WireError

if TYPE_CHECKING:
    from typhoon.runtime.sdn_parts import Pending

log = logging.getLogger(__name__)

DEFAULT_CREDIT_TIMEOUT_S = SDN_DEFAULTS.credit_timeout_s  # declared in typhoon/topology/config.py
# a receiver the controller routes around that answered no request for credit for this
# long is dead at once, without waiting out the credit timeout (a live receiver, even
# a blocked one, answers every SYNC)
REROUTE_SILENCE_S = 1.0
LINGER_S = 2.0  # longest a finished worker waits for its receivers' confirmations
QUIET_PROBES = 3  # a finished receiver answers SYNCs until this many probe periods pass quietly


class SdnTransport(SdnReceiving, SdnCredit, SdnSending, SdnBalancedSending, Transport):
    """Worker-side I/O over a TAP port of an Open vSwitch bridge.

    Its parts are mixins, each in its own module: receiving
    (:mod:`typhoon.runtime.sdn_receive`), credit frames
    (:mod:`typhoon.runtime.sdn_credit`), sending (:mod:`typhoon.runtime.sdn_send`)
    and load-balanced sending (:mod:`typhoon.runtime.sdn_balanced`).
    """

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
        window_bytes: int | None = lk.DEFAULT_WINDOW_BYTES,
        window_bytes_max: int | None = lk.DEFAULT_WINDOW_BYTES_MAX,
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
        self.tx = lk.Sender(
            window, budget, window_bytes=window_bytes, window_bytes_max=window_bytes_max
        )
        self.rx: lk.Receiver[Pending] = lk.Receiver(window)
        self.window = window
        self.window_bytes = self.tx.window_bytes
        # load-balanced streams: group windows as a sender, grants owed as a receiver
        self.lb_tx: dict[int, lb.BalancedSender] = {}
        self.lb_rx = lb.BalancedReceiver(lb.grant_threshold(window), self._lb_grant_bytes(budget))
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
        self.pending: deque[Pending] = deque()
        self.pending_bytes = 0
        self.ctrl_pending = 0  # control frames among them
        # urgent control tuples (wire.URGENT_CONTROL) read off the port: they go to the
        # framework ahead of everything in ``pending`` (off: every control frame in order)
        self.control_priority = control_priority
        self.urgent: deque[ControlTuple] = deque()
        # the framework's handler for urgent control while a send waits for credit
        self.on_urgent: Callable[[ControlTuple], None] | None = None
        self.on_wait: Callable[[], None] | None = None
        self._src_ids: dict[bytes, int] = {}
        self._dst_macs: dict[int, bytes] = {}
        self._resync_at: dict[tuple[int, int], float] = {}
        # next hops of every stream that a ROUTING still in ``pending`` sets: a credit wait
        # gives up on a silent receiver the controller routes around (see _routed_around)
        self.routing_ahead: dict[int, frozenset[int]] = {}
        self.streams_of: dict[int, set[int]] = {}  # receiver -> streams we sent it
        # every receiver the routes include since the last ROUTING (None: none came yet)
        self.routed: set[int] | None = None
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
            control_priority=bool(p.get("control_priority", SDN_DEFAULTS.control_priority)),
            window_bytes=int(p.get("window_bytes", lk.DEFAULT_WINDOW_BYTES)),
            window_bytes_max=int(p.get("window_bytes_max", lk.DEFAULT_WINDOW_BYTES_MAX)),
        )

    def _lb_grant_bytes(self, budget: int | None) -> float:
        """Bytes a receiver consumes from a balanced sender before it grants: an eighth
        of the port budget or of the byte window (truesize, at least the frame bytes),
        whichever is less (the senders have the same window: one topology config)."""
        limits = [b / lb.GRANT_SHARE for b in (budget, self.window_bytes) if b]
        return min(limits, default=math.inf)

    @property
    def budget(self) -> int | None:
        return self.tx.budget

    def set_budget(self, budget: int) -> None:
        """A new byte budget (FLOW_CONTROL from the controller: the fabric's shares changed)."""
        self.tx.budget = budget or None
        self.lb_rx.bytes = self._lb_grant_bytes(budget)
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
        """Bytes read off the port and not handed out yet (read ahead between slices of
        work, or while blocked sending).

        The framework adds what it took and has not processed
        (``Framework.taken_bytes``): together the worker's backlog, which the load
        balancer's queue term weighs (``controller/load_balancing/balancer.py``).
        Counting only what was left here when the framework last took input, as
        before, showed 0 while an over-fed worker held a sender's whole group window
        (docs/load_balancer.md).  Frames still in the TAP device's queue are not
        counted (the tun driver does not answer FIONREAD), but the worker reads the
        port at every poll and between slices, so few wait there.
        """
        return self.pending_bytes

    def frames_sent(self, dst: int) -> int | None:
        ol = self.tx.links.get(dst)
        return 0 if ol is None else ol.next & lk.MASK

    def frames_delivered(self, src: int) -> int | None:
        il = self.rx.get((src, 0))
        return 0 if il is None else il.consumed

    def frames_confirmed(self, dst: int) -> int | None:
        ol = self.tx.links.get(dst)
        m = None if ol is None else ol.members.get(dst)
        return 0 if m is None else m.received & lk.MASK

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
        if self.rx.links:
            self._answer_until_quiet(now)
        self.dev.close()

    def _answer_until_quiet(self, now: float) -> None:
        """Keep answering SYNCs until senders stop probing (a TCP TIME_WAIT).

        Our last grant may die with the TAP device (frames the switch has not read
        yet go with it), and a sender whose frames we hold would then report them
        never confirmed.  A sender probes every ``probe_s`` while it waits: once
        ``QUIET_PROBES`` periods pass without a frame, nobody is waiting for us."""
        quiet = QUIET_PROBES * self.tx.probe_s
        deadline = now + LINGER_S
        last = now
        while (t := self.clock()) < min(deadline, last + quiet):
            if self._readable(min(deadline, last + quiet) - t) and self._read_batch():
                last = self.clock()
