"""SpaceSaving (Metwally et al., ICDT'05): the most frequent items of a stream in
``capacity`` counters.  Seed paper 003 counts key pairs with it in every stateful
worker, so statistics cost a bounded amount of memory whatever the key space.

Each counter holds an item, its count and the error it may carry (the count of
the counter it replaced): the true frequency lies in ``[count - error, count]``.
Every item more frequent than ``total / capacity`` is guaranteed to be kept.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)  # the items counted


@dataclass
class SpaceSaving(Generic[K]):
    capacity: int
    total: int = 0
    counts: dict[K, int] = field(default_factory=dict)
    errors: dict[K, int] = field(default_factory=dict)
    # (count, sequence, item) candidates for the minimum; stale entries are skipped
    _heap: list[tuple[int, int, K]] = field(default_factory=list, repr=False)
    _seq: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {self.capacity!r}")

    def offer(self, item: K, n: int = 1) -> None:
        """Count ``n`` more occurrences of ``item``."""
        if n <= 0:
            raise ValueError(f"n must be positive, got {n}")
        self.total += n
        counts = self.counts
        if item in counts:
            counts[item] += n
            self._push(item)
            return
        if len(counts) < self.capacity:
            counts[item] = n
            self.errors[item] = 0
            self._push(item)
            return
        low, victim = self._minimum()
        del counts[victim], self.errors[victim]
        counts[item] = low + n
        self.errors[item] = low
        self._push(item)

    def offer_all(self, items: Iterable[K]) -> None:
        for item in items:
            self.offer(item)

    def top(self, k: int | None = None) -> list[tuple[K, int, int]]:
        """``(item, count, error)``, most frequent first (ties by item's repr)."""
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], repr(kv[0])))
        return [(i, c, self.errors[i]) for i, c in ranked[: k if k is not None else len(ranked)]]

    def guaranteed(self) -> list[tuple[K, int]]:
        """Items whose lower bound beats every item that may have been dropped."""
        low = min(self.counts.values()) if len(self.counts) == self.capacity else 0
        return [(i, c) for i, c, e in self.top() if c - e >= low]

    def clear(self) -> None:
        """Start over (after routing tables change, old correlations no longer matter)."""
        self.total = 0
        self.counts.clear()
        self.errors.clear()
        self._heap.clear()

    def _push(self, item: K) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (self.counts[item], self._seq, item))
        if len(self._heap) > 4 * self.capacity:  # drop stale entries now and then
            self._heap = [(c, s, i) for c, s, i in self._heap if self.counts.get(i) == c]
            heapq.heapify(self._heap)

    def _minimum(self) -> tuple[int, K]:
        while True:
            c, _, item = self._heap[0]
            if self.counts.get(item) == c:
                return c, item
            heapq.heappop(self._heap)
