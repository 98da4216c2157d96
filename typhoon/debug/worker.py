"""Debug worker process: ``python -m typhoon.debug.worker SPEC.json`` (started by the agent).

It owns a TAP device that the agent plugs into the observed worker's bridge
at the session's port; the controller then adds that port as an extra output
to the rules carrying the observed traffic, so every frame arriving here is a
copy the switch made (paper §4, "Live debugger").  The debug worker never
writes to its port: it is invisible to the application, and a slow debug
worker loses copies (counted by sequence number), never slows the observed
worker down.

The switch usually samples already (its meter copies at most the session's rate
of frames per second, ``controller/rules/meters.py``; ``--rate all`` has no meter and
every frame comes here); on top, a reader thread moves
frames off the TAP into a bounded ring that drops its oldest frame when the
decoder falls behind (``ring_dropped``), so the TAP's queue never fills because
of decoding, and the switch never has to hold copies for us.

What passes the filter and the sampling goes to the controller in batches,
through the coordinator (``typhoon/debug/transport.py``: it works from any
host an agent runs on) or, when ``[live_debugger] report_url`` is set, by HTTP
POST to it, authenticated by the session key; the controller keeps the ring
buffer the CLI reads.  A worker that cannot deliver says so to the controller
through the coordinator (the CLI prints it) and logs it once, not per batch.
The worker stops on SIGTERM (the agent, on detach) or when the controller says
the session is gone.
"""

from __future__ import annotations

import logging
import select
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from typhoon import logs
from typhoon.client import ApiCallError, Client, Endpoint
from typhoon.coordinator import Coordinator, CoordinatorError, open_coordinator
from typhoon.debug.filter import parse
from typhoon.debug.operator import DebugOperator
from typhoon.debug.records import MirrorDecoder
from typhoon.debug.spec import KEY_HEADER, DebugSpec
from typhoon.debug.transport import (
    MAX_BATCH_BYTES,
    SessionEnded,
    Undelivered,
    coordinator_post,
    record_size,
    report_failure,
)
from typhoon.operators import OperatorError

log = logging.getLogger("typhoon.debug.worker")

READ_BATCH = 1024  # frames read per wake-up
SHIP_INTERVAL = 0.1  # seconds between POSTs while records arrive
HEARTBEAT = 2.0  # seconds between POSTs of statistics alone
SHIP_BATCH = 2000  # records per POST at most
TXQUEUELEN = 16384  # frames the switch may queue toward us before copies are dropped
RING_FRAMES = 256  # frames read but not decoded yet; the oldest go when a new one comes
FAILURES_REPORTED = 3  # failed deliveries in a row before the controller is told why
WARN_EVERY = 30.0  # seconds between two log lines about the same delivery failure


class FrameRing:
    """Bounded, drop-oldest hand-over from the reader thread to the decoder (counted drops)."""

    def __init__(self, size: int = RING_FRAMES) -> None:
        self.frames: deque[bytes] = deque(maxlen=max(1, size))
        self.dropped = 0
        self.ready = threading.Event()
        self._lock = threading.Lock()

    def put(self, frame: bytes) -> None:
        with self._lock:
            if len(self.frames) == self.frames.maxlen:
                self.dropped += 1  # the deque drops the oldest as this one goes in
            self.frames.append(frame)
        self.ready.set()

    def take(self, limit: int) -> list[bytes]:
        """Up to ``limit`` frames, oldest first."""
        with self._lock:
            n = min(limit, len(self.frames))
            out = [self.frames.popleft() for _ in range(n)]
            if not self.frames:
                self.ready.clear()
        return out


class Device(Protocol):
    def fileno(self) -> int: ...
    def read(self, size: int | None = None) -> bytes | None: ...
    def close(self) -> None: ...


class SessionGone(Exception):
    """The controller no longer knows the session (detached, or the controller restarted)."""


Post = Callable[[dict[str, Any]], None]


def http_post(spec: DebugSpec, timeout: float = 5.0) -> Post:
    """POST one batch to the controller; SessionGone on 404/410."""
    client = Client(Endpoint(spec.report_url, ""), timeout, retries=0)
    path = f"/sessions/{spec.session}/records"

    def post(body: dict[str, Any]) -> None:
        status, reply = client.exchange("POST", path, body, headers={KEY_HEADER: spec.key})
        if status in (404, 410):
            raise SessionGone(f"controller answered {status}")
        if status >= 400:
            error = reply.get("error") if isinstance(reply, dict) else reply
            raise ApiCallError(status, f"records refused: {error}")

    return post


class Shipper:
    """Sends records to the controller from its own thread, at most ``max_rate`` per second.

    Records the controller cannot take fast enough are counted, not queued without
    bound: ``throttled`` (over the rate) and ``overflow`` (backlog full).
    """

    def __init__(
        self,
        post: Post,
        stats: Callable[[], dict[str, Any]],
        max_rate: int,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.post = post
        self.stats = stats
        self.on_failure = on_failure  # told once why deliveries keep failing
        self.failures = 0  # failed deliveries in a row
        self.warned_at = -WARN_EVERY
        self.max_rate = max(1, int(max_rate))
        self.backlog: deque[dict[str, Any]] = deque(maxlen=2 * self.max_rate)
        self.shipped = self.throttled = self.overflow = 0
        self.tokens = float(self.max_rate)
        self.last = time.monotonic()
        self.error: str | None = None
        self.sent_stats: dict[str, Any] | None = None
        self.sent_at = 0.0
        self.gone = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="debug-shipper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, records: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        self.tokens = min(self.max_rate, self.tokens + (now - self.last) * self.max_rate)
        self.last = now
        for r in records:
            if self.tokens < 1:
                self.throttled += 1
                continue
            self.tokens -= 1
            if len(self.backlog) == self.backlog.maxlen:
                self.overflow += 1
            self.backlog.append(r)

    def body(self, final: bool = False) -> dict[str, Any]:
        batch: list[dict[str, Any]] = []
        size = 0
        while self.backlog and len(batch) < SHIP_BATCH:
            n = record_size(self.backlog[0])
            if batch and size + n > MAX_BATCH_BYTES:
                break
            record = self.backlog.popleft()
            if n > MAX_BATCH_BYTES:  # shown as what it was, not shipped whole
                record = {"time": record.get("time", 0), "raw": f"a record of {n} bytes"}
            batch.append(record)
            size += n
        self.shipped += len(batch)
        stats = {
            **self.stats(),
            "cpu_s": round(time.process_time(), 2),  # the debugger's own cost, not the app's
            "shipped": self.shipped,
            "throttled": self.throttled,
            "overflow": self.overflow,
        }
        return {"records": batch, "stats": stats, "error": self.error, "final": final}

    def ship_once(self, final: bool = False) -> None:
        body = self.body(final)
        counts = {k: v for k, v in body["stats"].items() if k != "cpu_s"}
        quiet = not body["records"] and counts == self.sent_stats
        if quiet and not final and time.monotonic() - self.sent_at < HEARTBEAT:
            return  # nothing new to say
        try:
            self.post(body)
            self.sent_stats, self.sent_at = counts, time.monotonic()
            self.failures = 0
        except (SessionGone, SessionEnded):
            self.gone.set()
        except (OSError, ValueError, ApiCallError, Undelivered) as e:
            for r in reversed(body["records"]):  # try these again next time
                self.backlog.appendleft(r)
            self.shipped -= len(body["records"])
            self._failed(e)

    def _failed(self, e: Exception) -> None:
        """Log the first failure (then one line per ``WARN_EVERY``); tell the controller why
        once deliveries keep failing (a full slot ring is only the controller behind)."""
        self.failures += 1
        now = time.monotonic()
        if now - self.warned_at >= WARN_EVERY:
            self.warned_at = now
            log.warning("cannot deliver to the controller (%d in a row): %s", self.failures, e)
        if (
            self.failures == FAILURES_REPORTED
            and self.on_failure
            and not isinstance(e, Undelivered)
        ):
            self.on_failure(str(e))

    def _run(self) -> None:
        while not self._stop.wait(SHIP_INTERVAL) and not self.gone.is_set():
            self.ship_once()
            while len(self.backlog) >= SHIP_BATCH and not self.gone.is_set():
                self.ship_once()

    def stop(self) -> None:
        """Stop the thread, then send what is left with the final statistics."""
        self._stop.set()
        self._thread.join(timeout=5)
        if not self.gone.is_set():
            self.ship_once(final=True)


class DebugWorker:
    """Reads mirror copies off the TAP, decodes them, hands records to the shipper."""

    def __init__(
        self,
        spec: DebugSpec,
        device: Device,
        post: Post,
        ring_frames: int = RING_FRAMES,
        on_failure: Callable[[str], None] | None = None,
        operator: DebugOperator | None = None,
    ) -> None:
        self.spec = spec
        self.operator = operator  # the user's bolt over what passed the filter (or none)
        self.dev = device
        self.decoder = MirrorDecoder(
            spec.app_id,
            spec.workers,
            spec.fields,
            parse(spec.filter),
            spec.sample,
            ethertype=spec.ethertype,
        )
        self.lock = threading.Lock()  # the shipper reads the stats while we count
        self.shipper = Shipper(post, self._stats, spec.max_rate, on_failure)
        self.stopping = False
        self.seen_frame = False
        self.ring = FrameRing(ring_frames)
        self._reader = threading.Thread(target=self._read, name="debug-reader", daemon=True)
        self._poller = select.poll()
        self._poller.register(device.fileno(), select.POLLIN)
        self._read_size = 14 + spec.mtu + 64

    def _stats(self) -> dict[str, Any]:
        with self.lock:
            op = self.operator.stats() if self.operator else {}
            return {**self.decoder.stats.to_dict(), "ring_dropped": self.ring.dropped, **op}

    def stop(self, *_: object) -> None:
        self.stopping = True

    def _read(self) -> None:
        """Reader thread: TAP -> ring, as fast as the frames come (a read releases the GIL)."""
        while not self.stopping and not self.shipper.gone.is_set():
            if not self._poller.poll(50):
                continue
            for _ in range(READ_BATCH):
                frame = self.dev.read(self._read_size)
                if frame is None:
                    break
                self.ring.put(frame)

    def run(self) -> None:
        self.shipper.start()
        self._reader.start()
        try:
            while not self.stopping and not self.shipper.gone.is_set():
                if not self.ring.ready.wait(0.05):
                    continue
                now = time.time()
                records: list[dict[str, Any]] = []
                frames = self.ring.take(READ_BATCH)
                if frames and not self.seen_frame:  # start-up is timed to this line
                    self.seen_frame = True
                    log.info("session %s: first mirrored frame", self.spec.session)
                with self.lock:
                    for frame in frames:
                        records.extend(self.decoder.feed(frame, now))
                    if self.operator is not None:
                        records = self.operator.run(records)
                self.shipper.add(records)
        finally:
            why = "stopped" if self.stopping else "the controller ended the session"
            self.stopping = True  # the reader thread too
            self._reader.join(timeout=5)
            self.shipper.stop()
            self.dev.close()
            if self.operator is not None:
                self.operator.close()
        log.info("session %s: %s; %s", self.spec.session, why, self._stats())


def delivery(spec: DebugSpec, c: Coordinator | None) -> tuple[Post, Callable[[str], None]]:
    """(post, on_failure): the coordinator road by default, HTTP with a ``report_url``;
    a failure goes to the controller through the coordinator, with what to do about it."""
    if not spec.report_url:
        if c is None:
            raise ValueError("no report_url and no coordinator: give --coordinator URL")
        post = coordinator_post(c, spec)
    else:
        post = http_post(spec)

    def on_failure(error: str) -> None:
        where = f"at {spec.report_url}" if spec.report_url else "through the coordinator"
        message = f"the debug worker on {spec.host} cannot deliver {where}: {error}"
        if spec.report_url:
            message += (
                " (set [live_debugger] report_url to an address this host reaches, or leave "
                "it empty so records go through the coordinator)"
            )
        if c is None:
            return
        try:
            report_failure(c, spec.session, message)
        except CoordinatorError as e:
            log.error("session %s: cannot report the failure either: %s", spec.session, e)

    return post, on_failure


def _tell(post: Post, on_failure: Callable[[str], None], error: str) -> None:
    """Tell the controller why this debug worker gives up, so the CLI can say it."""
    try:
        post({"records": [], "stats": {}, "error": error, "final": True})
    except (OSError, ValueError, ApiCallError, SessionGone, SessionEnded, Undelivered):
        on_failure(error)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--coordinator"):
        print("usage: python -m typhoon.debug.worker SPEC.json [--coordinator URL]",
              file=sys.stderr)  # fmt: skip
        return 2
    logs.setup(logging.INFO)
    spec = DebugSpec.load(Path(argv[0]))
    try:
        c = open_coordinator(argv[2]) if len(argv) == 3 else None
        post, on_failure = delivery(spec, c)
    except (CoordinatorError, ValueError) as e:
        log.error("session %s: %s", spec.session, e)
        return 2
    try:  # before the TAP: a bad operator ends the session before anything is mirrored
        operator = (
            DebugOperator.load(spec.operator, spec.app, spec.session) if spec.operator else None
        )
    except OperatorError as e:
        log.error("session %s: %s", spec.session, e)
        _tell(post, on_failure, str(e))
        return 1
    from typhoon.runtime.tap import Tap

    try:
        device = Tap(spec.tap, mtu=spec.mtu, txqueuelen=TXQUEUELEN)
    except OSError as e:
        log.error("session %s: cannot create TAP %s: %s", spec.session, spec.tap, e)
        _tell(post, on_failure, f"cannot create TAP {spec.tap}: {e}")
        return 1
    worker = DebugWorker(spec, device, post, on_failure=on_failure, operator=operator)
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    log.info(
        "session %s: observing %s worker %d (%s) on TAP %s, records %s",
        spec.session, spec.app, spec.worker, spec.direction, spec.tap,
        f"to {spec.report_url}" if spec.report_url else "through the coordinator",
    )  # fmt: skip
    try:
        worker.run()
    finally:
        if c is not None:
            c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
