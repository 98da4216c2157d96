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

Live unchaining (CHAIN control tuples, ``typhoon unchain`` / ``typhoon chain``): an
inner edge goes on the network while the process stays.  Every member already has
its own transport, so unchaining only stops the function call: what was handed
over so far was delivered synchronously, later rows go as frames on a new link
(sequence numbers from 0, the receiver starts it on its first frame).  Chaining
again waits until the receiver's transport handed its framework every frame the
sender wrote on that link (and the sender holds its confirmation), then calls
again: nothing is overtaken, and the link's rules may go.  A worker
whose spec's physical topology lists the receiver as ``unchained`` starts so.

A SWAP control tuple to a member replaces its operator in place
(``typhoon.runtime.operator_swap``): the member, its transport and its calls stay.
"""

from __future__ import annotations

import logging
import select
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound
from typhoon.wire import Control, ControlTuple

log = logging.getLogger("typhoon.worker")

# longest wait between turns: the sdn transport refreshes credit and probes its links
# every 10 ms even when idle (its own poll never waits longer)
MAX_WAIT_S = 0.01
LEAVE_WAIT_S = 5.0  # longest a drained member waits for its senders' end of stream


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
            if specs[i + 1].worker_id not in specs[i + 1].physical.unchained:
                self._link(i)
        self.stopping = False
        self.serving: set[int] = set()  # members whose input is being taken now
        for i, io in enumerate(self.links):
            io._inner.on_wait = partial(self._serve_next, i)
        # re-chaining: (index of the sender, CHAIN version) until its receiver caught up
        self.rechaining: list[tuple[int, int]] = []
        self.left: set[int] = set()  # members that drained out, their transport closed
        self.drained: dict[int, float] = {}  # member -> when it was first seen drained

    def _link(self, i: int) -> None:
        """Member ``i`` hands its next member rows by function call."""
        up, down = self.members[i], self.members[i + 1]
        self.links[i].peers[down.fw.worker_id] = down.fw
        if up.fw.ckpt is None:  # under a guarantee entries go as bytes (upstream backup)
            up.fw.chained[down.fw.worker_id] = down.fw

    def _chain_control(self, i: int, ct: ControlTuple) -> None:
        """CHAIN to member ``i``: its edge to the next member goes on the network (acked at
        once: everything called so far is delivered) or back to a function call (acked
        once the receiver delivered every frame sent on the link, :meth:`_caught_up`)."""
        up, body = self.members[i], ct.body
        down = self.members[i + 1] if i + 1 < len(self.members) else None
        if down is None or down.fw.worker_id != body["receiver"]:
            up.io.stats.drop("unexpected_control")  # not the next worker of this process
            return
        wid = down.fw.worker_id
        if up.io.frames_sent(wid) is None or down.io.frames_delivered(up.fw.worker_id) is None:
            up.io.stats.drop("unchain_unsupported")  # never acked: the update times out
            return
        if body["chained"]:  # acked after a turn (a sender may be inside a send now)
            self.rechaining.append((i, body["version"]))
            return
        # a re-chain still waiting is off too (an update rolled back: the edge stays out)
        self.rechaining = [(j, v) for j, v in self.rechaining if j != i]
        self.links[i].peers.pop(wid, None)
        up.fw.chained.pop(wid, None)
        up.fw._ack("CHAIN", body["version"])

    def _caught_up(self) -> None:
        """Chain again every pending edge whose receiver delivered all the sender wrote,
        and whose sender holds the receiver's confirmation of it (the ack lets the
        controller remove the link's rules: a confirmation later would be dropped)."""
        left = []
        for i, version in self.rechaining:
            up, down = self.members[i], self.members[i + 1]
            wid = down.fw.worker_id
            sent = up.io.frames_sent(wid)
            if sent == down.io.frames_delivered(up.fw.worker_id) == up.io.frames_confirmed(wid):
                self._link(i)
                up.fw._ack("CHAIN", version)
            else:
                left.append((i, version))
        self.rechaining = left

    def _close_drained(self) -> None:
        """A member drained out of a process that goes on (a chained worker moved, swapped
        or removed live: typhoon.reconfig.chains) closes its transport now: it confirms
        what it consumed and its TAP goes, which its agent waits for before it lets it
        go.  It waits for every sender's end of stream first (a release may reach it after
        the quiet time that ended its input), at most ``LEAVE_WAIT_S``.  Under a
        guarantee a finished worker stays for a rollback: not then."""
        for i, m in enumerate(self.members):
            fw = m.fw
            if i in self.left or not (fw.done and fw.draining) or fw.ckpt is not None:
                continue
            since = self.drained.setdefault(i, time.monotonic())
            if not fw.pending_upstream or time.monotonic() - since > LEAVE_WAIT_S:
                self.left.add(i)
                m.io.linger()
                m.io.close()

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
        for i, io in enumerate(self.links):
            if i in self.left:
                continue
            fd = io.waitable()
            if fd is None:
                return  # something is queued inside a transport already
            fds.append(fd)
        select.select(fds, [], [], timeout)

    def _take(self, i: int, clock: Any) -> None:
        """Member ``i`` takes what its transport holds: data and control."""
        if i in self.left:
            return
        m = self.members[i]
        fw = m.fw
        items = m.io.poll(0)
        fw.start_slice()
        for item in items:
            now = clock()
            for other in self.members:
                other.fw.now = now
            if isinstance(item, ControlTuple):
                if item.type == Control.CHAIN:
                    self._chain_control(i, item)
                else:
                    fw.control(item)
            else:
                fw.deliver(item)

    def _serve_next(self, i: int) -> None:
        """Member ``i`` waits inside its transport (credit, settle): the members after it
        take their input when it reaches them over the network, else ``i`` would wait
        for credit or a confirmation only they can give (one thread runs the process).
        Not the next one when ``i`` calls it (nothing of ``i``'s is on its way there),
        nor one before ``i``, which could call into ``i`` while ``i`` is mid-send;
        after a member left (typhoon.reconfig.chains) ``i`` may send to any later one."""
        for j in range(i + 1, len(self.members)):
            if j in self.serving or j in self.left:
                continue
            if j == i + 1 and self.members[j].fw.worker_id in self.links[i].peers:
                continue
            self.serving.add(j)
            try:
                self._take(j, time.monotonic)
            finally:
                self.serving.discard(j)

    def _turn(self, clock: Any) -> None:
        for i in range(len(self.members)):
            self.serving.add(i)
            try:
                self._take(i, clock)
            finally:
                self.serving.discard(i)
        if self.rechaining:  # no send is under way here, each poll delivered all it took
            self._caught_up()
        self._close_drained()
        for i, m in enumerate(self.members):
            if i in self.left:
                continue
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
            for i, m in enumerate(self.members):
                if i not in self.left:
                    m.fw.flush(force=True)
        except ConnectionError as e:
            error = f"connection lost: {e}"
        except Exception as e:  # an operator (or the framework) raised: every member says so
            error = "".join(traceback.format_exception_only(e)).strip()
            tb = [line for line in traceback.format_exc().splitlines() if line.strip()][-12:]
            log.exception("chain %s failed", [m.spec.worker_id for m in self.members])
        finally:
            for i, m in enumerate(self.members):
                if error is not None:
                    m.error, m.traceback = error, tb
                elif i not in self.left:  # its agent let one that left go already
                    m.say_done()
            for i, m in enumerate(self.members):
                if error is None and i not in self.left:
                    m.io.linger()
                m.write_report()
                m.operator.close()
                if m.fw.ckpt is not None:
                    m.fw.ckpt.close()
                if i not in self.left:
                    m.io.close()

    @property
    def error(self) -> str | None:
        return next((m.error for m in self.members if m.error), None)
