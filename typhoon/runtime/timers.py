"""Event-time timers of an operator: ``context.timer(ts, key=None)`` + ``on_timer``.

An operator asks for a call back once the worker's watermark reaches ``ts``
(``typhoon.runtime.watermarks``): ``on_timer(ts, key, emit)`` runs before its
``on_watermark`` for that watermark, oldest timer first, and at end of stream
(the watermark is +inf) every timer left fires.  A timer with a ``key`` lives
in the keyed state (mapping ``__timers__``: key -> sorted times), so it is
checkpointed and moves with its key group like the rest of the key's state;
one without a key belongs to the worker and is checkpointed with the
operator's snapshot.  Setting the same (time, key) twice sets it once.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Any

from typhoon.operators.windowing import is_time

TIMERS = "__timers__"  # the keyed mapping of keyed timers


class Timers:
    """The pending timers of one worker."""

    def __init__(self, keyed: Any, operator: str, node: str) -> None:
        self.keyed = keyed
        self.where = f"operator '{operator}' of '{node}'"
        self.plain: list[float] = []  # a heap of unkeyed times
        self.fired = 0

    def _keyed_map(self) -> Any:
        return self.keyed.state(TIMERS, default=list)

    def add(self, ts: Any, key: Any = None) -> None:
        if not is_time(ts):
            raise ValueError(f"{self.where}: a timer's time must be a number, not {ts!r}")
        if key is None:
            if ts not in self.plain:
                heapq.heappush(self.plain, ts)
            return
        if self.keyed is None:
            raise TypeError(
                f"{self.where} sets a timer for key {key!r}, but its input is not routed by "
                "key fields (a keyed timer lives with the key's state)"
            )
        times = self._keyed_map()[key]
        i = bisect.bisect_left(times, ts)
        if i == len(times) or times[i] != ts:
            times.insert(i, ts)

    def due(self, wm: float) -> list[tuple[Any, Any]]:
        """Every timer at or below ``wm``, as ``(ts, key)``, oldest first; they are gone."""
        out: list[tuple[Any, Any]] = []
        plain = self.plain
        while plain and plain[0] <= wm:
            out.append((heapq.heappop(plain), None))
        if self.keyed is not None and TIMERS in self.keyed.stores:
            data = self.keyed.stores[TIMERS].data
            empty = []
            for key, times in data.items():
                n = bisect.bisect_right(times, wm)
                if n:
                    out.extend((ts, key) for ts in times[:n])
                    del times[:n]
                    if not times:
                        empty.append(key)
            for key in empty:
                del data[key]
        out.sort(key=lambda tk: tk[0])
        self.fired += len(out)
        return out

    def pending(self) -> int:
        keyed = 0
        if self.keyed is not None and TIMERS in self.keyed.stores:
            keyed = sum(len(t) for t in self.keyed.stores[TIMERS].data.values())
        return len(self.plain) + keyed

    def snapshot(self) -> list[float]:
        return sorted(self.plain)

    def restore(self, times: Any) -> None:
        self.plain = [t for t in (times or []) if is_time(t)]
        heapq.heapify(self.plain)
