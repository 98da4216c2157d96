"""Keyed state owned by the framework (``Context.keyed_state``, docs/keyed_state.md).

An operator that declares ``keyed = True`` asks in ``open()`` for named
mappings whose keys are the values of its input's fields grouping (the value
for one field, a tuple for several).  Each key belongs to one key group
(``typhoon.topology.keygroups``) and each group to one worker: a mapping holds
the keys of its worker's groups only, and touching any other key raises
:class:`KeyNotOwned`.  The framework checkpoints the mappings with the
operator's snapshot, restores them on rollback, and hands whole groups to
another worker on a rescale (:meth:`KeyedStates.extract` / :meth:`load`).

The ownership check runs only when a key is not in the mapping yet (a key
present is owned, since a group leaves with all its keys), so the per-tuple
cost of a counter is one dict lookup more than a plain dict.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import msgpack

from typhoon.topology.keygroups import (
    KEY_ROUTED,
    key_fields_of,
    key_group,
    max_parallelism,
    owned_groups,
)

_NO_KEY = object()


class KeyNotOwned(LookupError):
    """A key of another worker's key group was read or written here."""


class KeyedStateError(ValueError):
    """Keyed state that cannot be stored or moved (not msgpack-able, wrong shape)."""


class KeyedState(MutableMapping[str, Any]):
    """One named mapping of keyed state; missing keys read as the default.

    ``default`` callable: ``default()`` is stored and returned for a missing
    key (like ``collections.defaultdict``); otherwise the default itself is
    returned and nothing is stored.
    """

    __slots__ = ("name", "data", "default", "factory", "owner")

    def __init__(self, name: str, default: Any, owner: KeyedStates) -> None:
        self.name = name
        self.data: dict[Any, Any] = {}
        self.default = default
        self.factory = callable(default)
        self.owner = owner

    def __getitem__(self, key: Any) -> Any:
        data = self.data
        if key in data:
            return data[key]
        self.owner.check(key)
        if self.factory:
            value = data[key] = self.default()
            return value
        return self.default

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self.data:
            self.owner.check(key)
        self.data[key] = value

    def __delitem__(self, key: Any) -> None:
        if key not in self.data:
            self.owner.check(key)
        del self.data[key]

    def __contains__(self, key: object) -> bool:
        if key in self.data:
            return True
        self.owner.check(key)
        return False

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self.data:
            return self.data[key]
        self.owner.check(key)
        return default

    def __iter__(self) -> Iterator[Any]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"KeyedState({self.name!r}, {len(self.data)} keys)"


class KeyedStates:
    """Every keyed mapping of one worker, and the key groups it owns."""

    def __init__(
        self,
        operator: str,
        node: str,
        worker_id: int,
        key_indexes: list[int],
        groups: int,
        owned: set[int],
    ) -> None:
        self.operator, self.node, self.worker_id = operator, node, worker_id
        self.key_indexes = list(key_indexes)
        self.width = len(key_indexes)
        self.groups = groups
        self.owned = set(owned)
        self.stores: dict[str, KeyedState] = {}
        # direct grouping: a key its table names goes to that worker whatever its group
        # (str(key) as the table spells it -> True if this worker is the one)
        self.pinned: dict[str, bool] = {}
        self._ok: Any = _NO_KEY  # the last key found owned (a counter asks twice per new key)

    # ----- the operator's view -------------------------------------------------------------

    def state(self, name: str, default: Any = None) -> KeyedState:
        if not isinstance(name, str) or not name:
            raise ValueError("keyed_state needs a non-empty name")
        store = self.stores.get(name)
        if store is None:
            store = self.stores[name] = KeyedState(name, default, self)
        else:  # a rollback opens a new instance of the operator over the same mappings
            store.default, store.factory = default, callable(default)
        return store

    def key(self, values: list[Any]) -> Any:
        """The key of an input tuple, as keyed state holds it."""
        if self.width == 1:
            return values[self.key_indexes[0]]
        return tuple(values[i] for i in self.key_indexes)

    def group_of(self, key: Any) -> int:
        return key_group(key_fields_of(key, self.width), self.groups)

    def check(self, key: Any) -> None:
        """Raise :class:`KeyNotOwned` unless ``key``'s group belongs to this worker."""
        if key is self._ok:
            return
        if self.width > 1 and not isinstance(key, tuple):
            raise KeyNotOwned(
                f"operator '{self.operator}' of '{self.node}': keyed state is keyed by "
                f"{self.width} fields, so a key is a tuple of {self.width} values, "
                f"not {key!r}"
            )
        if self.pinned:
            mine = self.pinned.get(str(key) if self.width == 1 else str(list(key)))
            if mine is not None:
                if not mine:
                    raise KeyNotOwned(
                        f"operator '{self.operator}' of '{self.node}' (worker "
                        f"{self.worker_id}) touched key {key!r}, which the direct grouping's "
                        "table sends to another worker"
                    )
                self._ok = key
                return
        try:
            g = self.group_of(key)
        except (TypeError, ValueError) as e:
            raise KeyNotOwned(
                f"operator '{self.operator}' of '{self.node}': {key!r} cannot be a key ({e})"
            ) from None
        if g not in self.owned:
            raise KeyNotOwned(
                f"operator '{self.operator}' of '{self.node}' (worker {self.worker_id}) touched "
                f"key {key!r} of key group {g}, which another worker owns: keyed state holds "
                "only the keys routed to this worker"
            )
        self._ok = key

    # ----- the framework's view ------------------------------------------------------------

    def set_pins(self, pins: dict[str, bool]) -> None:
        """The keys the input's ``direct`` tables name (their spelling) -> whether they are
        routed here; every other key is owned by its group."""
        self.pinned = dict(pins)
        self._ok = _NO_KEY

    def forget_checked(self) -> None:
        """Ownership changed: the last key found owned must be checked again."""
        self._ok = _NO_KEY

    def keys(self) -> int:
        return sum(len(s.data) for s in self.stores.values())

    def held_groups(self) -> dict[int, int]:
        """Keys held here per key group (where the state really is), by group; keys a
        ``direct`` table names are left out (:meth:`held_pinned` has them)."""
        held: dict[int, int] = {}
        for s in self.stores.values():
            for k in s.data:
                if self.pinned and self.key_str(k) in self.pinned:
                    continue
                g = self.group_of(k)
                held[g] = held.get(g, 0) + 1
        return dict(sorted(held.items()))

    def held_pinned(self) -> dict[str, int]:
        """The keys held here that a ``direct`` table names (as it spells them): 1 if the
        table sends the key here, 0 if it sends it to another worker (a misplaced key)."""
        out: dict[str, int] = {}
        for s in self.stores.values():
            for k in s.data:
                mine = self.pinned.get(self.key_str(k)) if self.pinned else None
                if mine is not None:
                    out[self.key_str(k)] = int(mine)
        return dict(sorted(out.items()))

    def reset(self) -> None:
        """Forget every key (a rollback restores them from the checkpoint)."""
        for s in self.stores.values():
            s.data.clear()
        self._ok = _NO_KEY

    def key_str(self, key: Any) -> str:
        """The key as a direct grouping's table spells it."""
        return str(key) if self.width == 1 else str(list(key))

    def _selected(self, key: Any, groups: set[int] | None, keys: set[str] | None) -> bool:
        if groups is None and keys is None:
            return True
        if keys and self.key_str(key) in keys:
            return True
        if groups and self.group_of(key) in groups:
            # a key a direct table pins here stays, whatever its group does
            return not (self.pinned and self.pinned.get(self.key_str(key)))
        return False

    def entries(
        self,
        groups: set[int] | None = None,
        remove: bool = False,
        keys: set[str] | None = None,
    ) -> dict[str, Any]:
        """``{name: [[key, value], ...]}`` of the keys in ``groups`` or ``keys`` (their
        table spelling); both None: every key."""
        out: dict[str, list[Any]] = {}
        for name, s in self.stores.items():
            rows = [[k, v] for k, v in s.data.items() if self._selected(k, groups, keys)]
            if remove:
                for k, _ in rows:
                    del s.data[k]
            out[name] = rows
        self._ok = _NO_KEY
        return out

    def pack(
        self,
        groups: set[int] | None = None,
        remove: bool = False,
        keys: set[str] | None = None,
    ) -> bytes:
        """The keys of ``groups`` or ``keys`` (both None: all) as msgpack bytes; a value or
        key msgpack cannot carry raises :class:`KeyedStateError` naming the operator, key
        and type."""
        entries = self.entries(groups, keys=keys)
        try:
            data: bytes = msgpack.packb(entries, use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            raise self._unpackable(entries) from None
        if remove:
            self.entries(groups, remove=True, keys=keys)
        return data

    def _unpackable(self, entries: dict[str, Any]) -> KeyedStateError:
        for name, rows in entries.items():
            for k, v in rows:
                for what, obj in (("key", k), ("value", v)):
                    bad = _bad_type(obj)
                    if bad is not None:
                        where = "" if what == "key" else f" of key {k!r}"
                        return KeyedStateError(
                            f"operator '{self.operator}' of '{self.node}' (worker "
                            f"{self.worker_id}): keyed state '{name}' holds a {what}{where} of "
                            f"type {bad}, which msgpack cannot serialize (use plain data: "
                            "numbers, strings, bytes, lists, dicts)"
                        )
        return KeyedStateError(
            f"operator '{self.operator}' of '{self.node}': keyed state cannot be serialized"
        )

    def load(self, data: bytes | dict[str, Any] | None) -> int:
        """Add the keys of :meth:`pack` output; returns how many."""
        if data is None:
            return 0
        entries = (
            msgpack.unpackb(data, raw=False, strict_map_key=False)
            if isinstance(data, (bytes, bytearray))
            else data
        )
        n = 0
        for name, rows in entries.items():
            store = self.stores.get(name)
            if store is None:
                store = self.stores[name] = KeyedState(name, None, self)
            for k, v in rows:
                if self.width > 1 or type(k) is list:
                    k = _tuple(k)
                store.data[k] = v
                n += 1
        return n

    def load_owned(self, data: bytes | dict[str, Any] | None) -> int:
        """Add the keys of :meth:`pack` output that this worker owns (another worker's
        checkpoint of before a rescale); returns how many."""
        if data is None:
            return 0
        entries = (
            msgpack.unpackb(data, raw=False, strict_map_key=False)
            if isinstance(data, (bytes, bytearray))
            else data
        )
        mine: dict[str, list[Any]] = {}
        for name, rows in entries.items():
            kept = mine[name] = []
            for k, v in rows:
                if self.width > 1 or type(k) is list:
                    k = _tuple(k)
                try:
                    self.check(k)
                except KeyNotOwned:
                    continue
                kept.append([k, v])
        return self.load(mine)

    def restore(self, data: bytes | dict[str, Any] | None) -> None:
        self.reset()
        self.load(data)


def _tuple(v: Any) -> Any:
    """msgpack turns tuples into lists; keys of several fields are tuples again."""
    return tuple(_tuple(x) for x in v) if type(v) is list else v


def _bad_type(obj: Any) -> str | None:
    """Name of the first type in ``obj`` msgpack cannot pack, or None."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, bytearray)):
        if isinstance(obj, int) and not isinstance(obj, bool) and not -(2**63) <= obj < 2**64:
            return "int (beyond 64 bits)"
        return None
    if isinstance(obj, (list, tuple)):
        for x in obj:
            bad = _bad_type(x)
            if bad is not None:
                return bad
        return None
    if isinstance(obj, dict):
        for k, v in obj.items():
            bad = _bad_type(k) or _bad_type(v)
            if bad is not None:
                return bad
        return None
    return type(obj).__name__


def keyed_states(topology: Any, physical: Any, worker_id: int) -> KeyedStates | None:
    """The keyed state of ``worker_id``: its groups in ``physical``; None when its node's
    input is not key-routed (its first input stream gives the key fields)."""
    me = physical.by_id(worker_id)
    ins = topology.inputs_of(me.node)
    if not ins or any(s.grouping.type not in KEY_ROUTED for s in ins):
        return None
    first = ins[0]
    produced = list(topology.nodes[first.src].output_fields)
    indexes = [produced.index(f) for f in first.grouping.fields if f in produced]
    if len(indexes) != len(first.grouping.fields):
        return None
    node = topology.nodes[me.node]
    states = KeyedStates(
        node.operator,
        me.node,
        worker_id,
        indexes,
        max_parallelism(topology, me.node),
        owned_groups(topology, physical, me.node, worker_id),
    )
    receivers = physical.active_of_node(me.node)
    for s in ins:
        for k, index in s.grouping.table.items():
            if 0 <= index < len(receivers):
                states.pinned[str(k)] = receivers[index].worker_id == worker_id
    return states
