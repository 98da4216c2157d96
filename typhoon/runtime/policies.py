"""Routing policies of the framework layer (paper Listing 1, docs/design.md §4).

A :class:`Router` holds one output stream's routing state and picks the
receiving worker(s) of each tuple.  The state is replaced wholesale by a
ROUTING control tuple, so a policy change is one assignment in the worker.
"""

from __future__ import annotations

import random

from typhoon.topology.keygroups import stable_hash
from typhoon.topology.routing import Route

LB_SLOTS = 256


__all__ = ["LB_SLOTS", "Router", "stable_hash"]


class Router:
    """Chooses receivers for one output stream.

    ``select(values)`` returns one worker ID; ``broadcast`` routers send every
    tuple to all ``next_hops`` instead (the caller handles that case).
    """

    __slots__ = (
        "route", "hops", "n", "counter", "fields", "local", "broadcast", "rng", "select",
        "emitted", "switched", "plain", "groups", "g",
    )  # fmt: skip

    def __init__(self, route: Route, emitted: int = 0, switch_balancing: bool = False) -> None:
        self.route = route
        self.hops = list(route.next_hops)
        self.n = len(self.hops)
        self.counter = 0
        self.fields = list(route.fields)
        self.local = list(route.local)
        # key-routed: the owner of each key group; without a table (an old ROUTING body)
        # the groups are the receivers themselves
        self.groups = list(route.groups) or list(self.hops)
        self.g = len(self.groups)
        self.broadcast = route.policy == "all"
        # the switch's select group picks the receiver (sdn policy, load-balancer app on)
        self.switched = route.policy == "sdn" and bool(route.balanced) and switch_balancing
        # unicast with the receiver chosen here by select(): the common case
        self.plain = not self.broadcast and not self.switched
        self.rng = random.Random(0x7479 + route.stream)
        self.emitted = emitted  # tuples routed on this stream (kept across ROUTING updates)
        # one method per policy, chosen once: select() runs for every tuple
        self.select = self._none if not self.n else self._pick_select(route.policy)

    def _pick_select(self, policy: str):  # noqa: ANN202 - a bound method of this class
        if policy in ("shuffle", "sdn"):
            return self._round_robin
        if policy == "fields":
            return self._fields
        if policy == "global":
            return self._first
        if policy == "local_or_shuffle":
            if self.local:
                return self._local
            return self._round_robin
        if policy == "direct":
            return self._direct
        return self._no_single

    # select(values) -> receiving worker ID for a unicast policy; -1 when there is none

    def _none(self, values: list) -> int:
        return -1

    def _round_robin(self, values: list) -> int:
        self.counter += 1
        return self.hops[self.counter % self.n]

    def _local(self, values: list) -> int:
        self.counter += 1
        pool = self.local
        return pool[self.counter % len(pool)]

    def _fields(self, values: list) -> int:
        return self.groups[stable_hash([values[i] for i in self.fields]) % self.g]

    def _first(self, values: list) -> int:
        return self.hops[0]

    def _direct(self, values: list) -> int:
        key = [values[i] for i in self.fields]
        dst = self.route.table.get(str(key[0]) if len(key) == 1 else str(key))
        if dst is not None:
            return dst
        return self.groups[stable_hash(key) % self.g]

    def dealt(self, count: int) -> list[int] | None:
        """Receivers of the next ``count`` tuples dealt by slices, as ``select`` would
        pick them one by one: tuple i goes to ``result[i % len(result)]``.  None for a
        policy that looks at the values (route each tuple with ``select``)."""
        sel = self.select
        if sel == self._round_robin or sel == self._local:
            pool = self.hops if sel == self._round_robin else self.local
            k = len(pool)
            start = self.counter + 1
            self.counter += count
            return [pool[(start + j) % k] for j in range(min(k, count))]
        if sel == self._first:
            return self.hops[:1]
        if sel == self._none:
            return []
        return None

    def _no_single(self, values: list) -> int:
        raise ValueError(f"policy {self.route.policy!r} has no single receiver")

    def lb_slot(self) -> int:
        """Random load-balancer slot for the ``sdn`` policy (bounded set of addresses)."""
        return self.rng.randrange(LB_SLOTS)
