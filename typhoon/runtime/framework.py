"""Framework layer of a worker (paper Fig. 4, middle layer).

Routes what the operator emits, batches it per (receiver, stream) for the I/O
layer, hands arriving tuples to the operator (a whole row batch at once to an
operator that implements ``process_batch``), and applies control tuples
(paper Table 2 plus DRAIN and UPSTREAM) through one code path for every transport.

A batch leaves as row-batch entries (``typhoon.wire.encode_rows``): one msgpack call per entry,
each sized to fit one frame of the transport, so neither end pays a serializer call per tuple.

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
from typing import Any, cast

import msgpack

from typhoon.checkpoint import checkpoint_settings
from typhoon.operators.base import Bolt, Context, Operator, Spout
from typhoon.runtime.checkpoints import LEAVING_PAYLOAD
from typhoon.runtime.columnar import block_rows_of, column_path
from typhoon.runtime.control import ControlHandling
from typhoon.runtime.guarantee import GuaranteedProcessing
from typhoon.runtime.hooks import bind_operator
from typhoon.runtime.keyed_cut import KeyedCheckpoints
from typhoon.runtime.keyed_state import keyed_states
from typhoon.runtime.migration import KeyedMigration
from typhoon.runtime.output import OutputBatching
from typhoon.runtime.output_columns import COLUMN_CHUNK, ColumnOutput
from typhoon.runtime.pairs import pair_stats
from typhoon.runtime.policies import Router
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.timers import Timers
from typhoon.runtime.transport import EOS_STREAM, Inbound, Transport
from typhoon.runtime.upstream_backup import FULL_WAIT_S, UpstreamBackup
from typhoon.runtime.watermarks import WatermarkHandling
from typhoon.topology.routing import Route, routes_for, upstream_of
from typhoon.wire import WireError, entry_capacity, is_block, unpack_rows

log = logging.getLogger(__name__)

EOS_PAYLOAD = msgpack.packb([["eos"]], use_bin_type=True)  # a row batch of one punctuation
DRAIN_QUIET_S = 0.2  # a draining worker finishes after this long without input
SPOUT_CHUNK = 256  # tuples a spout may emit per event-loop turn
# longest stretch of work on queued data before urgent control (METRIC_REQ, ...) is served
SLICE_S = 0.01


class Framework(OutputBatching, ColumnOutput, ControlHandling, GuaranteedProcessing,
                UpstreamBackup, KeyedCheckpoints, KeyedMigration, WatermarkHandling):  # fmt: skip
    """Routing state, batching, control tuples and metrics of one worker.

    Output (:mod:`typhoon.runtime.output`, columns: :mod:`~typhoon.runtime.output_columns`),
    control tuples and metrics (:mod:`typhoon.runtime.control`), guaranteed processing
    (:mod:`typhoon.runtime.guarantee`), key groups that move (:mod:`typhoon.runtime.migration`),
    checkpoints across their moves (:mod:`typhoon.runtime.keyed_cut`) and event-time
    watermarks (:mod:`typhoon.runtime.watermarks`) are mixins, each in its own module.
    """

    # The operator instance's hooks, set by hooks.bind_operator (again on rollback, swap).
    # Optional: pump(emit, input_done) -> True while output that process() did not emit (an
    # engine such as Spark, timers) is in flight; metrics() -> entries for METRIC_RESP;
    # under a guarantee anchor_ready(epoch) -> bool holds an epoch's anchor until the output
    # before it was emitted (called after snapshot(), then each turn until True);
    # rewind(generation, epoch) after restore(); abandon() for an instance a rollback drops.
    _process_batch: Callable[..., Any] | None
    _process_rows: Callable[..., Any] | None
    _next_rows: Callable[..., Any] | None
    _next_columns: Callable[..., Any] | None
    _pump: Callable[..., bool] | None
    _op_metrics: Callable[[], dict[str, Any]] | None
    _anchor_ready: Callable[[int], bool] | None

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
        self.input_node = {s.id: s.src for s in topo.inputs_of(me.node)}  # stream -> sender node
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
        # the only workers data is accepted from: the configured upstream, then what
        # UPSTREAM adds and removes (a receiver must not take data from, say, its own
        # downstream, which the switch's reverse path for credits lets through)
        self.upstream: set[int] = set(self.pending_upstream)
        self.batch_size = spec.batch_size
        self.max_delay = spec.max_delay_ms / 1000.0
        self.out: dict[tuple[int, int], list[list[Any]]] = {}  # rows waiting per (receiver, stream)
        self.out_since: dict[tuple[int, int], float] = {}
        # rows of finished batches, serialized and sent at the end of the turn (push)
        self.ready: dict[tuple[int, int], list[list[Any]]] = {}
        self.ready_since: dict[tuple[int, int], float] = {}  # when each got its oldest rows
        # receivers in this process (a chain, typhoon.runtime.chain): rows go by function call
        self.chained: dict[int, Any] = {}
        self.now = clock()
        # spouts wait for ACTIVATE (paper Table 2): the topology starts when its flows exist
        self.active = not self.is_spout
        self.rate = float(getattr(operator, "rate", 0.0) or 0.0)
        self.tokens, self.last_refill = 0.0, self.now
        self.exhausted = self.draining = False
        self.drain_version, self.last_input = 0, self.now
        self.swapped: list[dict[str, Any]] = []  # operators swapped out in place (SWAP)
        self.done = False
        self.input_done = False
        self.tuples_in: dict[int, int] = {}  # metrics
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
        self.set_batch_size(spec.batch_size)  # and the rows that finish a batch (send_at)
        self.columnar = column_path(topo, node.name, operator)  # streams that declare columns
        self._pump = self._op_metrics = self._anchor_ready = None  # bind_operator sets them
        bind_operator(self, operator)  # and every other hook, process_columns too
        self.pairs = pair_stats(topo, node.name)  # key-pair statistics (opt-in)
        self.keyed = keyed_states(topo, spec.physical, me.worker_id)
        self.context = Context(
            topology=topo.name,
            node=node.name,
            worker_id=me.worker_id,
            index=me.index,
            parallelism=len(spec.physical.active_of_node(node.name)),
            input_fields=self._input_fields(),
            input_nodes={
                s.src: list(topo.nodes[s.src].output_fields) for s in topo.inputs_of(node.name)
            },
            output_fields=list(node.output_fields),
            operator=node.operator,
            keyed=self.keyed,
            keyed_declared=bool(getattr(operator, "keyed", False)),
            timers=Timers(self.keyed, node.operator, node.name),
            guarantee=checkpoint_settings(topo).guarantee,
            emit_columns=self.emit_columns,
        )
        operator.open(self.context)
        self._init_watermarks()
        self._init_migration(store)
        self._init_keyed_cut()
        self._init_guarantee(store)
        self._init_backup()

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
        self._orphan_route(old, router)
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
            self.io.send(dst, EOS_STREAM, [LEAVING_PAYLOAD])
        if released:
            # one-to-many frames still reach a released worker (the switch copies them
            # to the stream's consumers) and travel on another link than the end of
            # stream: once it holds the end of stream, it drops what follows it
            self.io.settle(released)

    # ----- input ---------------------------------------------------------------------------

    def deliver(self, item: Inbound) -> None:
        """Hand arriving tuples to the operator."""
        src = item.src
        if src not in self.upstream:
            # data or punctuation from a worker that is not one of our senders: counted,
            # never processed (docs/security-notes-wire.md); a mark waits for its UPSTREAM
            self._not_upstream(item)
            return
        if item.stream == EOS_STREAM:
            self._punctuation(item)
            return
        if self.ckpt is not None and not self._admit(item):
            return
        if self.moved_to is not None:  # moved: its state (and its senders) left for another
            self.io.stats.drop("moved_away", item.count())
            return
        if src in self.finished_upstream:
            # after its end of stream (a release): one-to-many frames the switch still
            # copies here; the sender no longer counts them as sent to us
            self.io.stats.drop("after_eos", item.count())
            return
        self.last_input = self.now
        if self.wm_in.idle:  # an idle input that sends again holds the watermark again
            self._wm_data_from(src)
        if getattr(self.op, "sees_sender", False):  # a checking sink (key_origins) learns who
            self.op.sender = src  # sent these rows
        if getattr(self.op, "sees_input", False):  # a join learns which input they are on
            self.op.input = self.input_node.get(item.stream, "")
        t0 = time.perf_counter_ns()
        # rows of a chained sender come by function call, the others' entries are decoded
        rows = item.rows if item.rows is not None else self._decode_all(item)
        good = len(rows)
        if rows and (self.holding or self.holding_keys or self.hold_from):
            rows = self._hold(src, rows)  # wait for their state
        n = len(rows)
        step = self._slice_rows(n)
        if step >= n:
            if n:
                self._run(rows)
        else:  # a slow operator: urgent control must not wait for the whole batch
            for i in range(0, n, step):
                self._run(rows[i : i + step])
                self.between_slices()
        self.proc_ns += time.perf_counter_ns() - t0
        self.proc_count += good
        self.in_bytes += sum(map(len, item.payloads))
        self.tuples_in[item.stream] = self.tuples_in.get(item.stream, 0) + good
        key = (src, item.stream)
        self.received_from[key] = self.received_from.get(key, 0) + good
        self.between_slices()

    def _run(self, rows: Any) -> None:
        """The operator on some rows (a whole batch at once where it can) or columns."""
        bolt = cast(Bolt, self.op)  # a spout gets no rows
        if type(rows) is not list:
            cast(Any, self.columnar).process_columns(rows, self.emit)
        elif self.pairs is not None:
            self.pairs.run(rows, bolt.process, self._process_batch, self.emit)
        elif self._process_rows is not None:
            self._process_rows(rows, self.emit_rows)
        elif self._process_batch is not None:
            self._process_batch(rows, self.emit)
        else:
            process, emit = bolt.process, self.emit
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

    def _decode_all(self, item: Inbound) -> Any:
        """The rows of every entry of an arrival, in order, as one batch (or its columns:
        ``typhoon.runtime.columnar``).  An arrival holds data of one sender on one
        stream and nothing else (its punctuation travels on stream 0, control apart),
        so the operator gets it in one call without reordering anything."""
        entries, stream = item.payloads, item.stream
        if self.columnar is not None:  # (not while rows are held or key pairs counted)
            if not (self.pairs or self.holding or self.holding_keys or self.hold_from):
                if (cols := self.columnar.columns(entries, stream, self.io.stats)) is not None:
                    return cols
        if len(entries) == 1:
            return self._decode_entry(entries[0], stream) or []
        batch: list[list[Any]] = []
        for p in entries:
            rows = self._decode_entry(p, stream)
            if rows:
                batch += rows
        return batch

    def _decode_entry(self, entry: bytes, stream: int = 0) -> list[list[Any]] | None:
        """The rows of one row-batch entry; what is not a row is counted and left out.

        ``typhoon.wire.unpack_rows``: as strict as every other decoder (no msgpack
        extension type, at most ``MAX_DEPTH`` deep), at the cost of one C pass over
        the bytes; not ``decode_rows``, which refuses the whole batch for one bad row.
        """
        if is_block(entry):
            return block_rows_of(self.columnar, entry, stream, self.io.stats)
        try:
            rows, good = unpack_rows(entry)
        except WireError:
            self.io.stats.drop("malformed_batch")
            return None
        if good != len(rows):
            kept = [r for r in rows if type(r) is list]
            self.io.stats.drop("malformed_tuple", len(rows) - good)
            return kept
        return rows

    def _eos_from(self, src: int) -> None:
        if self.migration is not None:
            self._handoff_from(src, None, None)  # nothing more comes from it
        self.pending_upstream.discard(src)
        self.finished_upstream.add(src)
        if not self.pending_upstream and not self.is_spout and not self.done:
            log.info("worker %d: every upstream worker finished", self.worker_id)
            self.watermark_input_done()  # +inf: every window closes
            self.end_of_input()
        elif self.wm_in.channels and not self.done:
            self._recompute_watermark()  # a finished link no longer holds it back

    def end_of_input(self) -> None:
        """No more input: finish now, or once the operator's pump has nothing in flight."""
        self.input_done = True
        if self._pump is None and not (self.holding or self.holding_keys or self.hold_from):
            # (else once the moving state came and the tuples held for it ran)
            self.finish()

    # ----- spouts --------------------------------------------------------------------------

    def spout_ready(self) -> bool:
        return self.is_spout and self.active and not self.exhausted and not self.done

    def step_spout(self) -> None:
        """Let the spout emit a chunk, within its input rate."""
        self.flat_out = False
        if not self.spout_ready():
            return
        if self.ckpt is not None:
            self.maybe_anchor()
            if self.backup_full():
                return  # backpressure: emits again once a purge freed its output buffers
        # a columnar source emits blocks (no rows), unless watermarks watch its rows
        columns = self._next_columns if self.wm_gen is None else None
        n = SPOUT_CHUNK if columns is None else COLUMN_CHUNK
        if self.rate > 0:
            elapsed = self.now - self.last_refill
            self.last_refill = self.now
            self.tokens = min(self.tokens + elapsed * self.rate, max(1.0, self.rate * 0.05))
            n = min(n, int(self.tokens))
            if n <= 0:
                return
            self.tokens -= n
        t0 = time.perf_counter_ns()
        if self.wm_gen is not None:
            emit, emit_rows = self.wm_emitters()
            before = sum(r.emitted for r in self.routers.values()) + self.unrouted
        else:
            emit, emit_rows = self.emit, self.emit_rows
        if columns is not None:
            more = columns(self.emit_columns, n)
        elif self._next_rows is not None:
            more = self._next_rows(emit_rows, n)
        else:
            more = cast(Spout, self.op).next_batch(emit, n)
        self.proc_ns += time.perf_counter_ns() - t0
        self.proc_count += n
        if self.wm_gen is not None:
            after = sum(r.emitted for r in self.routers.values()) + self.unrouted
            self.spout_watermark(after > before)
        self.flat_out = bool(more) and self.rate <= 0
        if not more:
            self.exhausted = True
            log.info("worker %d: source exhausted", self.worker_id)
            self.finish()

    def throttle_delay(self) -> float:
        """How long a rate-limited spout has nothing to emit."""
        if not self.spout_ready():
            return 0.05
        if self.ckpt is not None and self.backup_full():
            return FULL_WAIT_S
        if self.rate <= 0 or self.tokens >= 1:
            return 0.0
        return min(0.05, (1 - self.tokens) / self.rate)

    # ----- lifecycle -----------------------------------------------------------------------

    def finish(self) -> None:
        """Flush state and batches, then tell every receiver this link is finished."""
        if self.moved_to is None:  # a moved worker's state is flushed where it went
            self.op.on_signal(self.emit)
        self.flush(force=True)
        # end of stream goes direct: it must not overtake balanced or one-to-many frames
        self.io.drain_balanced()
        targets = sorted(set().union(*self.eos_targets.values())) if self.eos_targets else []
        self.io.settle(targets)
        # drained, or every sender left us (released): this worker leaves for good
        left = self.finished_upstream and self.finished_upstream <= self.left_upstream
        eos = LEAVING_PAYLOAD if self.draining or left else EOS_PAYLOAD
        for dst in targets:
            self.io.send(dst, EOS_STREAM, [eos])
        self.done = True
        if self.draining:
            self._ack("DRAIN", self.drain_version)
        if self.on_finish is not None:
            self.on_finish()  # with a guarantee the worker stays to roll back if asked

    def tick(self) -> None:
        """Periodic work of the event loop: operator pump, batches due, drain completion."""
        if self.migration is not None:
            self.migration_tick()
        if self.wm_gen is not None:
            self.spout_watermark(False)  # a clock, or an idle source, moves without tuples
        if self.ckpt is not None:
            self.poll_complete()
            self.poll_purge()
        if self._pump is not None and not self.done:
            busy = self._pump(self.emit, self.input_done)
            self.owned_watermark()  # behind what the pump emitted
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
