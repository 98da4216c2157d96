"""Worker process entry point: ``python -m typhoon.runtime.worker SPEC.json``.

Builds the three layers, runs the event loop until the worker has finished
(end of stream, DRAIN) or is told to stop, then writes its report file.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typhoon import logs
from typhoon.operators import resolve_operator
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound, Transport
from typhoon.wire import Control, ControlTuple

log = logging.getLogger("typhoon.worker")

# a finished worker under a guarantee waits this long for COMPLETE (it may have to roll back)
COMPLETE_WAIT_S = 120.0


def make_transport(spec: WorkerSpec) -> Transport:
    """The I/O layer named in the spec."""
    params = spec.transport
    kind = params.get("kind")
    if kind == "tcp":
        from typhoon.runtime.tcp import TCP_MTU, TcpTransport

        host, port = params["control"]
        secret = params.get("secret")
        if not isinstance(secret, str) or not secret:
            raise ValueError("a tcp worker needs the run's secret (transport.secret in its spec)")
        return TcpTransport(
            spec.worker_id,
            spec.physical.app_id,
            (host, int(port)),
            params.get("bind", "127.0.0.1"),
            int(params.get("mtu", TCP_MTU)),  # a run writes it (worker_specs.tcp_mtu)
            secret=secret,
        )
    if kind == "sdn":
        from typhoon.runtime.sdn import SdnTransport

        return SdnTransport.from_spec(spec)
    raise ValueError(f"unknown transport {kind!r}")


def json_safe(value: Any) -> Any:
    """Report values as JSON: bytes become text, tuples lists, keys strings."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value


TRACEBACK_LINES = 12


def traceback_tail(text: str, lines: int = TRACEBACK_LINES) -> list[str]:
    """The last ``lines`` lines of a formatted traceback (where it was raised, and what)."""
    return [line for line in text.rstrip().splitlines() if line.strip()][-lines:]


class Worker:
    """One worker process: the event loop around the framework layer."""

    def __init__(self, spec: WorkerSpec, io: Any = None) -> None:
        self.spec = spec
        node = spec.topology.nodes[spec.assignment.node]
        operator = resolve_operator(node.operator, node.engine)(**node.args)
        # a chain's worker gets its transport wrapped (typhoon.runtime.chain.ChainLinks)
        self.io = make_transport(spec) if io is None else io
        self.fw = Framework(spec, operator, self.io)
        self.fw.on_finish = self.finished
        self.stopping = False
        self.error: str | None = None
        self.done_at = 0.0
        self.traceback: list[str] = []  # last lines of the exception that ended the run
        # CPU seconds of this process from the start of the event loop: what the work cost
        # (benchmarks: source CPU per tuple), without interpreter start-up and imports
        self.cpu_start = time.process_time()

    @property
    def operator(self) -> Any:
        """The operator instance (a rollback builds a new one)."""
        return self.fw.op

    def stop(self, *_: Any) -> None:
        self.stopping = True

    def finished(self) -> None:
        """Under a guarantee a finished worker stays, able to roll back, until COMPLETE:
        the controller hears of the end and gets the report now."""
        if self.fw.may_exit:
            return
        self.say_done()
        self.write_report()
        self.done_at = time.monotonic()

    def may_exit(self) -> bool:
        fw = self.fw
        if not fw.done:
            return False
        if fw.may_exit:
            return True
        if time.monotonic() - self.done_at > COMPLETE_WAIT_S:
            log.warning("worker %d: no COMPLETE after %.0f s", fw.worker_id, COMPLETE_WAIT_S)
            return True
        return False

    def handle(self, items: list[Inbound | ControlTuple], clock: Callable[[], float]) -> None:
        """What one poll returned, in order: control applied, data to the operator; until
        delivered, the data counts in the worker's backlog (``queue`` metric)."""
        fw = self.fw
        fw.took(items)
        fw.start_slice()
        for handled, item in enumerate(items, 1):
            fw.now = clock()
            if isinstance(item, ControlTuple):
                fw.control(item)
            else:
                fw.deliver(item)
            fw.handled = handled  # off the backlog (delivered or dropped)

    def run(self) -> None:
        fw, io = self.fw, self.io
        clock = time.monotonic
        self.cpu_start = time.process_time()
        try:
            fw.start()
            while not self.may_exit() and not self.stopping:
                fw.now = clock()
                if fw.spout_ready():
                    timeout = fw.throttle_delay()
                else:
                    timeout = min(fw.next_deadline(), 0.05)
                self.handle(io.poll(timeout), clock)
                fw.now = clock()
                fw.step_spout()
                fw.tick()
            fw.flush(force=True)
        except ConnectionError as e:
            self.error = f"connection lost: {e}"
            log.error("worker %d: %s", fw.worker_id, self.error)
        except Exception as e:  # the operator (or the framework) raised: say so in the report
            self.error = "".join(traceback.format_exception_only(e)).strip()
            self.traceback = traceback_tail(traceback.format_exc())
            log.exception("worker %d (%s) failed", fw.worker_id, self.spec.assignment.node)
        finally:
            if self.error is None:
                self.say_done()
                io.linger()
            self.write_report()
            self.operator.close()
            if fw.ckpt is not None:
                fw.ckpt.close()
            io.close()

    def say_done(self) -> None:
        """A last METRIC_RESP, unasked, once the input is finished: the controller hears of
        the end before our port goes down (an end of stream, not a death) and keeps the
        final counters."""
        if not self.fw.done:  # stopped, not finished
            return
        metrics = self.fw.sendable(self.fw.metrics())
        body = {"request_id": 0, "worker": self.fw.worker_id, "metrics": metrics}
        try:
            self.io.reply(ControlTuple(Control.METRIC_RESP, body))
        except OSError as e:
            log.warning("worker %d: final METRIC_RESP not sent: %s", self.fw.worker_id, e)

    def report(self) -> dict[str, Any]:
        a = self.spec.assignment
        report: dict[str, Any] = json_safe(
            {
                "worker": a.worker_id,
                "node": a.node,
                "index": a.index,
                "host": a.host,
                "port": a.port,
                "finished": self.fw.done,
                "error": self.error,
                "traceback": self.traceback,
                "cpu_s": round(time.process_time() - self.cpu_start, 6),
                "metrics": self.fw.metrics(),
                "links": self.fw.link_counts(),
                # moved (typhoon move): its operator's state, result included, went on
                # to the worker named; reporting it here too would count it twice
                "moved_to": self.fw.moved_to,
                "result": None if self.fw.moved_to else self.operator.result(),
                # operators swapped out in place before this one, each with its result
                # (typhoon.runtime.operator_swap): the report merges them as drained workers'
                "swapped": self.fw.swapped,
                "pid": os.getpid(),
            }
        )
        return report

    def write_report(self) -> None:
        if not self.spec.report_dir:
            return
        path = Path(self.spec.report_dir) / f"worker-{self.spec.worker_id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.report()))
        tmp.rename(path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m typhoon.runtime.worker SPEC.json [SPEC.json ...]", file=sys.stderr)
        return 2
    logs.setup(logging.INFO)
    specs = [WorkerSpec.load(Path(a)) for a in argv]
    worker: Any
    if len(specs) > 1:  # one chain instance, head first (typhoon.topology.chaining)
        from typhoon.runtime.chain import ChainWorker

        worker = ChainWorker(specs, Worker, make_transport)
    else:
        worker = Worker(specs[0])
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    worker.run()
    return 0 if worker.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
