"""Application-layer operator API (paper Fig. 4, top layer).

A bolt implements ``process(values, emit)``, and may implement
``process_batch(rows, emit)`` as well: the framework then hands it the rows of
each arriving frame (every entry of it) in one call (same effect as ``process`` on each row in
order, less interpreter overhead per tuple), and ``process_rows(rows, emit_rows)``,
which the framework then calls instead of both: ``emit_rows(rows,
stream="default")`` routes a list of tuples at once (same effect as ``emit`` on
each in order), for a bolt that emits several tuples per input row, whose
per-tuple routing would dominate its cost.
On a stream that declares its columns
(docs/topology.md) a bolt may also implement ``process_columns(cols, emit)``: it then
gets a frame's column blocks as one ``typhoon.wire.columns.Columns`` (numpy arrays),
with the same effect as ``process`` on each of its rows.  A spout implements
``next_batch(emit, max_count)``, and may implement ``next_rows(emit_rows,
max_count)`` as well, which the framework then calls instead: ``emit_rows(rows,
stream="default")`` routes a list of tuples at once (same effect as ``emit`` on
each in order; the framework's per-tuple routing dominated a cheap source's cost).
A spout that holds its output as columns may implement ``next_columns(emit_columns,
max_count)``, called instead of both (unless event-time watermarks watch its rows):
``emit_columns(columns, stream="default")`` sends one column per declared field as
column blocks, the same rows ``emit_rows`` would send; any operator may call it as
``context.emit_columns`` (typhoon/runtime/output_columns.py).
``emit(values, stream="default")`` hands a tuple to the framework layer, which
routes it.  Stateful bolts keep an
in-memory cache and flush it in ``on_signal(emit)`` (paper Listing 2), which the
framework calls on a SIGNAL control tuple and at end of stream.

State kept per key belongs in keyed state: an operator that declares ``keyed =
True`` asks in ``open()`` for ``context.keyed_state(name, default)``, a mapping
whose keys are the values of its input's fields grouping.  The framework owns
it: it is checkpointed under a guarantee and moves with its keys on a rescale
(docs/keyed_state.md).  ``snapshot``/``restore`` stay for the rest.

Guaranteed processing (checkpoints and upstream backup) needs two more things:
a bolt's state as plain data (``snapshot``/``restore``) and a spout's place in
its source (``offset``/``seek``), so a crashed worker can be rebuilt from the
last consistent checkpoint and its sources replay exactly what followed it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

Emit = Callable[..., None]


@dataclass
class Context:
    """What an operator may know about where it runs."""

    topology: str
    node: str
    worker_id: int
    index: int  # 0-based index among the node's workers
    parallelism: int
    input_fields: list[str] = field(default_factory=list)
    output_fields: list[str] = field(default_factory=list)
    operator: str = ""
    # every input node -> the fields it produces (a node with several inputs, a join)
    input_nodes: dict[str, list[str]] = field(default_factory=dict)
    # the framework's keyed state of this worker (typhoon.runtime.keyed_state.KeyedStates);
    # None when the node's input is not key-routed
    keyed: Any = field(default=None, repr=False, compare=False)
    keyed_declared: bool = False  # the operator class says ``keyed = True``
    # the framework's event-time timers (typhoon.runtime.timers.Timers)
    timers: Any = field(default=None, repr=False, compare=False)
    # emit_columns(columns, stream=...): the worker's columnar emit, for an operator that
    # holds its output as columns (docs/topology.md "columns"); None outside a worker
    emit_columns: Any = field(default=None, repr=False, compare=False)

    def timer(self, ts: float, key: Any = None) -> None:
        """Call ``on_timer(ts, key, emit)`` once the watermark reaches ``ts``.

        With a ``key`` (a key of this worker's keyed state) the timer moves and is
        checkpointed with the key; without, it belongs to the worker
        (docs/windows.md)."""
        if self.timers is None:
            raise TypeError(f"'{self.node}' has no event-time timers here")
        if key is not None and not self.keyed_declared:
            raise TypeError(
                f"operator '{self.operator}' of '{self.node}' sets a keyed timer but its class "
                "does not declare keyed = True (keyed timers move with the keyed state)"
            )
        self.timers.add(ts, key)

    guarantee: str = "none"  # config: guarantee (connectors choose how they commit by it)

    def keyed_state(self, name: str, default: Any = None) -> Any:
        """A mutable mapping of this worker's keys (see the module docstring).

        Keys are the values of the input's fields grouping: the value for one
        field, a tuple for several.  A missing key reads as ``default`` (a callable
        default is called and its result stored, like ``defaultdict``).  A key
        that another worker owns raises ``KeyNotOwned``.
        """
        if not self.keyed_declared:
            raise TypeError(
                f"operator '{self.operator}' of '{self.node}' calls keyed_state() but its "
                "class does not declare keyed = True (the loader checks the input of keyed "
                "operators, and a rescale moves their state)"
            )
        if self.keyed is None:
            raise TypeError(
                f"operator '{self.operator}' of '{self.node}' keeps keyed state, but its "
                "input is not routed by key fields (use a fields grouping)"
            )
        return self.keyed.state(name, default)

    def key(self, values: list) -> Any:
        """The keyed-state key of an input tuple (its grouping fields' values)."""
        if self.keyed is None:
            raise TypeError(f"'{self.node}' has no key-routed input")
        return self.keyed.key(values)


class Operator:
    """Common part of spouts and bolts: argument handling and lifecycle hooks."""

    # True: the framework sets ``self.sender`` (the sending worker's id) before it hands
    # over the rows of each arriving frame; for sinks that check where tuples came from
    sees_sender: ClassVar[bool] = False
    sender: int = -1
    # True: the framework sets ``self.input`` (the node the rows came from) likewise; joins
    sees_input: ClassVar[bool] = False
    input: str = ""

    kind: ClassVar[str] = "bolt"
    fields: ClassVar[tuple[str, ...]] = ()
    # True: the operator keeps keyed state (Context.keyed_state); its input must be
    # fields-grouped, and a rescale moves its key groups with their state
    keyed: ClassVar[bool] = False
    # True: keyed only when its input is key-routed; otherwise Context.keyed is None and the
    # operator keeps plain per-worker state (count_by_key behind a shuffle)
    keyed_optional: ClassVar[bool] = False
    # the keyed state it keeps: each mapping's name -> the form of its values (a tag of
    # its own; a new form needs a new tag).  A swap in place carries keyed state over
    # only between operators that declare it (typhoon.operators.swap_rules)
    keyed_shape: ClassVar[dict[str, str] | None] = None

    def __init__(self, **args: Any) -> None:
        self.args = args
        self.context: Context | None = None

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        """Fields of emitted tuples; the loader uses it to check `fields` groupings."""
        return list(cls.fields)

    @classmethod
    def state_shape(cls, args: dict[str, Any]) -> dict[str, str] | None:
        """The keyed state these ``args`` keep: ``keyed_shape`` unless it depends on them."""
        return None if cls.keyed_shape is None else dict(cls.keyed_shape)

    @classmethod
    def migrate_keyed(
        cls, args: dict[str, Any], name: str, tag: str
    ) -> Callable[[Any], Any] | None:
        """How this operator takes over mapping ``name`` that the operator it replaces in a
        swap kept in form ``tag``: a function of one value giving it in this operator's
        form; None (the default) when it cannot, so such a swap is refused."""
        return None

    def open(self, context: Context) -> None:
        self.context = context

    def on_signal(self, emit: Emit) -> None:
        """Flush in-memory state downstream (SIGNAL control tuple, end of stream)."""

    def close(self) -> None:
        """Release resources; called once when the worker stops."""

    def result(self) -> Any:
        """What the run report shows for this worker (sinks), or None."""
        return None

    @classmethod
    def merge_results(cls, results: list[Any]) -> Any:
        """One result for the whole node from its workers' results (run report)."""
        return results

    def snapshot(self) -> Any:
        """State that shapes future output and ``result()``, as msgpack-able plain data.

        Checkpoints store it; None means stateless.  Dict keys may be any
        msgpack type, not only strings.
        """
        return None

    def restore(self, state: Any) -> None:
        """Put back what :meth:`snapshot` returned; called after ``open()``."""
        if state is not None:
            raise ValueError(
                f"{type(self).__name__} keeps no state, so it cannot restore a snapshot"
                f" ({type(state).__name__}); implement snapshot() and restore()"
            )


class Bolt(Operator):
    kind: ClassVar[str] = "bolt"

    def process(self, values: list, emit: Emit) -> None:
        raise NotImplementedError


class Spout(Operator):
    kind: ClassVar[str] = "spout"
    # initial input rate in tuples/s (0 = unlimited); INPUT_RATE changes it at run time
    rate: float = 0.0

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        """Emit up to ``max_count`` tuples; return False once the source is exhausted."""
        raise NotImplementedError

    def offset(self) -> Any:
        """Where the source is, as msgpack-able data: what a checkpoint records to replay from."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot tell its offset, so it cannot replay after a failure"
            " (implement offset() and seek())"
        )

    def seek(self, offset: Any) -> None:
        """Continue from ``offset`` (after ``open()``, before any ``next_batch``).

        From there the source emits exactly the tuples it would have emitted
        after :meth:`offset` returned it, and its ``result()`` counts agree.
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot seek, so it cannot replay after a failure"
            " (implement offset() and seek())"
        )

    @classmethod
    def replayable(cls) -> bool:
        """True when the class overrides both offset() and seek(): guarantees need it."""
        return cls.offset is not Spout.offset and cls.seek is not Spout.seek


def replayable(cls: type) -> bool:
    """True for a spout class that can replay (overrides offset() and seek()); else False."""
    return isinstance(cls, type) and issubclass(cls, Spout) and cls.replayable()
