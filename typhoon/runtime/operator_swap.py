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

Keyed state is the framework's (``typhoon.runtime.keyed_state``), so where both
operators keep it and declare its shape the worker keeps it across the cut
(``typhoon.operators.swap_rules.keyed_carry``): the old instance gets no
``on_signal`` (its state does not end) and leaves no ``result()`` (what it held is
the new instance's now: counted twice otherwise), its mappings whose form changes
are rewritten by the new operator's migration at the cut, and the new instance
opens over the same mappings, so its first tuple sees the state the old one's last
tuple left.  A mapping the new operator does not keep stays in the store unused (an
undo back to the old operator finds it again).  Under a guarantee checkpoint parts
record their operator, and a part of before the swap is carried to the new operator
when it is restored (:func:`carried_keyed`), so a recovery runs the new logic on the
state.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from typhoon.operators import resolve_operator
from typhoon.operators.base import Context, Operator
from typhoon.runtime.columnar import ColumnPath, column_path
from typhoon.runtime.hooks import bind_operator
from typhoon.runtime.keyed_state import KeyedStateError
from typhoon.runtime.policies import Router
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.timers import Timers
from typhoon.topology.model import DEFAULT_STREAM, Node

if TYPE_CHECKING:
    from typhoon.operators.swap_rules import KeyedCarry


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
    if fw.moved_to is not None or fw.migration is not None:
        return "its state is moving"
    try:
        cls = resolve_operator(operator, node.engine)
    except Exception as e:  # an unknown name: the plan checked it, a forced SWAP may not
        return f"operator '{operator}': {e}"
    from typhoon.operators.swap_rules import in_place_blockers, keyed_carry  # once one comes

    blockers = in_place_blockers(old) + in_place_blockers(cls)
    if blockers:
        return f"its operator hooks {sorted(set(blockers))} hold state in the framework"
    carry, keyed = None, fw.keyed
    if keyed is not None and (getattr(old, "keyed", False) or getattr(cls, "keyed", False)):
        old_cls = type(old)
        if not (getattr(old, "keyed", False) and getattr(cls, "keyed", False)):
            return "keyed state would be dropped or started empty (only one operator keeps it)"
        carry = keyed_carry((node.operator, old_cls, node.args), (operator, cls, args))
        if carry is None:
            return f"'{node.operator}' or '{operator}' declares no keyed_shape"
        if carry.refusal is not None:
            return carry.refusal
    if fw.ckpt is not None:
        if carry is None:
            return "a worker under a guarantee is not swapped in place (its checkpoints)"
        if old.snapshot() is not None:  # a checkpoint part would hand it to the new one
            return "its operator keeps state that is not keyed, under a guarantee"
    context = dataclasses.replace(
        fw.context,
        operator=operator,
        keyed_declared=bool(getattr(cls, "keyed", False)),
        timers=Timers(keyed, operator, node.name),
    )
    defaults = {} if keyed is None else {n: st.default for n, st in keyed.stores.items()}
    try:  # built, opened and migrated before the cut: one that fails leaves the old running
        migrated = {} if carry is None else _migrate(keyed, carry)
        new = cls(**args)
        new.open(context)
    except Exception as e:
        for n, d in defaults.items():  # open() gave the old mappings the new defaults
            keyed.stores[n].default, keyed.stores[n].factory = d, callable(d)
        return f"operator '{operator}' with args {args}: {e}"
    entry: dict[str, Any] = {"operator": node.operator, "args": node.args}
    if carry is None:
        # the old instance ends as at its end of input: its state leaves behind its output
        old.on_signal(fw.emit)
        fw.flush(force=True)
        entry["result"] = old.result()
    else:  # the cut: from here the new instance reads and writes the old one's keys
        for n, data in migrated.items():  # in place: the new instance may hold the dict
            keyed.stores[n].data.clear()
            keyed.stores[n].data.update(data)
        keyed.operator = operator
        keyed.forget_checked()
        entry["keyed"] = {**carry.summary(), "keys": keyed.keys()}
    entry["tuples_in"] = sum(fw.tuples_in.values())
    entry["tuples_out"] = sum(r.emitted for r in fw.routers.values())
    fw.swapped.append(entry)
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


def _migrate(keyed: Any, carry: KeyedCarry) -> dict[str, dict[Any, Any]]:
    """The migrated mappings' new contents (built aside: a value the migration refuses
    leaves the old ones as they were)."""
    out = {}
    for name, fn in carry.migrated.items():
        store = keyed.stores.get(name)
        if store is not None:
            out[name] = {k: fn(v) for k, v in store.data.items()}
    return out


def part_carry(node: Node, part: dict[str, Any]) -> KeyedCarry | None:
    """How the keyed state of a checkpoint part taken under another operator of ``node``
    (before a swap in place) goes to today's; None when the part is today's operator's.

    A recovery after a swap may restore a part of before it: the new operator then
    goes on from that state, as if the swap had been at that checkpoint (the input
    replayed from it goes through the new logic).  Raises :class:`KeyedStateError`
    when the state cannot go over (an older operator whose shape the current one
    cannot take directly: several swaps since that checkpoint)."""
    from typhoon.operators.swap_rules import carry_refusal, keyed_carry

    was = part.get("operator")
    if not was or (was[0], was[1]) == (node.operator, node.args):
        return None
    try:
        old = (was[0], resolve_operator(was[0], node.engine), was[1])
        carry = keyed_carry(old, (node.operator, resolve_operator(node.operator), node.args))
    except Exception as e:
        raise KeyedStateError(f"a checkpoint of '{node.name}' under '{was[0]}': {e}") from None
    why = "a keyed_shape is not declared" if carry is None else carry_refusal(carry, was[0], "")
    if carry is None or why is not None:
        raise KeyedStateError(
            f"a checkpoint of '{node.name}' taken under operator '{was[0]}' cannot be restored "
            f"into '{node.operator}': {why}"
        )
    return carry


def carried_keyed(node: Node, part: dict[str, Any]) -> bytes | dict[str, Any] | None:
    """The keyed state of checkpoint ``part`` in the form today's operator keeps it."""
    data = part.get("keyed")
    carry = part_carry(node, part)
    if carry is None or not carry.migrated or data is None:
        return data
    entries: dict[str, Any] = (
        msgpack.unpackb(data, raw=False, strict_map_key=False)
        if isinstance(data, (bytes, bytearray))
        else dict(data)
    )
    for name, fn in carry.migrated.items():
        if name in entries:
            entries[name] = [[k, fn(v)] for k, v in entries[name]]
    return entries
