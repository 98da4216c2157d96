"""Application-layer operator API (paper Fig. 4, top layer).

A bolt implements ``process(values, emit)``, and may implement
``process_batch(rows, emit)`` as well: the framework then hands it every row
batch that arrived in one call (same effect as ``process`` on each row in
order, less interpreter overhead per tuple).  A spout implements
``next_batch(emit, max_count)``.  ``emit(values, stream="default")`` hands a
tuple to the framework layer, which routes it.  Stateful bolts keep an
in-memory cache and flush it in ``on_signal(emit)`` (paper Listing 2), which the
framework calls on a SIGNAL control tuple and at end of stream.
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


class Operator:
    """Common part of spouts and bolts: argument handling and lifecycle hooks."""

    kind: ClassVar[str] = "bolt"
    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **args: Any) -> None:
        self.args = args
        self.context: Context | None = None

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        """Fields of emitted tuples; the loader uses it to check `fields` groupings."""
        return list(cls.fields)

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
