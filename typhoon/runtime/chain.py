"""A chain's worker process: the workers of one chain instance, tuples by function call.

``typhoon.topology.chaining`` says which workers share a process.  Each keeps
its own framework layer (routes, counters, checkpoints, report) and its own
transport for what comes from or goes to outside the chain and for control;
only the edges inside the chain change: rows a worker hands to the next worker
of the chain go to that worker's ``deliver`` as they are, without a serializer
or a socket.  Punctuation (end of stream, watermarks, checkpoint anchors and
marks) goes the same way as bytes, in the order it was sent, so everything that
keeps a link exact keeps the chained one exact.  Under a guarantee the rows go
as bytes too: the upstream backup records every entry that leaves a worker.
"""

from __future__ import annotations

import logging
import select
import time
import traceback
from collections.abc import Callable
from typing import Any

from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound
from typhoon.wire import ControlTuple

log = logging.getLogger("typhoon.worker")

# longest wait between turns: the sdn transport refreshes credit and probes its links
# every 10 ms even when idle (its own poll never waits longer)
MAX_WAIT_S = 0.01


class ChainLinks:
    """A chained worker's transport: sends to the workers of the same process are
    function calls, everything else goes to its own transport."""

    def __init__(self, inner: Any, worker_id: int) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "worker_id", worker_id)
        object.__setattr__(self, "peers", {})  # worker ID -> its framework

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        peer = self.peers.get(dst)
        if peer is None:
            self._inner.send(dst, stream, payloads)
        else:
            peer.deliver(Inbound(self.worker_id, stream, list(payloads)))

    def send_group(
        self, group: int, dsts: list[int], payloads: list[bytes], stream: int | None = None
    ) -> None:
        outside = [d for d in dsts if d not in self.peers]
        if outside:
            self._inner.send_group(group, outside, payloads, stream)
        for d in dsts:
            if d in self.peers:
                self.send(d, group if stream is None else stream, payloads)

    def settle(self, dsts: list[int]) -> list[int]:
        """Nothing to wait for on a function call."""
        left: list[int] = self._inner.settle([d for d in dsts if d not in self.peers])
        return left


class ChainWorker:
    """The workers of one chain instance in one process (head first)."""

    def __init__(
        self,
        specs: list[WorkerSpec],
        worker: Callable[[WorkerSpec, Any], Any],
        transport: Callable[[WorkerSpec], Any],
    ) -> None:
        """``worker``: typhoon.runtime.worker.Worker; ``transport``: its make_transport
        (passed in: the worker module starts a chain, this one does not import it)."""
        self.links = [ChainLinks(transport(s), s.worker_id) for s in specs]
        self.members = [worker(s, io) for s, io in zip(specs, self.links, strict=True)]
        for i in range(len(self.members) - 1):
            up, down = self.members[i], self.members[i + 1]
            self.links[i].peers[down.fw.worker_id] = down.fw
            if up.fw.ckpt is None:  # under a guarantee entries go as bytes (upstream backup)
                up.fw.chained[down.fw.worker_id] = down.fw
        self.stopping = False

    def stop(self, *_: Any) -> None:
        self.stopping = True

    def _timeout(self, now: float) -> float:
        waits = [MAX_WAIT_S]
        for m in self.members:
            fw = m.fw
            fw.now = now
            if fw.spout_ready():
                waits.append(fw.throttle_delay())
            elif not fw.done:
                waits.append(fw.next_deadline())
        return max(0.0, min(waits))

    def _wait(self, timeout: float) -> None:
        """Until one transport has something, or ``timeout`` seconds."""
        if timeout <= 0:
            return
        fds = []
        for io in self.links:
            fd = io.waitable()
            if fd is None:
                return  # something is queued inside a transport already
            fds.append(fd)
        select.select(fds, [], [], timeout)

    def _turn(self, clock: Any) -> None:
        for m in self.members:
            fw = m.fw
            items = m.io.poll(0)
            fw.start_slice()
            for item in items:
                now = clock()
                for other in self.members:
                    other.fw.now = now
                if isinstance(item, ControlTuple):
                    fw.control(item)
                else:
                    fw.deliver(item)
        for m in self.members:
            now = clock()
            for other in self.members:
                other.fw.now = now
            m.fw.step_spout()
            m.fw.tick()

    def run(self) -> None:
        clock = time.monotonic
        error: str | None = None
        tb: list[str] = []
        for m in self.members:
            m.cpu_start = time.process_time()
        try:
            for m in self.members:
                m.fw.start()
            while not all(m.may_exit() for m in self.members) and not self.stopping:
                self._wait(self._timeout(clock()))
                self._turn(clock)
            for m in self.members:
                m.fw.flush(force=True)
        except ConnectionError as e:
            error = f"connection lost: {e}"
        except Exception as e:  # an operator (or the framework) raised: every member says so
            error = "".join(traceback.format_exception_only(e)).strip()
            tb = [line for line in traceback.format_exc().splitlines() if line.strip()][-12:]
            log.exception("chain %s failed", [m.spec.worker_id for m in self.members])
        finally:
            for m in self.members:
                if error is not None:
                    m.error, m.traceback = error, tb
                else:
                    m.say_done()
            for m in self.members:
                if error is None:
                    m.io.linger()
                m.write_report()
                m.operator.close()
                if m.fw.ckpt is not None:
                    m.fw.ckpt.close()
                m.io.close()

    @property
    def error(self) -> str | None:
        return next((m.error for m in self.members if m.error), None)
