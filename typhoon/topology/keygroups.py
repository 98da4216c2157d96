"""Key groups: one hash decides where a key is routed and which worker owns its state.

Flink's scheme: the key space is hashed into ``max_parallelism`` groups
(``config: {max_parallelism: N}`` on the node or the topology, default 128),
and each group belongs to one worker of the receiving node.  Senders route a
tuple to its group's owner; the owner's keyed state (``Context.keyed_state``)
holds the keys of its groups only.  A rescale moves whole groups, with their
state, so routing and ownership never disagree.

The group -> worker table is part of the physical topology
(``PhysicalTopology.key_groups``: node -> worker *index* per group, so a
replacement with a new worker ID keeps its groups) and changes at run time.
Pure functions, shared by the workers, the controller and the tcp runner.
"""

from __future__ import annotations

import threading
import zlib
from typing import Any

import msgpack

from .config import DEFAULTS

DEFAULT_MAX_PARALLELISM = DEFAULTS.max_parallelism  # declared in typhoon/topology/config.py
KEY_ROUTED = ("fields", "direct")  # groupings that route by key fields


# One Packer per thread: ``packb`` builds a Packer per call, which cost more than the
# rest of a fields-grouped emit; a Packer is not thread-safe, so each thread has its own.
_local = threading.local()


def stable_hash(key: list | tuple) -> int:
    """Hash of key field values that is equal in every process and run.

    Python's ``hash()`` is salted per process, so two senders would disagree
    on where a key goes; crc32 of the msgpack bytes does not.  The value is
    ``zlib.crc32(msgpack.packb(key, use_bin_type=True))`` (a tuple packs as
    the list of its items), computed with a reused Packer.
    """
    try:
        pack = _local.pack
    except AttributeError:
        pack = _local.pack = msgpack.Packer(use_bin_type=True).pack
    return zlib.crc32(pack(key))


def key_group(key: list, groups: int) -> int:
    """The group of a key given as the list of its field values."""
    return stable_hash(key) % groups


def key_fields_of(key: Any, fields: int) -> list:
    """A keyed-state key (a value, or a tuple for several fields) as the list hashed."""
    return list(key) if fields > 1 else [key]


def max_parallelism(topology: Any, node: str) -> int:
    """Key groups of ``node``: its own ``config.max_parallelism``, else the topology's."""
    n = topology.nodes[node]
    value = (getattr(n, "config", None) or {}).get("max_parallelism")
    if value is None:
        value = (topology.config or {}).get("max_parallelism", DEFAULT_MAX_PARALLELISM)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_parallelism of '{node}' must be an integer >= 1, not {value!r}")
    return value


def default_table(groups: int, workers: int) -> list[int]:
    """Contiguous ranges of groups per worker index (Flink's default assignment)."""
    if workers < 1:
        return []
    return [g * workers // groups for g in range(groups)]


def rebalance(table: list[int], workers: int) -> list[int]:
    """A new table for ``workers`` indexes that moves as few groups as possible.

    Every index ends with ``len(table) // workers`` or one more group; a group
    keeps its owner when that owner stays and is not over its share.
    """
    groups = len(table)
    if workers < 1:
        return []
    have = [0] * workers
    for owner in table:
        if 0 <= owner < workers:
            have[owner] += 1
    # the extra groups go to whoever holds most already, so a balanced table stays as it is
    base, extra = divmod(groups, workers)
    richest = sorted(range(workers), key=lambda i: (-have[i], i))[:extra]
    quota = [base + (1 if i in richest else 0) for i in range(workers)]
    held = [0] * workers
    out = [-1] * groups
    for g, owner in enumerate(table):
        if 0 <= owner < workers and held[owner] < quota[owner]:
            out[g] = owner
            held[owner] += 1
    free = iter([i for i in range(workers) for _ in range(quota[i] - held[i])])
    for g in range(groups):
        if out[g] < 0:
            out[g] = next(free)
    return out


def moves(old: list[int], new: list[int]) -> dict[int, tuple[int, int]]:
    """Group -> (old index, new index) for every group whose owner changes."""
    return {g: (a, b) for g, (a, b) in enumerate(zip(old, new, strict=True)) if a != b}


def table_of(topology: Any, physical: Any, node: str) -> list[int]:
    """Worker index per key group of ``node``: the physical topology's table if it has
    one that fits the node's key groups, else the default for its parallelism (not for
    the workers active now: a dead worker routed around must not move every group)."""
    groups = max_parallelism(topology, node)
    table = (getattr(physical, "key_groups", None) or {}).get(node)
    if table is not None and len(table) == groups:
        return list(table)
    return default_table(groups, topology.nodes[node].parallelism)


NO_OWNER = -1  # a group whose worker is gone (a dead worker routed around): not routed


def owners(topology: Any, physical: Any, node: str) -> list[int]:
    """Worker ID per key group of ``node`` (only active workers).

    A group whose index has no active worker (a dead worker routed around
    before its replacement runs) has :data:`NO_OWNER`: its tuples are counted
    as unrouted rather than handed to a worker that does not own their state
    (under a guarantee the rollback replays them to the replacement).
    """
    active = physical.active_of_node(node)
    if not active:
        return []
    by_index = {w.index: w.worker_id for w in active}
    return [by_index.get(i, NO_OWNER) for i in table_of(topology, physical, node)]


def owned_groups(topology: Any, physical: Any, node: str, worker_id: int) -> set[int]:
    """The key groups ``worker_id`` of ``node`` owns in ``physical``."""
    return {g for g, w in enumerate(owners(topology, physical, node)) if w == worker_id}


# a stepwise migration's intermediate round (typhoon.reconfig.steps) has the ID
# (version << ROUND_BITS) | round: never a table version
ROUND_BITS = 20


def round_id(version: int, index: int) -> int:
    """The migration ID of intermediate round ``index`` (from 0) of the update installing
    ``version``; the last round uses ``version`` itself.  Never a table version, so no
    blob name or handoff of one round can be taken for another's."""
    return (version << ROUND_BITS) | (index + 1)


def update_of(migration: int) -> int:
    """The table version of the update a migration ID (a round's or the last) belongs to."""
    return migration >> ROUND_BITS if migration >> ROUND_BITS else migration


def is_round(migration: int) -> bool:
    """An intermediate round's migration ID (it installs no planned table version)."""
    return migration >> ROUND_BITS != 0
