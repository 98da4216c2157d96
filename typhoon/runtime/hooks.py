"""Which batch variant of an operator method the framework may call instead of it, and
the one place that points a worker's hooks at its operator instance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typhoon.operators.base import Operator


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


def rows_hook(operator: Operator) -> Callable[..., Any] | None:
    """A bolt's ``process_rows(rows, emit_rows)``, if the framework may call it for a
    batch: defined at least as far down the class hierarchy as ``process`` and as
    ``process_batch`` (a subclass that overrides either is never bypassed)."""
    if batch_hook(operator, "process_rows", "process") is None:
        return None
    return batch_hook(operator, "process_rows", "process_batch")


def bind_operator(fw: Any, operator: Operator) -> None:
    """Point every hook framework ``fw`` keeps of its operator at ``operator``: at start,
    when a rollback builds the operator again from its checkpoint, after a swap.

    One function for all three, since a hook left on the old instance keeps running it:
    a rolled-back columnar source went on emitting from where the dropped instance was
    (``next_columns``), so what lay between its checkpointed offset and the rollback was
    never sent again, and a rolled-back bolt took column blocks into the dropped
    instance (``process_columns``), past its restored state.
    """
    fw._process_batch = batch_hook(operator)
    fw._process_rows = rows_hook(operator)  # emits lists of rows (emit_rows)
    fw._next_rows = batch_hook(operator, "next_rows", "next_batch")
    fw._next_columns = batch_hook(operator, "next_columns", "next_batch")
    fw._pump = getattr(operator, "pump", None)
    fw._op_metrics = getattr(operator, "metrics", None)
    fw._anchor_ready = getattr(operator, "anchor_ready", None)
    if fw.columnar is not None:
        fw.columnar.bind(operator)
