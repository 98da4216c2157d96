"""Control tuples a worker applies (paper Table 2 plus DRAIN and UPSTREAM), and the
metrics that answer METRIC_REQ and fill the run report.

One code path for every transport.  A mixin of
:class:`typhoon.runtime.framework.Framework`, which holds the state it uses
(declared, with the other mixins' methods it calls, in ``framework_parts.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from typhoon.runtime.operator_swap import SwapHost, swap_operator
from typhoon.runtime.transport import Inbound
from typhoon.topology.routing import Route
from typhoon.wire import Control, ControlTuple, wire_metrics

if TYPE_CHECKING:
    from typhoon.runtime.framework_parts import FrameworkParts

log = logging.getLogger(__name__)

SPOUT_ONLY = frozenset({Control.INPUT_RATE, Control.ACTIVATE, Control.DEACTIVATE})


if TYPE_CHECKING:
    _Host = FrameworkParts
else:
    _Host = object  # at run time Framework is the host: nothing to inherit


class ControlHandling(_Host):
    """Control tuples from the controller (or the tcp runner), acks and metrics."""

    # the framework starts these, this part reads and sets them (declared here, not on
    # FrameworkParts: mypy cannot type a protocol member read before a subclass sets it)
    may_exit: bool
    rate: float
    tokens: float
    last_refill: float
    exhausted: bool
    drain_version: int
    last_input: float
    # what the event loop took from the transport at its last poll, and how many of them
    # it handled so far: the rest's data, with the transport's own queue, is the worker's
    # backlog (metrics); summed only when metrics are asked for, not per frame
    taken: Sequence[Inbound | ControlTuple] = ()
    handled: int = 0

    def control(self, ct: ControlTuple) -> None:
        """Apply one control tuple from the controller (or the tcp runner)."""
        t, body = ct.type, ct.body
        if t == Control.ROUTING:
            self.flush(force=True)
            old = self.routers.get(body["stream"])
            self.install_route(Route.from_body(body))
            if "handoff" in body and old is not None and old.hops:
                # behind our last tuple routed with the old key-group table
                self.send_handoffs(body["stream"], body["handoff"], old.hops)
            self.io.routed_to({h for r in self.routers.values() for h in r.hops})
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
            self.upstream.update(add)
            self.upstream.difference_update(body["remove"])
            if self.ckpt is not None:
                self._announced(add, body["remove"])  # marks that came before this
            if self.migration is not None:
                for src in body["remove"]:
                    self._handoff_from(src, None, None)
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
            metrics = self.metrics()
            if body.get("keys") and self.keyed is not None:
                # where keyed state is (a rescale's check): the groups owned, and the keys
                # held per group (one hash per key, so only when asked); metrics hold no
                # lists, so both are maps keyed by group
                keyed = metrics["keyed"]
                keyed["owned"] = {str(g): 1 for g in sorted(self.keyed.owned)}
                keyed["held_groups"] = {str(g): n for g, n in self.keyed.held_groups().items()}
                # keys a direct table names are owned by key, not by group (a locality move)
                keyed["held_pinned"] = self.keyed.held_pinned()
            self.io.reply(
                ControlTuple(
                    Control.METRIC_RESP,
                    {
                        "request_id": body["request_id"],
                        "worker": self.worker_id,
                        "metrics": self.sendable(metrics),
                    },
                )
            )
        elif t in SPOUT_ONLY and not self.is_spout:
            # they pace, start and stop a spout's emission; a bolt's input is paced at its
            # spouts (the REST API refuses them for bolts): counted, never silently taken
            self.io.stats.drop("spout_control_to_bolt")
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
            self.set_batch_size(int(body["size"]))
            self.max_delay = float(body["max_delay_ms"]) / 1000.0
        elif t == Control.ROLLBACK:
            epoch = None if body["epoch"] < 0 else body["epoch"]
            if "replay" in body:  # upstream backup: the receivers roll back, not this worker
                links = body.get("replay_from")
                ok = self.replay(body["generation"], epoch, body["replay"], links)
                self._ack("ROLLBACK" if ok else "REPLAY_REFUSED", body["generation"])
            else:
                self.rollback(body["generation"], epoch)
                self._ack("ROLLBACK", body["generation"])
        elif t == Control.COMPLETE:
            if not self.may_exit:
                self.job_complete()
            self.may_exit = True
        elif t == Control.KEYGROUPS:
            self.keygroups(body)
        elif t == Control.SWAP:  # swap in place (typhoon.runtime.operator_swap)
            why = swap_operator(cast(SwapHost, self), body["operator"], body["args"])
            if why is None:
                self._ack("SWAP", body["version"])
            else:  # never acked: the update times out and is undone
                self.io.stats.drop("swap_refused")
                log.warning("worker %d: SWAP to %s refused: %s", self.worker_id, body, why)
        elif t == Control.DRAIN:
            self.draining = True
            self.drain_version = body["version"]
            self.last_input = self.now
            if self.done:
                # finished already (every sender released us): nothing left to drain.
                # Under a guarantee it stays, waiting for COMPLETE, and would never ack
                self._ack("DRAIN", body["version"])
            elif self.is_spout:
                self.exhausted = True
                self.finish()
        else:
            self.io.stats.drop("unexpected_control")

    def took(self, items: list[Inbound | ControlTuple]) -> None:
        """The event loop took ``items`` from the transport (a list of its own, which the
        transport does not touch again): their data is backlog now, until handled."""
        self.taken = items
        self.handled = 0

    @property
    def taken_bytes(self) -> int:
        """Payload bytes of the data taken and not handled yet.  The item being handled
        still counts: a METRIC_REQ served between slices of its work finds it unfinished."""
        return sum(
            sum(map(len, item.payloads))
            for item in self.taken[self.handled :]
            if isinstance(item, Inbound)
        )

    def sendable(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` as METRIC_RESP carries them; what it cannot carry (an operator's
        ``None``, an object) is left out, counted (``unsendable_metric``) and logged once."""
        clean, dropped = wire_metrics(metrics)
        if dropped:
            if not self.io.stats.drops.get("unsendable_metric"):
                log.warning("worker %d: metrics not sendable: %s", self.worker_id, dropped)
            self.io.stats.drop("unsendable_metric", len(dropped))
        return clean

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
        qbytes = self.io.queue_bytes() + self.taken_bytes  # the whole backlog: load balancer
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
            # rows of a stream that declares columns sent as rows: they did not fit its layout
            "columns_unfit": self.columnar.unfit if self.columnar is not None else 0,
            "columns_in": self.columnar.blocks_in if self.columnar is not None else 0,
            **self._column_metrics(),  # what emit_columns sent as blocks, and as rows
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
            "max_delay_ms": round(self.max_delay * 1000.0, 3),
            "time": time.time(),
            **(self._guarantee_metrics() if self.ckpt is not None else {}),
            **(self._watermark_metrics() if self._event_time() else {}),
            **(self._migration_metrics() if self.keyed is not None else {}),
            **({"moved_to": self.moved_to} if self.moved_to else {}),  # typhoon move
            **(self._op_metrics() if self._op_metrics is not None else {}),
            **(self.pairs.metrics(self.sent_to) if self.pairs is not None else {}),
        }
