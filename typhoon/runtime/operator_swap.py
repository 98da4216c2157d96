"""Swap in place: a worker's operator is replaced inside its process (SWAP control tuple).

``typhoon swap`` of a node whose workers run in chain processes
(``typhoon.reconfig.swap_in_place``) keeps each worker, its ID, transport, routes,
credit and link counters, and the chain's function calls; only the operator
instance changes, at one point of the worker's input: every tuple delivered before
the SWAP went to the old instance, every one after it goes to the new one (each
sender's tuples arrive in order, so the cut is consistent per link, as the
senders' ROUTING of a swap on the network is).  The old instance ends as a drained
worker's would: ``on_signal`` flushes its state behind what it emitted, its
``result()`` goes into the worker's report under ``swapped`` (the run report merges
it into the node's result like a drained worker's), then ``close()``.  The new
instance starts empty, like a new worker of a swap on the network.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Protocol

from typhoon.operators import resolve_operator
from typhoon.operators.base import Context, Operator
from typhoon.runtime.columnar import ColumnPath, column_path
from typhoon.runtime.hooks import bind_operator
from typhoon.runtime.policies import Router
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.timers import Timers
from typhoon.topology.model import DEFAULT_STREAM, Node


class SwapHost(Protocol):
    """What a swap uses of the framework (``typhoon.runtime.framework.Framework``)."""

    spec: WorkerSpec
    worker_id: int
    node: Node
    op: Operator
    context: Context
    is_spout: bool
    done: bool
    ckpt: Any
    moved_to: int | None
    migration: Any
    keyed: Any
    tuples_in: dict[int, int]
    routers: dict[int, Router]
    swapped: list[dict[str, Any]]
    columnar: ColumnPath | None
    _op_metrics: Callable[[], dict[str, Any]] | None
    _process_batch: Callable[..., Any] | None
    _process_rows: Callable[..., Any] | None

    def emit(self, values: list[Any], stream: str = DEFAULT_STREAM) -> None: ...
    def flush(self, force: bool = False) -> None: ...


log = logging.getLogger(__name__)


def swap_operator(fw: SwapHost, operator: str, args: dict[str, Any]) -> str | None:
    """Replace ``fw``'s operator by ``operator(**args)``; the reason when it cannot (then
    nothing changed).  The same operator and args again is done already (an undo of a
    swap that never reached this worker), and so is a worker whose input ended."""
    node = fw.node
    if (node.operator, node.args) == (operator, args) or fw.done:
        return None
    old = fw.op
    if fw.is_spout:
        return "a spout is not swapped"
    if fw.ckpt is not None:
        return "a worker under a guarantee is not swapped in place (its checkpoints)"
    if fw.moved_to is not None or fw.migration is not None:
        return "its state is moving"
    try:
        cls = resolve_operator(operator, node.engine)
    except Exception as e:  # an unknown name: the plan checked it, a forced SWAP may not
        return f"operator '{operator}': {e}"
    from typhoon.operators.swap_rules import in_place_blockers  # only once a swap comes

    if fw.keyed is not None and (getattr(old, "keyed", False) or getattr(cls, "keyed", False)):
        return "keyed state is not swapped in place"
    blockers = in_place_blockers(old) + in_place_blockers(cls)
    if blockers:
        return f"its operator hooks {sorted(set(blockers))} hold state in the framework"
    context = dataclasses.replace(
        fw.context,
        operator=operator,
        keyed_declared=bool(getattr(cls, "keyed", False)),
        timers=Timers(fw.keyed, operator, node.name),
    )
    try:  # built and opened before the cut: one that fails leaves the old one running
        new = cls(**args)
        new.open(context)
    except Exception as e:
        return f"operator '{operator}' with args {args}: {e}"
    # the old instance ends as at its end of input: its state leaves behind its output
    old.on_signal(fw.emit)
    fw.flush(force=True)
    fw.swapped.append(
        {
            "operator": node.operator,
            "args": node.args,
            "result": old.result(),
            "tuples_in": sum(fw.tuples_in.values()),
            "tuples_out": sum(r.emitted for r in fw.routers.values()),
        }
    )
    old.close()
    node = dataclasses.replace(node, operator=operator, args=dict(args))
    topology = fw.spec.topology  # a copy: the other members of a chain keep their own
    topology = dataclasses.replace(topology, nodes={**topology.nodes, node.name: node})
    fw.spec = dataclasses.replace(fw.spec, topology=topology)
    fw.node = node
    fw.op = new
    fw.columnar = column_path(fw.spec.topology, node.name, new)
    bind_operator(fw, new)
    fw.context = context
    gone = fw.swapped[-1]
    log.info(
        "worker %d: %s swapped in place for %s after %d tuples",
        fw.worker_id, operator, gone["operator"], gone["tuples_in"],
    )  # fmt: skip
    return None
