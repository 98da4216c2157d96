"""Framework layer of a worker (paper Fig. 4, middle layer).

Routes what the operator emits, batches it per (receiver, stream) for the I/O
layer, hands arriving tuples to the operator (a whole row batch at once to an
operator that implements ``process_batch``), and applies control tuples
(paper Table 2 plus DRAIN and UPSTREAM) through one code path for every
transport.

A batch leaves as row-batch entries (``typhoon.wire.encode_rows``): one msgpack
call per entry, each sized to fit one frame of the transport, so neither end
pays a serializer call per tuple.

End of stream travels in-band: when a sender finishes it sends one EOS
punctuation on reserved stream 0 to every receiver, once the transport confirmed
that the receiver holds every frame sent to it (``Transport.settle``: frames of a
one-to-many stream take another path through the switch than the EOS); a bolt
finishes once every upstream worker has sent EOS.  Every tuple is counted per
link (sender, receiver, stream) on both ends, so the run report can prove that
each link delivered exactly what was sent on it.
Reconfiguration keeps that exact: a ROUTING that takes receivers out may
``release`` them (EOS to each right away), and UPSTREAM tells a worker which
new senders to wait for before any old one releases it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgpack

from typhoon.checkpoint import checkpoint_settings
from typhoon.operators import resolve_operator
from typhoon.operators.base import Context, Operator
from typhoon.runtime import checkpoints as ck
from typhoon.runtime.pairs import pair_stats
from typhoon.runtime.policies import Router
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import EOS_STREAM, Inbound, Transport
from typhoon.topology.model import DEFAULT_STREAM
from typhoon.topology.routing import Route, routes_for, upstream_of
from typhoon.wire import Control, ControlTuple, encode_rows, entry_capacity

log = logging.getLogger(__name__)

EOS_PAYLOAD = msgpack.packb([["eos"]], use_bin_type=True)  # a row batch of one punctuation
DRAIN_QUIET_S = 0.2  # a draining worker finishes after this long without input
SPOUT_CHUNK = 256  # tuples a spout may emit per event-loop turn
ENTRY_FILL = 0.94  # aim a row batch at this share of an entry's room (rows vary in size)
# longest stretch of work on queued data before urgent control (METRIC_REQ, ...) is served
SLICE_S = 0.01


def batch_hook(
    operator: Operator, name: str = "process_batch", plain: str = "process"
) -> Callable[..., Any] | None:
    """The operator's ``process_batch`` (or another batch variant ``name`` of its method
    ``plain``, such as a spout's ``next_rows``), if it is meant for this class's ``plain``.

    A subclass that overrides only ``plain`` must not be bypassed by a batch variant
    it inherited: the hook counts only when it is defined at least as far down the
    class hierarchy as ``plain``.
    """
    mro = type(operator).__mro__

    def depth(attr: str) -> int:
        return next((i for i, c in enumerate(mro) if attr in c.__dict__), len(mro))

    if depth(name) <= depth(plain):
        return getattr(operator, name, None)
    return None


def _rows_in(entry: bytes) -> int:
    """Rows of a row-batch entry, without decoding them (0 if it is not one)."""
    try:
        head = msgpack.Unpacker()
        head.feed(entry[:5])
        return head.read_array_header()
    except Exception:
        return 0


class Framework:
    """Routing state, batching, control tuples and metrics of one worker."""

    def __init__(
        self,
        spec: WorkerSpec,
        operator: Operator,
        transport: Transport,
        clock: Callable[[], float] = time.monotonic,
        store: Any = None,
    ) -> None:
        me = spec.assignment
        topo = spec.topology
        node = topo.nodes[me.node]
        self.spec = spec
        self.op = operator
        self.io = transport
        self.clock = clock
        self.worker_id = me.worker_id
        self.node = node
        self.is_spout = node.kind == "spout"
        self.stream_names = {s.id: s.name for s in topo.outputs_of(me.node)}
        self.routers: dict[int, Router] = {}
        self.routes: dict[str, list[Router]] = {}
        # every receiver a stream ever had: each must get end of stream, even one that a
        # ROUTING update took out of the next hops (it may still wait for our EOS)
        self.eos_targets: dict[int, set[int]] = {}
        for route in routes_for(topo, spec.physical, me.worker_id):
            self.install_route(route)
        upstream = upstream_of(topo, spec.physical, me.worker_id)
        self.pending_upstream: set[int] = {w for ws in upstream.values() for w in ws}
        self.finished_upstream: set[int] = set()
        self.batch_size = spec.batch_size
        self.max_delay = spec.max_delay_ms / 1000.0
        self.out: dict[tuple[int, int], list[list]] = {}  # rows waiting per (receiver, stream)
        self.out_since: dict[tuple[int, int], float] = {}
        # rows of finished batches, serialized and sent at the end of the turn (push)
        self.ready: dict[tuple[int, int], list[list]] = {}
        self.now = clock()
        # spouts wait for ACTIVATE (paper Table 2): the topology starts when its flows exist
        self.active = not self.is_spout
        self.rate = float(getattr(operator, "rate", 0.0) or 0.0)
        self.tokens = 0.0
        self.last_refill = self.now
        self.exhausted = False
        self.draining = False
        self.drain_version = 0
        self.last_input = self.now
        self.done = False
        # Optional operator hooks, for output that process() does not emit (an external
        # engine such as Spark, timers): pump(emit, input_done) -> True while output is still
        # in flight (the worker finishes only after that); metrics() -> entries for METRIC_RESP.
        self._pump = getattr(operator, "pump", None)
        self._op_metrics = getattr(operator, "metrics", None)
        # Under a guarantee, an operator whose output comes from such an engine may hold an
        # epoch's anchor until the output that belongs before it has been emitted:
        # anchor_ready(epoch) -> bool, called once right after snapshot() for the epoch, then
        # every turn for the oldest held epoch until True.  rewind(generation, epoch) tells it
        # the job went back to epoch (None: the start), after restore(); abandon() replaces
        # close() for an instance a rollback drops (nothing of it is final).
        self._anchor_ready = getattr(operator, "anchor_ready", None)
        self.input_done = False
        # metrics
        self.tuples_in: dict[int, int] = {}
        # tuples per link, for the run report: (receiver, stream) and (sender, stream)
        self.sent_to: dict[tuple[int, int], int] = {}
        self.received_from: dict[tuple[int, int], int] = {}
        self.sent_balanced: dict[int, int] = {}  # stream -> tuples to its LB address
        self.serializations = 0
        self.unrouted = 0
        self.proc_ns = 0
        self.proc_count = 0
        self.in_bytes = 0
        # urgent control tuples go ahead of queued data: served between slices of
        # SLICE_S of work on it (docs/flow_control.md), and while a send waits for credit
        self.slice_ns = int(SLICE_S * 1e9)
        self.slice_end = 0
        transport.on_urgent = self.control
        self.entry_cap = entry_capacity(transport.mtu)
        self.rows_per_entry = 512  # learnt from what the entries came to (see _entries)
        self._process_batch = batch_hook(operator)
        self.pairs = pair_stats(topo, node.name)  # key-pair statistics (opt-in)
        self._next_rows = batch_hook(operator, "next_rows", "next_batch")
        self.context = Context(
            topology=topo.name,
            node=node.name,
            worker_id=me.worker_id,
            index=me.index,
            parallelism=len(spec.physical.active_of_node(node.name)),
            input_fields=self._input_fields(),
            output_fields=list(node.output_fields),
        )
        operator.open(self.context)
        self._init_guarantee(store)

    def _input_fields(self) -> list[str]:
        ins = self.spec.topology.inputs_of(self.node.name)
        return list(self.spec.topology.nodes[ins[0].src].output_fields) if ins else []

    # ----- routing -------------------------------------------------------------------------

    def install_route(self, route: Route) -> None:
        """Replace one output stream's routing state (ROUTING control tuple)."""
        name = self.stream_names.get(route.stream)
        if name is None:
            raise ValueError(f"stream {route.stream} is not an output of node {self.node.name}")
        old = self.routers.get(route.stream)
        if route.balanced is None:
            # only the load-balancer app switches a stream between worker and LB addresses
            route.balanced = bool(old and old.route.balanced)
        if route.policy == "sdn" and route.balanced:
            self.io.set_balanced(route.stream, route.next_hops)
        router = Router(route, old.emitted if old else 0, self.io.switch_balancing)
        self.routers[route.stream] = router
        self.eos_targets.setdefault(route.stream, set()).update(route.next_hops)
        if getattr(self, "ckpt", None) is not None and self.gen > 0 and self.started:
            new = sorted(set(route.next_hops) - self.marked)
            if new:
                self._mark(new)  # a receiver added after our rollback learns our generation
        self.routes[name] = [
            self.routers[s] for s, n in self.stream_names.items() if n == name and s in self.routers
        ]

    def release(self, workers: list[int] | tuple[int, ...]) -> None:
        """Send end of stream now to receivers no route includes any more, and forget them.

        A reconfiguration that removes a receiver asks for this after the routes
        changed: the end of stream follows our last tuple on the link, so the
        receiver knows exactly when nothing more will come from us.
        """
        self.push()  # what is serialized goes before the end of stream
        routed = {h for r in self.routers.values() for h in r.hops}
        known = set().union(*self.eos_targets.values()) if self.eos_targets else set()
        released = sorted((set(workers) & known) - routed)
        if released:
            self.io.drain_balanced()  # a released worker may still get balanced frames of ours
            self.io.settle(released)
        for dst in released:
            for targets in self.eos_targets.values():
                targets.discard(dst)
            self.io.send(dst, EOS_STREAM, [EOS_PAYLOAD])
        if released:
            # one-to-many frames still reach a released worker (the switch copies them
            # to the stream's consumers) and travel on another link than the end of
            # stream: once it holds the end of stream, it drops what follows it
            self.io.settle(released)

    def emit(self, values: list, stream: str = DEFAULT_STREAM) -> None:
        """Route one tuple from the operator (called on the hot path)."""
        routers = self.routes.get(stream)
        if not routers:
            self.unrouted += 1
            return
        for r in routers:
            sid = r.route.stream
            r.emitted += 1
            if r.plain:  # unicast, receiver chosen here: the common case, _buffer inlined
                dst = r.select(values)
                if dst < 0:
                    self.unrouted += 1
                    continue
                self.serializations += 1
                key = (dst, sid)
                buf = self.out.get(key)
                if buf is None:
                    buf = self.out[key] = []
                    self.out_since[key] = self.now
                buf.append(values)
                if len(buf) >= self.batch_size:
                    self._send(key, buf)
                    del self.out[key]
                    del self.out_since[key]
                continue
            if r.broadcast:
                self._broadcast(r, values, sid)
                continue
            # r.switched: one serialization; the switch's select group picks the worker
            self.serializations += 1
            self._buffer((-1 - r.route.lb_node, sid), values)

    def emit_rows(self, rows: list[list], stream: str = DEFAULT_STREAM) -> None:
        """Route several tuples at once: the same effect as :meth:`emit` on each row in
        order, with the per-tuple work of the common policies done per list.

        Round-robin and single-receiver policies deal the rows out by slices (row i
        goes where the i-th call of ``emit`` would have sent it); the others route
        row by row.
        """
        n = len(rows)
        if not n:
            return
        routers = self.routes.get(stream)
        if not routers:
            self.unrouted += n
            return
        for r in routers:
            sid = r.route.stream
            if r.plain:
                hops = r.dealt(n)
                if hops is None:  # a policy that looks at the values
                    emit = self.emit_one
                    for values in rows:
                        emit(r, values)
                    continue
                r.emitted += n
                if not hops:
                    self.unrouted += n
                    continue
                self.serializations += n
                k = len(hops)
                for j, dst in enumerate(hops):
                    self._buffer_rows((dst, sid), rows if k == 1 else rows[j::k])
                continue
            r.emitted += n
            if r.broadcast:
                if self.io.multicast:
                    self.serializations += n
                    self._buffer_rows((0, sid), rows)
                else:
                    for dst in r.hops:
                        self.serializations += n
                        self._buffer_rows((dst, sid), rows)
                continue
            self.serializations += n
            self._buffer_rows((-1 - r.route.lb_node, sid), rows)

    def emit_one(self, r: Router, values: list) -> None:
        """:meth:`emit` for one router of a stream (a unicast policy)."""
        r.emitted += 1
        dst = r.select(values)
        if dst < 0:
            self.unrouted += 1
            return
        self.serializations += 1
        self._buffer((dst, r.route.stream), values)

    def _buffer_rows(self, key: tuple[int, int], rows: list[list]) -> None:
        """:meth:`_buffer` for several rows: the open batch is filled first, then every
        whole batch is finished in one :meth:`_send` (it only counts rows and queues
        them for :meth:`push`), and what is left opens the next batch."""
        size = self.batch_size
        n = len(rows)
        i = 0
        buf = self.out.get(key)
        if buf is not None:
            i = max(1, size - len(buf))  # (a BATCH control may have shrunk the size)
            buf.extend(rows[:i])
            if len(buf) < size:
                return
            self._send(key, buf)
            del self.out[key]
            del self.out_since[key]
            if i >= n:
                return
        rest = n - i
        full = rest - rest % size
        if full:
            self._send(key, rows[i : i + full])
            i += full
        if i < n:
            self.out[key] = rows[i:]
            self.out_since[key] = self.now

    def _broadcast(self, r: Router, values: list, sid: int) -> None:
        if self.io.multicast:
            # one serialization; the switch copies the frame to every receiver
            self.serializations += 1
            self._buffer((0, sid), values)
            return
        for dst in r.hops:
            # Storm-like baseline: one serialization per destination
            self.serializations += 1
            self._buffer((dst, sid), values)

    def _buffer(self, key: tuple[int, int], values: list) -> None:
        buf = self.out.get(key)
        if buf is None:
            buf = self.out[key] = []
            self.out_since[key] = self.now
        buf.append(values)
        if len(buf) >= self.batch_size:
            self._send(key, buf)
            del self.out[key]
            del self.out_since[key]

    def _entries(self, rows: list[list]) -> list[bytes]:
        """Serialize ``rows`` as row-batch entries that each fit one frame.

        One msgpack call per entry.  How many rows fit is learnt from the sizes
        the entries came to; an entry that came out too big is cut and packed
        again (rare), and a single row too big for a frame travels segmented.
        """
        pack, cap = encode_rows, self.entry_cap
        n = len(rows)
        if n <= self.rows_per_entry:
            data = pack(rows)
            if len(data) <= cap or n == 1:
                if n > 8:
                    self._learn(len(data), n)
                return [data]
        out: list[bytes] = []
        i = 0
        while i < n:
            k = min(n - i, self.rows_per_entry)
            data = pack(rows[i : i + k])
            while len(data) > cap and k > 1:
                k = max(1, min(k - 1, int(k * cap * ENTRY_FILL / len(data))))
                data = pack(rows[i : i + k])
            if k > 8 or i + k < n:
                self._learn(len(data), k)
            out.append(data)
            i += k
        return out

    def _learn(self, size: int, rows: int) -> None:
        self.rows_per_entry = max(1, int(self.entry_cap * ENTRY_FILL * rows / max(1, size)))

    def _send(self, key: tuple[int, int], rows: list[list]) -> None:
        """A batch is finished: it leaves at :meth:`push`, with the turn's others."""
        dst, sid = key
        n = len(rows)
        sent = self.sent_to
        if dst > 0:
            sent[key] = sent.get(key, 0) + n
        elif dst == 0:
            for h in self.routers[sid].hops:
                sent[(h, sid)] = sent.get((h, sid), 0) + n
        else:
            self.sent_balanced[sid] = self.sent_balanced.get(sid, 0) + n
        ready = self.ready.get(key)
        if ready is None:
            self.ready[key] = rows
        else:
            ready.extend(rows)

    def push(self) -> None:
        """Hand the I/O layer every batch finished since the last push, one call per
        (receiver, stream): small batches of one event-loop turn share entries, frames
        and writes instead of taking one each, without waiting for anything."""
        if not self.ready:
            return
        ready, self.ready = self.ready, {}
        io = self.io
        for (dst, sid), rows in ready.items():
            entries = self._entries(rows)
            if dst > 0:
                io.send(dst, sid, entries)
            elif dst == 0:
                io.send_group(sid, self.routers[sid].hops, entries)
            else:
                io.send_balanced(sid, -1 - dst, self.routers[sid].lb_slot(), entries)

    def flush(self, force: bool = False) -> None:
        """Send every batch older than the max delay (or all of them), and what is ready."""
        if self.out:
            limit = self.now - self.max_delay
            for key in [k for k, t in self.out_since.items() if force or t <= limit]:
                self._send(key, self.out.pop(key))
                del self.out_since[key]
        self.push()

    def next_deadline(self) -> float:
        """Seconds until the oldest batch must go out (for the poll timeout)."""
        if not self.out_since:
            return 0.05
        return max(0.0, min(self.out_since.values()) + self.max_delay - self.now)

    # ----- input ---------------------------------------------------------------------------

    def deliver(self, item: Inbound) -> None:
        """Hand arriving tuples to the operator."""
        if item.stream == EOS_STREAM:
            self._punctuation(item)
            return
        src = item.src
        if self.ckpt is not None and not self._admit(item):
            return
        if src in self.finished_upstream:
            # after its end of stream (a release): one-to-many frames the switch still
            # copies here; the sender no longer counts them as sent to us
            self.io.stats.drop("after_eos", sum(map(_rows_in, item.payloads)))
            return
        self.last_input = self.now
        if src not in self.pending_upstream:
            # a sender added at run time (scale-up): wait for its end of stream too
            self.pending_upstream.add(src)
        good = 0
        t0 = time.perf_counter_ns()
        for p in item.payloads:
            rows = self._decode_entry(p)
            if rows is None:
                continue
            n = len(rows)
            step = self._slice_rows(n)
            if step >= n:
                self._run(rows)
            else:  # a slow operator: urgent control must not wait for the whole entry
                for i in range(0, n, step):
                    self._run(rows[i : i + step])
                    self.between_slices()
            good += n
        self.proc_ns += time.perf_counter_ns() - t0
        self.proc_count += good
        self.in_bytes += sum(map(len, item.payloads))
        self.tuples_in[item.stream] = self.tuples_in.get(item.stream, 0) + good
        key = (src, item.stream)
        self.received_from[key] = self.received_from.get(key, 0) + good
        self.between_slices()

    def _run(self, rows: list[list]) -> None:
        """The operator on some rows (a whole batch at once where it can)."""
        if self.pairs is not None:
            self.pairs.run(rows, self.op.process, self._process_batch, self.emit)
        elif self._process_batch is not None:
            self._process_batch(rows, self.emit)
        else:
            process, emit = self.op.process, self.emit
            for values in rows:
                process(values, emit)

    def _slice_rows(self, n: int) -> int:
        """Rows the operator gets through in one slice, from its cost so far (``n``: all)."""
        count = self.proc_count
        if count < 32:  # the cost is not known yet
            return n
        per_row = self.proc_ns / count
        if per_row * n <= self.slice_ns:
            return n
        # half a slice: a check falls within every slice however the chunks line up
        return max(1, int(self.slice_ns / 2 / per_row))

    # ----- urgent control between slices ---------------------------------------------------

    def start_slice(self) -> None:
        """A slice of work begins (the event loop got a new batch from the transport)."""
        self.slice_end = time.perf_counter_ns() + self.slice_ns

    def between_slices(self) -> None:
        """Serve the urgent control tuples that arrived, once per slice of work."""
        if time.perf_counter_ns() < self.slice_end:
            return
        for ct in self.io.urgent_controls():
            self.control(ct)
        self.start_slice()

    def _decode_entry(self, entry: bytes) -> list[list] | None:
        """The rows of one row-batch entry; what is not a row is counted and left out.

        Not ``typhoon.wire.decode_rows``: its scan for msgpack timestamps costs ~15 µs
        per 6 KB entry (three substring searches), more than the decoding itself.
        """
        try:
            rows = msgpack.unpackb(entry, raw=False, strict_map_key=False)
        except Exception:  # msgpack raises several types for garbage
            self.io.stats.drop("malformed_batch")
            return None
        if type(rows) is not list:
            self.io.stats.drop("malformed_batch")
            return None
        if not all([type(r) is list for r in rows]):
            kept = [r for r in rows if type(r) is list]
            self.io.stats.drop("malformed_tuple", len(rows) - len(kept))
            return kept
        return rows

    def _eos_from(self, src: int) -> None:
        self.pending_upstream.discard(src)
        self.finished_upstream.add(src)
        if not self.pending_upstream and not self.is_spout and not self.done:
            log.info("worker %d: every upstream worker finished", self.worker_id)
            self.end_of_input()

    def end_of_input(self) -> None:
        """No more input: finish now, or once the operator's pump has nothing in flight."""
        self.input_done = True
        if self._pump is None:
            self.finish()

    # ----- spouts --------------------------------------------------------------------------

    def spout_ready(self) -> bool:
        return self.is_spout and self.active and not self.exhausted and not self.done

    def step_spout(self) -> None:
        """Let the spout emit a chunk, within its input rate."""
        if not self.spout_ready():
            return
        if self.ckpt is not None:
            self.maybe_anchor()
        n = SPOUT_CHUNK
        if self.rate > 0:
            elapsed = self.now - self.last_refill
            self.last_refill = self.now
            self.tokens = min(self.tokens + elapsed * self.rate, max(1.0, self.rate * 0.05))
            n = min(n, int(self.tokens))
            if n <= 0:
                return
            self.tokens -= n
        t0 = time.perf_counter_ns()
        if self._next_rows is not None:
            more = self._next_rows(self.emit_rows, n)
        else:
            more = self.op.next_batch(self.emit, n)
        self.proc_ns += time.perf_counter_ns() - t0
        self.proc_count += n
        if not more:
            self.exhausted = True
            log.info("worker %d: source exhausted", self.worker_id)
            self.finish()

    def throttle_delay(self) -> float:
        """How long a rate-limited spout has nothing to emit."""
        if not self.spout_ready():
            return 0.05
        if self.rate <= 0 or self.tokens >= 1:
            return 0.0
        return min(0.05, (1 - self.tokens) / self.rate)

    # ----- lifecycle -----------------------------------------------------------------------

    def finish(self) -> None:
        """Flush state and batches, then tell every receiver this link is finished."""
        self.op.on_signal(self.emit)
        self.flush(force=True)
        # end of stream goes direct: it must not overtake balanced or one-to-many frames
        self.io.drain_balanced()
        targets = sorted(set().union(*self.eos_targets.values())) if self.eos_targets else []
        self.io.settle(targets)
        for dst in targets:
            self.io.send(dst, EOS_STREAM, [EOS_PAYLOAD])
        self.done = True
        if self.draining:
            self._ack("DRAIN", self.drain_version)
        if self.on_finish is not None:
            self.on_finish()  # with a guarantee the worker stays to roll back if asked

    def tick(self) -> None:
        """Periodic work of the event loop: operator pump, batches due, drain completion."""
        if self._pump is not None and not self.done:
            busy = self._pump(self.emit, self.input_done)
            if self.deferred:
                self._release_anchors()
            if self.input_done and not busy and not self.deferred:
                self.finish()
        self.flush()
        if (
            self.draining
            and not self.done
            and not self.input_done
            and self.now - self.last_input >= DRAIN_QUIET_S
        ):
            self.end_of_input()

    # ----- control tuples ------------------------------------------------------------------

    def control(self, ct: ControlTuple) -> None:
        """Apply one control tuple from the controller (or the tcp runner)."""
        t, body = ct.type, ct.body
        if t == Control.ROUTING:
            self.flush(force=True)
            self.install_route(Route.from_body(body))
            self.release(body.get("release", ()))
            self._ack("ROUTING", body["version"])
        elif t == Control.UPSTREAM:
            # a sender that released us earlier and now routes to us again starts over,
            # unless the body says it is only a reminder of who sends (reopen false)
            add = set(body["add"])
            if body.get("reopen", True):
                self.finished_upstream.difference_update(add)
            self.pending_upstream.update(add - self.finished_upstream)
            self.pending_upstream.difference_update(body["remove"])
            self._ack("UPSTREAM", body["version"])
            if self.ckpt is not None:
                self._align()  # a removed sender's anchor is no longer awaited
            if body["remove"] and not self.pending_upstream and not self.is_spout:
                # the senders we still waited for left without end of stream: input is done
                if not self.done and not self.input_done:
                    self.end_of_input()
        elif t == Control.SIGNAL:
            self.op.on_signal(self.emit)
            self.flush(force=True)
            self._ack("SIGNAL", body["version"])
        elif t == Control.METRIC_REQ:
            self.io.reply(
                ControlTuple(
                    Control.METRIC_RESP,
                    {
                        "request_id": body["request_id"],
                        "worker": self.worker_id,
                        "metrics": self.metrics(),
                    },
                )
            )
        elif t == Control.INPUT_RATE:
            self.rate = float(body["rate"])
            self.tokens = 0.0
            self.last_refill = self.now
        elif t == Control.ACTIVATE:
            self.active = True
            self.last_refill = self.now
        elif t == Control.DEACTIVATE:
            self.active = False
        elif t == Control.FLOW_CONTROL:
            self.io.set_budget(int(body["budget"]))
        elif t == Control.BATCH_SIZE:
            self.batch_size = int(body["size"])
            self.max_delay = float(body["max_delay_ms"]) / 1000.0
        elif t == Control.ROLLBACK:
            epoch = body["epoch"]
            self.rollback(body["generation"], None if epoch < 0 else epoch)
            self._ack("ROLLBACK", body["generation"])
        elif t == Control.COMPLETE:
            self.may_exit = True
        elif t == Control.DRAIN:
            self.draining = True
            self.drain_version = body["version"]
            self.last_input = self.now
            if self.is_spout:
                self.exhausted = True
                self.finish()
        else:
            self.io.stats.drop("unexpected_control")

    def _ack(self, what: str, version: int) -> None:
        self.io.reply(
            ControlTuple(
                Control.METRIC_RESP,
                {
                    "request_id": version,
                    "worker": self.worker_id,
                    "metrics": {"ack": what, "version": version},
                },
            )
        )

    # ----- guaranteed processing (typhoon.runtime.checkpoints, docs/guarantees.md) ---------

    def _init_guarantee(self, store: Any = None) -> None:
        """Checkpoint state; a worker started by a recovery restores its epoch here."""
        settings = checkpoint_settings(self.spec.topology)
        self.guarantee = settings.guarantee
        self.ckpt: ck.Checkpointer | None = None
        self.may_exit = True  # False while a finished worker may still have to roll back
        self.on_finish: Callable[[], None] | None = None
        self.gen = 0
        self.epoch: int | None = None  # newest epoch this worker checkpointed or restored
        self.discarded = 0  # rows of older generations dropped after a rollback
        self.rollbacks = 0
        self.started = False
        self.deferred: list[int] = []  # checkpointed epochs whose anchor the operator holds
        if self.guarantee == "none":
            return
        me = self.spec.assignment
        self.ckpt = ck.Checkpointer(
            settings.store_url, self.spec.topology.name, f"{me.node}-{me.index}", store
        )
        self.may_exit = False
        self.aligned = self.guarantee == "exactly_once"
        self.interval = settings.interval_ms / 1000.0
        self.next_anchor_at = self.now + self.interval
        self.link_gen: dict[int, int] = {}  # sender -> generation its link is in
        self.anchors: dict[int, set[int]] = {}  # epoch -> senders whose anchor arrived
        self.blocked: set[int] = set()  # senders past an anchor we are aligning (held)
        self.held: list[Inbound] = []
        self.marked: set[int] = set()  # receivers told our generation
        phys = self.spec.physical
        if phys.generation > 0:
            # a replacement written by a recovery: start in its generation, from its epoch
            self.gen = phys.generation
            self._restore(phys.restore_epoch)

    def start(self) -> None:
        """The I/O layer is up: a worker started by a recovery tells its receivers."""
        self.started = True
        if self.ckpt is not None and self.gen > 0:
            self._mark(self._targets())

    def _targets(self) -> list[int]:
        return sorted(set().union(*self.eos_targets.values())) if self.eos_targets else []

    def _admit(self, item: Inbound) -> bool:
        """Data of the current generation, not behind an anchor being aligned."""
        src = item.src
        if self.link_gen.get(src, 0) != self.gen:
            self.discarded += sum(map(_rows_in, item.payloads))
            return False
        if src in self.blocked:
            self.held.append(item)
            return False
        return True

    def _punctuation(self, item: Inbound) -> None:
        src = item.src
        for p in item.payloads:
            kind, a, b = ck.punctuation(p)
            if self.ckpt is None:
                if kind in ("eos", ""):  # without a guarantee stream 0 carries only EOS
                    self._eos_from(src)
                continue
            if kind == "mark":
                self._mark_from(src, a, None if b < 0 else b)
                continue
            if self.link_gen.get(src, 0) != self.gen:
                continue  # an older generation's punctuation: rolled back
            if src in self.blocked:
                self.held.append(Inbound(src, EOS_STREAM, [p]))
            elif kind == "anchor":
                self._anchor_from(src, a)
            elif kind == "eos":
                self._eos_from(src)
                self._align()
            else:
                self.io.stats.drop("malformed_punctuation")

    def _anchor_from(self, src: int, epoch: int) -> None:
        if self.epoch is not None and epoch <= self.epoch:
            return
        self.anchors.setdefault(epoch, set()).add(src)
        if self.aligned:
            self.blocked.add(src)
        self._align()

    def _align(self) -> None:
        """Checkpoint each epoch whose anchor came from every input still sending."""
        while self.anchors:
            epoch = min(self.anchors)
            if self.pending_upstream - self.anchors[epoch]:
                return
            del self.anchors[epoch]
            self._checkpoint(epoch)
            self.blocked.clear()
            held, self.held = self.held, []
            for it in held:
                self.deliver(it)

    def _checkpoint(self, epoch: int) -> None:
        """Write the state of ``epoch`` and pass the anchor on behind our output."""
        assert self.ckpt is not None
        self.flush(force=True)
        state: dict[str, Any] = {
            "epoch": epoch,
            "generation": self.gen,
            "worker": self.worker_id,
            "state": self.op.snapshot(),
        }
        if self.is_spout:
            state["offset"] = self.op.offset()
            state["exhausted"] = self.exhausted
        self.ckpt.save(epoch, state)
        self.epoch = epoch
        if self._anchor_ready is None:
            self._broadcast_punctuation(ck.anchor_payload(epoch), self._targets())
            return
        self.deferred.append(epoch)
        self._anchor_ready(epoch)  # the operator learns the epoch of the snapshot just taken
        self._release_anchors()

    def _release_anchors(self) -> None:
        """Pass on each held anchor, oldest first, once the operator emitted what precedes it."""
        assert self._anchor_ready is not None
        while self.deferred and self._anchor_ready(self.deferred[0]):
            epoch = self.deferred.pop(0)
            self.flush(force=True)
            self._broadcast_punctuation(ck.anchor_payload(epoch), self._targets())

    def _broadcast_punctuation(self, payload: bytes, targets: list[int]) -> None:
        """One punctuation to each receiver, after and before every data path to it.

        Frames of one-to-many and balanced streams take other paths than a unicast
        punctuation: settling before means none of ours sent earlier comes after it,
        settling after means none sent later comes before it."""
        if not targets:
            return
        # unicast links deliver in order: only other paths need the (blocking) settles
        other_paths = any(not r.plain for r in self.routers.values())
        if other_paths:
            self.io.drain_balanced()
            self.io.settle(targets)
        for dst in targets:
            self.io.send(dst, EOS_STREAM, [payload])
        if other_paths:
            self.io.settle(targets)

    def maybe_anchor(self) -> None:
        """A source starts the next epoch every ``checkpoint_interval_ms``."""
        if self.now < self.next_anchor_at:
            return
        self.next_anchor_at = self.now + self.interval
        base = self.gen * ck.EPOCHS_PER_GENERATION
        self._checkpoint(max(base, self.epoch or 0) + 1)

    def _mark(self, targets: list[int]) -> None:
        self.marked.update(targets)
        self._broadcast_punctuation(ck.mark_payload(self.gen, self.epoch), targets)

    def _mark_from(self, src: int, gen: int, epoch: int | None) -> None:
        if gen > self.gen:
            self.rollback(gen, epoch)
        if gen >= self.link_gen.get(src, 0):
            self.link_gen[src] = gen

    def rollback(self, gen: int, epoch: int | None) -> None:
        """Go back to the global checkpoint ``epoch`` (None: the start) as generation ``gen``.

        Everything since is redone: output not sent yet is dropped, the operator is
        built again from its checkpointed state, a source seeks back, every sender
        is waited for again, and each receiver is told (mark) so that it drops what
        is still in flight from before.
        """
        if self.ckpt is None or gen <= self.gen:
            return
        log.info("worker %d: rollback to epoch %s as generation %d", self.worker_id, epoch, gen)
        self.rollbacks += 1
        self.gen = gen
        self.out.clear()
        self.out_since.clear()
        self.ready.clear()
        self.anchors.clear()
        self.blocked.clear()
        self.held = []
        self.deferred.clear()
        self.pending_upstream |= self.finished_upstream
        self.finished_upstream.clear()
        # end of stream goes to today's receivers: dead ones were routed around
        self.eos_targets = {sid: set(r.hops) for sid, r in self.routers.items()}
        self.done = self.input_done = self.exhausted = False
        self.may_exit = False
        # per-link counts start over (the run report compares this generation's links);
        # tuples in and out keep counting: rates include what is replayed
        self.sent_to.clear()
        self.received_from.clear()
        self.sent_balanced.clear()
        old = self.op
        try:  # before the new instance opens: it may take over what the old one held
            getattr(old, "abandon", old.close)()
        except Exception:  # the old instance is gone either way
            log.exception("worker %d: closing the rolled-back operator", self.worker_id)
        node = self.node
        self.op = resolve_operator(node.operator, node.engine)(**node.args)
        self.op.open(self.context)
        self._process_batch = batch_hook(self.op)
        self._next_rows = batch_hook(self.op, "next_rows", "next_batch")
        self._pump = getattr(self.op, "pump", None)
        self._op_metrics = getattr(self.op, "metrics", None)
        self._anchor_ready = getattr(self.op, "anchor_ready", None)
        self._restore(epoch)
        self.next_anchor_at = self.now + self.interval
        if self.started:
            self._mark(self._targets())

    def _restore(self, epoch: int | None) -> None:
        self.epoch = epoch
        if epoch is not None:
            assert self.ckpt is not None
            saved = self.ckpt.load(epoch)
            self.op.restore(saved.get("state"))
            if self.is_spout:
                self.op.seek(saved.get("offset"))
        rewind = getattr(self.op, "rewind", None)
        if rewind is not None:
            rewind(self.gen, epoch)

    # ----- metrics -------------------------------------------------------------------------

    def link_counts(self) -> dict[str, Any]:
        """Tuples per link on both ends, and what the transport's links did (run report)."""
        return {
            "out": {f"{d}:{s}": n for (d, s), n in sorted(self.sent_to.items())},
            "in": {f"{src}:{s}": n for (src, s), n in sorted(self.received_from.items())},
            "balanced_out": {str(s): n for s, n in sorted(self.sent_balanced.items())},
            "transport": self.io.link_stats(),
        }

    def metrics(self) -> dict[str, Any]:
        """Worker statistics for METRIC_RESP and the run report."""
        st = self.io.stats
        qbytes = self.io.queue_bytes()
        avg = self.in_bytes / max(1, sum(self.tuples_in.values()))
        return {
            "node": self.node.name,
            "in": {str(k): v for k, v in self.tuples_in.items()},
            "out": {str(k): r.emitted for k, r in self.routers.items() if r.emitted},
            "queue_bytes": qbytes,
            "queue": int(qbytes / avg) if avg else 0,
            "proc_us": (self.proc_ns / self.proc_count / 1000.0) if self.proc_count else 0.0,
            "proc_s": self.proc_ns / 1e9,  # operator time in all (busy time)
            "serializations": self.serializations,
            "unrouted": self.unrouted,
            "frames_in": st.frames_in,
            "frames_out": st.frames_out,
            "bytes_in": st.bytes_in,
            "bytes_out": st.bytes_out,
            "seq_gaps": st.seq_gaps,
            "retransmitted": st.retransmitted,
            "credit_stalls": st.credit_stalls,
            # sdn streams sent to the load-balancer address (the LB app checks its switch took)
            "balanced": {
                str(sid): 1
                for sid, r in self.routers.items()
                if r.route.policy == "sdn" and r.route.balanced
            },
            "lb": self.io.balanced_stats(),
            "drops": dict(st.drops),
            "active": int(self.active),
            "done": int(self.done),
            "rate": self.rate,
            "batch_size": self.batch_size,
            "time": time.time(),
            **(self._guarantee_metrics() if self.ckpt is not None else {}),
            **(self._op_metrics() if self._op_metrics is not None else {}),
            **(self.pairs.metrics(self.sent_to) if self.pairs is not None else {}),
        }

    def _guarantee_metrics(self) -> dict[str, Any]:
        assert self.ckpt is not None
        return {
            **self.ckpt.metrics(),
            "generation": self.gen,
            "discarded": self.discarded,
            "rollbacks": self.rollbacks,
            "held": len(self.held),
            "anchors_held": len(self.deferred),
        }
