"""Key-pair statistics of one worker (opt-in, ``typhoon/locality/settings.py``).

One input row in ``sample`` is handed to the operator on its own, with an
``emit`` that records ``(a, b)`` for each tuple it emits on the keyed output
stream: ``a`` the row's input key, ``b`` the output tuple's key.  The rows in
between go to the operator as before (``process_batch`` keeps whole runs), so
the cost is one extra call per sampled row.  Keys are written as the ``direct``
grouping's table keys (``typhoon/runtime/policies.py``), so the counts can be
turned into routing tables as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typhoon.locality.settings import LocalitySettings, locality_settings
from typhoon.locality.spacesaving import SpaceSaving
from typhoon.topology.model import DEFAULT_STREAM, Topology
from typhoon.topology.pair_keys import PairKeys, pair_keys

Emit = Callable[..., None]
FOLD_AT = 256  # distinct recent pairs kept before they go into the counter


def table_key(values: list[Any], fields: tuple[int, ...]) -> str:
    """A tuple's key as a ``direct`` routing table names it."""
    if len(fields) == 1:
        return str(values[fields[0]])
    return str([values[i] for i in fields])


class PairStats:
    """Samples input rows and counts (input key, output key) pairs in bounded memory."""

    def __init__(self, settings: LocalitySettings, keys: PairKeys) -> None:
        self.settings = settings
        self.keys = keys
        self.counter: SpaceSaving[tuple[str, str]] = SpaceSaving(settings.pairs)
        self.sample = settings.sample
        self.skip = settings.sample - 1  # rows before the next sampled one
        self.sampled = 0  # rows handed over on their own
        # pairs since the last fold into the counter: one SpaceSaving update (a heap push)
        # per distinct pair instead of per sampled tuple
        self.recent: dict[tuple[str, str], int] = {}
        self._a = ""
        self._emit: Emit | None = None

    def run(
        self,
        rows: list[list[Any]],
        process: Callable[[list[Any], Emit], None],
        batch: Callable[[list[Any], Emit], None] | None,
        emit: Emit,
    ) -> None:
        """Give ``rows`` to the operator in order, the sampled ones with a recording emit."""
        n, i, start = len(rows), self.skip, 0
        keys = self.keys.in_fields
        self._emit = emit
        while i < n:
            if i > start:
                self._plain(rows[start:i], process, batch, emit)
            row = rows[i]
            self._a = table_key(row, keys)
            if batch is not None:
                batch([row], self._record)
            else:
                process(row, self._record)
            self.sampled += 1
            start = i + 1
            i += self.sample
        if start < n:
            self._plain(rows[start:] if start else rows, process, batch, emit)
        self.skip = i - n

    def fold(self) -> None:
        """Move the recent pairs into the bounded counter."""
        offer = self.counter.offer
        for pair, n in self.recent.items():
            offer(pair, n)
        self.recent = {}

    @staticmethod
    def _plain(
        rows: list[list[Any]],
        process: Callable[[list[Any], Emit], None],
        batch: Callable[[list[Any], Emit], None] | None,
        emit: Emit,
    ) -> None:
        if batch is not None:
            batch(rows, emit)
        else:
            for values in rows:
                process(values, emit)

    def _record(self, values: list[Any], stream: str = DEFAULT_STREAM) -> None:
        if stream == self.keys.out_stream:
            pair = (self._a, table_key(values, self.keys.out_fields))
            recent = self.recent
            recent[pair] = recent.get(pair, 0) + 1
            if len(recent) > FOLD_AT:
                self.fold()
        assert self._emit is not None
        self._emit(values, stream)

    def metrics(self, sent_to: dict[tuple[int, int], int]) -> dict[str, Any]:
        """The ``top`` pairs as ``{a: {b: count}}`` (METRIC_RESP carries no lists), how
        many rows were sampled, and the tuples sent per ``receiver:stream`` (which
        receivers are on another host is the controller's to say: that gives the
        fraction of tuples crossing hosts)."""
        self.fold()
        pairs: dict[str, dict[str, int]] = {}
        for (a, b), c, _ in self.counter.top(self.settings.top):
            pairs.setdefault(a, {})[b] = c
        return {
            "pairs": pairs,
            "pairs_sampled": self.sampled,
            "pairs_sample": self.sample,
            "sent_to": {f"{d}:{s}": n for (d, s), n in sent_to.items()},
        }


def pair_stats(topo: Topology, node: str) -> PairStats | None:
    """The node's counter when the topology asks for one and the node has both keys."""
    settings = locality_settings(topo)
    if settings is None:
        return None
    keys = pair_keys(topo, node)
    return None if keys is None else PairStats(settings, keys)
