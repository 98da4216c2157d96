"""The controller's end of the control channel to workers, free of Ryu.

Outbound: control tuples become frames with a per-worker sequence number
(``frames``).  Inbound: PacketIn data becomes the METRIC_RESPs it carries
(``receive``: frame checks, segment reassembly, drops counted by reason).
And what replies leave behind: the ack log the reconfiguration executor and
the fault detector wait on, each worker's last metrics, answers to a given
METRIC_REQ, and tuples per second in and out.  The core
(``controller/core.py``) sends the frames and raises the events.
"""

from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass
from typing import Any

from typhoon import wire
from typhoon.wire import Control, ControlTuple, Kind, WireError

ACK_LOG = 4096  # (app, ack, version) entries kept
RESPONSES = 256  # METRIC_REQ rounds whose answers are kept
SENT_KEPT = 4096  # METRIC_REQs whose send time is kept until their answer comes


@dataclass(frozen=True)
class Reply:
    """One METRIC_RESP from a worker of a known application."""

    app: str
    worker: int
    metrics: dict[str, Any]
    request_id: int


class ControlChannel:
    def __init__(self) -> None:
        self.ctrl_seq: dict[tuple[int, int], int] = {}
        self.reassembly: dict[bytes, wire.Reassembler] = {}
        self.request_ids = itertools.count(1)
        self.drops: dict[str, int] = {}
        self.acks: collections.deque[dict] = collections.deque(maxlen=1000)
        # (app, ack, version) -> workers that confirmed it
        self.ack_log: collections.OrderedDict[tuple[str, str, int], set[int]] = (
            collections.OrderedDict()
        )
        self.rates: dict[str, dict[int, dict]] = {}  # app -> worker -> tuples/s in and out
        self._last_counts: dict[tuple[str, int], tuple[float, int, int]] = {}
        # request id -> worker -> metrics, for callers waiting for their own METRIC_REQ
        self.responses: collections.OrderedDict[int, dict[int, dict]] = collections.OrderedDict()
        self.worker_metrics: dict[str, dict[int, dict]] = {}  # app -> worker -> last metrics
        # (request id, worker) -> when its METRIC_REQ was framed: the answer carries the
        # round trip (``rtt_ms``), what control traffic apart from data is measured by
        self.sent_at: collections.OrderedDict[tuple[int, int], float] = collections.OrderedDict()

    # ----- outbound ------------------------------------------------------------------------

    def frames(
        self, app_id: int, worker_id: int, ct: ControlTuple, mtu: int = wire.DEFAULT_MTU
    ) -> list[bytes]:
        """``ct`` as frames to one worker, numbered on from the last ones it was sent
        (``mtu``: the fabric's, so that a control tuple fits the path too)."""
        seq = self.ctrl_seq.get((app_id, worker_id), 0)
        frames = wire.pack_frames(
            wire.worker_mac(app_id, worker_id),
            wire.controller_mac(app_id),
            Kind.CONTROL,
            0,
            seq,
            [wire.encode_control(ct)],
            mtu,
        )
        self.ctrl_seq[(app_id, worker_id)] = seq + len(frames)
        if ct.type == Control.METRIC_REQ:
            self.sent_at[(ct.body["request_id"], worker_id)] = time.monotonic()
            while len(self.sent_at) > SENT_KEPT:
                self.sent_at.popitem(last=False)
        return frames

    def next_request_id(self) -> int:
        return next(self.request_ids) & 0x7FFFFFFF

    # ----- inbound -------------------------------------------------------------------------

    def drop(self, reason: str) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + 1

    def receive(self, data: bytes, app_by_id: Any) -> list[Reply]:
        """The METRIC_RESPs in one PacketIn; anything else is dropped and counted.

        ``app_by_id(app_id)`` names the application of an address (None: unknown)."""
        try:
            frame = wire.decode_frame(data)
            src = wire.parse_mac(frame.src)
            dst = wire.parse_mac(frame.dst)
        except WireError:
            self.drop("malformed_frame")
            return []
        if frame.kind != Kind.CONTROL or dst.cls != wire.AddrClass.CONTROLLER:
            self.drop("unexpected_frame")
            return []
        app = app_by_id(src.app_id)
        if app is None or src.cls != wire.AddrClass.WORKER:
            self.drop("unknown_sender")
            return []
        payloads = frame.payloads
        if frame.flags & wire.SEG:
            r = self.reassembly.setdefault(frame.src, wire.Reassembler())
            try:
                payloads = r.feed(frame)
            except WireError:
                self.drop("bad_segment")
                return []
        replies = []
        for p in payloads:
            try:
                ct = wire.decode_control(p)
            except WireError:
                self.drop("malformed_control")
                continue
            if ct.type != Control.METRIC_RESP or ct.body["worker"] != src.value:
                self.drop("unexpected_control")
                continue
            replies.append(Reply(app, src.value, ct.body["metrics"], ct.body["request_id"]))
        return replies

    # ----- what replies leave behind -------------------------------------------------------

    def record_ack(self, app: str, worker_id: int, what: str, version: int) -> None:
        self.acks.append(
            {"app": app, "worker": worker_id, "ack": what, "version": version, "time": time.time()}
        )
        key = (app, what, version)
        self.ack_log.setdefault(key, set()).add(worker_id)
        self.ack_log.move_to_end(key)
        while len(self.ack_log) > ACK_LOG:
            self.ack_log.popitem(last=False)

    def acked(self, app: str, what: str, version: int) -> set[int]:
        """Workers that confirmed the control tuple ``what`` with ``version``."""
        return self.ack_log.get((app, what, version), set())

    def record_metrics(self, reply: Reply) -> dict[str, Any]:
        """Keep a METRIC_RESP (rates, last metrics, answers by request); returns the
        metrics with their ``request_id``."""
        self._rate(reply.app, reply.worker, reply.metrics)
        metrics = {**reply.metrics, "request_id": reply.request_id}
        sent = self.sent_at.pop((reply.request_id, reply.worker), None)
        if sent is not None:
            metrics["rtt_ms"] = round((time.monotonic() - sent) * 1000.0, 3)
        self.responses.setdefault(reply.request_id, {})[reply.worker] = metrics
        self.worker_metrics.setdefault(reply.app, {})[reply.worker] = metrics
        while len(self.responses) > RESPONSES:
            self.responses.popitem(last=False)
        return metrics

    def _rate(self, app: str, worker_id: int, metrics: dict) -> None:
        """Tuples per second in and out since the worker's previous METRIC_RESP."""
        t = metrics.get("time")
        if not isinstance(t, (int, float)):
            return
        total_in = sum(v for k, v in metrics.get("in", {}).items() if k != "0")
        total_out = sum(metrics.get("out", {}).values())
        prev = self._last_counts.get((app, worker_id))
        self._last_counts[(app, worker_id)] = (t, total_in, total_out)
        if prev is not None and t > prev[0]:
            dt = t - prev[0]
            self.rates.setdefault(app, {})[worker_id] = {
                "in": round((total_in - prev[1]) / dt, 1),
                "out": round((total_out - prev[2]) / dt, 1),
            }
