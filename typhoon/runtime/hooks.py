"""Which batch variant of an operator method the framework may call instead of it."""

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
