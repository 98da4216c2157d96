"""Routing policies of the framework layer (paper Listing 1, docs/design.md §4).

A :class:`Router` holds one output stream's routing state and picks the
receiving worker(s) of each tuple.  The state is replaced wholesale by a
ROUTING control tuple, so a policy change is one assignment in the worker.
"""

from __future__ import annotations

import random
import zlib

import msgpack

from typhoon.topology.routing import Route

LB_SLOTS = 256


def stable_hash(key: list) -> int:
    """Hash of key field values that is equal in every process and run.

    Python's ``hash()`` is salted per process, so two senders would disagree
    on where a key goes; crc32 of the msgpack bytes does not.
    """
    return zlib.crc32(msgpack.packb(key, use_bin_type=True))


class Router:
    """Chooses receivers for one output stream.

    ``select(values)`` returns one worker ID; ``broadcast`` routers send every
    tuple to all ``next_hops`` instead (the caller handles that case).
    """

    __slots__ = ("route", "hops", "n", "counter", "fields", "local", "broadcast", "rng")

    def __init__(self, route: Route) -> None:
        self.route = route
        self.hops = list(route.next_hops)
        self.n = len(self.hops)
        self.counter = 0
        self.fields = list(route.fields)
        self.local = list(route.local)
        self.broadcast = route.policy == "all"
        self.rng = random.Random(0x7479 + route.stream)

    def select(self, values: list) -> int:
        """Receiving worker ID for a unicast policy; ``-1`` when there is none."""
        n = self.n
        if n == 0:
            return -1
        policy = self.route.policy
        if policy == "shuffle" or policy == "sdn":
            self.counter += 1
            return self.hops[self.counter % n]
        if policy == "fields":
            return self.hops[stable_hash([values[i] for i in self.fields]) % n]
        if policy == "global":
            return self.hops[0]
        if policy == "local_or_shuffle":
            pool = self.local or self.hops
            self.counter += 1
            return pool[self.counter % len(pool)]
        if policy == "direct":
            key = [values[i] for i in self.fields]
            dst = self.route.table.get(str(key[0]) if len(key) == 1 else str(key))
            if dst is not None:
                return dst
            return self.hops[stable_hash(key) % n]
        raise ValueError(f"policy {policy!r} has no single receiver")

    def lb_slot(self) -> int:
        """Random load-balancer slot for the ``sdn`` policy (bounded set of addresses)."""
        return self.rng.randrange(LB_SLOTS)
