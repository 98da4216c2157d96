"""Routing policies of the framework layer (paper Listing 1, docs/design.md §4).

A :class:`Router` holds one output stream's routing state and picks the
receiving worker(s) of each tuple.  The state is replaced wholesale by a
ROUTING control tuple, so a policy change is one assignment in the worker.

A fields router remembers the receiver of recent one-field keys (a key's group
is a pure function of the key, its receiver a function of the group table,
which a router never changes: a new table is a new router, with an empty
cache), so a hot key costs one dict look-up instead of packing and hashing.
For a list of rows at once (``by_key``) it remembers, per recent string key, where
its receiver's rows go, so the rows are dealt to their receivers by C loops.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from operator import call, itemgetter
from typing import Any

from typhoon.topology.keygroups import stable_hash
from typhoon.topology.routing import Route

LB_SLOTS = 256
KEY_CACHE = 8192  # one-field keys whose receiver a fields router remembers (then it starts over)
# Key types cached: values of two different types among these are never equal, so one
# dict holds them all (True == 1 == 1.0 would share an entry yet pack differently).
_CACHED_TYPES = frozenset((str, int, bytes))


__all__ = ["LB_SLOTS", "Router", "stable_hash"]


def _no_key(values: list[Any]) -> tuple[Any, ...]:
    """The key of a fields grouping without fields: the same for every tuple."""
    return ()


class Router:
    """Chooses receivers for one output stream.

    ``select(values)`` returns one worker ID; ``broadcast`` routers send every
    tuple to all ``next_hops`` instead (the caller handles that case).
    """

    __slots__ = (
        "route", "hops", "n", "counter", "fields", "local", "broadcast", "rng", "select",
        "emitted", "switched", "plain", "groups", "g", "sid", "key_of", "cache", "bins",
        "adders", "one_key", "lb_next",
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
        self.sid = route.stream
        # the key fields of a tuple: the value itself for one field, a tuple for several
        self.key_of: Callable[[list[Any]], Any] = (
            itemgetter(*self.fields) if self.fields else _no_key
        )
        self.cache: dict[str | int | bytes, int] = {}  # one-field key -> receiver
        # by_key: the rows of one call per receiver, and each recent string key's bin
        self.bins: dict[int, list[list[Any]]] = {}
        self.adders: dict[str, Callable[[list[Any]], None]] = {}
        self.broadcast = route.policy == "all"
        # the switch's select group picks the receiver (sdn policy, load-balancer app on)
        self.switched = route.policy == "sdn" and bool(route.balanced) and switch_balancing
        # unicast with the receiver chosen here by select(): the common case
        self.plain = not self.broadcast and not self.switched
        self.rng = random.Random(0x7479 + route.stream)
        self.lb_next = self.rng.randrange(LB_SLOTS)  # next load-balancer slot (lb_slot)
        self.emitted = emitted  # tuples routed on this stream (kept across ROUTING updates)
        # one method per policy, chosen once: select() runs for every tuple
        self.select = self._none if not self.n else self._pick_select(route.policy)
        self.one_key = self.select == self._field  # by_key applies

    def _pick_select(self, policy: str) -> Callable[[list[Any]], int]:
        if policy in ("shuffle", "sdn"):
            return self._round_robin
        if policy == "fields":
            return self._field if len(self.fields) == 1 else self._fields
        if policy in ("global", "forward"):  # forward: the one partner at our position
            return self._first
        if policy == "local_or_shuffle":
            if self.local:
                return self._local
            return self._round_robin
        if policy == "direct":
            return self._direct
        return self._no_single

    # select(values) -> receiving worker ID for a unicast policy; -1 when there is none

    def _none(self, values: list[Any]) -> int:
        return -1

    def _round_robin(self, values: list[Any]) -> int:
        self.counter += 1
        return self.hops[self.counter % self.n]

    def _local(self, values: list[Any]) -> int:
        self.counter += 1
        pool = self.local
        return pool[self.counter % len(pool)]

    def _fields(self, values: list[Any]) -> int:
        return self.groups[stable_hash(self.key_of(values)) % self.g]

    def _field(self, values: list[Any]) -> int:
        """``_fields`` for one key field, with the receivers of recent keys remembered."""
        key = self.key_of(values)
        if type(key) not in _CACHED_TYPES:
            return self.groups[stable_hash([key]) % self.g]
        cache = self.cache
        dst = cache.get(key)
        if dst is None:
            dst = self.groups[stable_hash([key]) % self.g]
            if len(cache) >= KEY_CACHE:
                cache.clear()
            cache[key] = dst
        return dst

    def by_key(self, rows: list[list[Any]]) -> list[tuple[int, list[list[Any]]]] | None:
        """``rows`` of a one-field ``fields`` grouping dealt to the receivers ``select``
        picks, each receiver's in their order (a receiver < 0: rows no worker takes).

        Per row in C: the key, a look-up of the ``append`` of its receiver's bin,
        the call.  Only ``str`` keys are remembered, and a look-up is not
        type-checked: a key equal to a ``str`` is a ``str`` (a subclass packs, so
        hashes, the same), while ``True == 1 == 1.0`` would share an entry.  None
        when a row has no such field or an unhashable key: the caller routes the
        rows one by one with ``select`` (which raises the same error at the same
        row, or hashes the key's packed bytes).
        """
        adders = self.adders
        try:
            keys = list(map(self.key_of, rows))
            adds: list[Any] = list(map(adders.get, keys))
        except (TypeError, IndexError, KeyError):
            return None
        if None in adds:
            self._add_misses(rows, keys, adds)
        deque(map(call, adds, rows), maxlen=0)
        out = []
        for dst, b in self.bins.items():
            if b:
                out.append((dst, b[:]))
                b.clear()
        return out

    def _add_misses(self, rows: list[list[Any]], keys: list[Any], adds: list[Any]) -> None:
        """Fill in the bin of each row whose key is not remembered (``select`` picks)."""
        adders, bins = self.adders, self.bins
        for i, add in enumerate(adds):
            if add is not None:
                continue
            dst = self._field(rows[i])
            b = bins.get(dst)
            if b is None:
                b = bins[dst] = []
            adds[i] = b.append
            key = keys[i]
            if type(key) is str:
                if len(adders) >= KEY_CACHE:
                    adders.clear()
                adders[key] = b.append

    def _first(self, values: list[Any]) -> int:
        return self.hops[0]

    def _direct(self, values: list[Any]) -> int:
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

    def _no_single(self, values: list[Any]) -> int:
        raise ValueError(f"policy {self.route.policy!r} has no single receiver")

    def lb_slot(self) -> int:
        """Load-balancer slot for the next batch of the ``sdn`` policy: every slot in turn.

        The switch's select group maps each slot address to one worker (a fixed hash,
        ``controller/rules/groups.py``), so taking the 256 slots in turn (from a random
        start) gives every worker exactly its slots' share of every 256 batches.  Random
        slots gave it only on average: the split of a few seconds' frames wandered by
        several points, the receivers' queues with it, and a worker whose queue ran dry
        idled (docs/load_balancer.md).
        """
        slot = self.lb_next
        self.lb_next = (slot + 1) % LB_SLOTS
        return slot
