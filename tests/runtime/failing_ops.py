"""Operators that fail on purpose, for the tests of how a run reports a failed worker.

Named in topologies as ``failing_ops:Explode`` with ``tests/runtime`` on PYTHONPATH
(workers inherit it; ``tests`` itself is not importable: a dependency installs a
package of that name)."""

from __future__ import annotations

from typing import Any

from typhoon.operators.base import Bolt, Emit


def _check(n: int, after: int) -> None:
    if n > after:
        raise ValueError(f"boom at tuple {n}")


class Explode(Bolt):
    """Passes tuples on, then raises ValueError at tuple ``after + 1``."""

    def __init__(self, after: int = 10) -> None:
        super().__init__(after=after)
        self.after = after
        self.seen = 0

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        return list(input_fields)

    def process(self, values: list, emit: Emit) -> None:
        self.seen += 1
        _check(self.seen, self.after)
        emit(values)
