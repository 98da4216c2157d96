"""Debug bolts to run with ``typhoon debug attach ... --operator typhoon.debug.examples:Tally``.

A debug bolt is an ordinary bolt (``typhoon.operators.Bolt``) built without
arguments; the debug worker feeds it the tuples a session shows and shows what
it emits.  Write your own in a module the agents' hosts can import, like any
``module:Class`` operator.
"""

from __future__ import annotations

from typing import Any, ClassVar

from typhoon.operators import Bolt, Emit


class Tally(Bolt):
    """Emits ``[value, n]`` per tuple: how many observed tuples so far had its first value.

    State lives in the debug worker only (a session's own view, gone on detach);
    the observed application is untouched.
    """

    fields: ClassVar[tuple[str, ...]] = ("value", "seen")

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[Any, int] = {}

    def process(self, values: list, emit: Emit) -> None:
        key = values[0] if values else None
        key = repr(key) if isinstance(key, (list, dict)) else key  # unhashable: by its text
        n = self.seen[key] = self.seen.get(key, 0) + 1
        emit([values[0] if values else None, n])
