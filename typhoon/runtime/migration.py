"""Key groups that move between running workers with their keyed state (a rescale).

The plan (``typhoon.reconfig.plan``) runs three steps per migration, each acked:

1. ``KEYGROUPS prepare`` to every worker that gives or takes groups.  A new
   owner starts *holding* the tuples of the groups it takes: they wait in
   arrival order until the groups' state is here.  An old owner learns which
   groups leave it, for whom, and which (sender, stream) handoffs to await.
2. ``ROUTING`` with ``handoff`` to the senders: each installs the new key-group
   table and then sends a *handoff* punctuation to every receiver of its old
   route, behind the last tuple it routed with the old table (same link, in
   order).
3. ``KEYGROUPS finish``: acked by a worker once its part is done.  An old
   owner that has every handoff (a sender that finished counts) has processed
   every tuple of the leaving groups: it takes their keys out of its keyed
   state and writes them, per new owner, to the checkpoint store
   (``migrations/<id>-<from>-<to>``).  A new owner polls for them, loads the
   keys and runs the held tuples, oldest first.

No SIGNAL flush is involved, and nothing but the moving groups waits: the
other keys go on being processed.

A worker *move* (``typhoon move``, ``typhoon.reconfig.move``) is the same
migration of all the old worker's groups, plus ``operator_out``/``operator_in``:
the old worker ships every key it holds, its operator's ``snapshot()`` and its
plain timers in the one blob, and from then on is retired (its operator
neither flushes nor reports a result; data that still reaches it is counted as
dropped); the new worker holds *every* tuple until the blob is loaded and the
operator restored.  A mixin of
:class:`typhoon.runtime.framework.Framework`, which holds the state it uses.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from typhoon.checkpoint import checkpoint_settings
from typhoon.runtime import checkpoints as ck
from typhoon.topology.keygroups import is_round

if TYPE_CHECKING:
    from typhoon.runtime.framework_parts import FrameworkParts
    from typhoon.runtime.keyed_state import KeyedStates

log = logging.getLogger(__name__)

POLL_S = 0.005  # how often a new owner looks for the state it waits for
MIGRATION_LOG = 32  # the last migrations (rounds of a stepwise one too) the metrics keep


@dataclass
class Migration:
    """This worker's part in one migration."""

    id: int
    out: dict[int, int]  # group -> new owner (state leaves once every handoff is in)
    incoming: dict[int, int]  # group -> old owner (tuples held until its state is here)
    expect: set[tuple[int, int]]  # (sender, stream) handoffs still awaited
    keys_out: dict[str, int] = field(default_factory=dict)  # direct-table keys leaving
    keys_in: dict[str, int] = field(default_factory=dict)  # direct-table keys coming
    pins: dict[str, bool] | None = None  # every key the new tables name: routed here?
    operator_to: int | None = None  # a move: the whole state (operator too) leaves for it
    operator_from: int | None = None  # a move: the whole state comes from it
    shipped: bool = False
    waiting: set[int] = field(default_factory=set)  # old owners whose state is not here yet
    ack: int | None = None  # version of the KEYGROUPS finish to ack once done
    started: float = field(default_factory=time.monotonic)
    pause_s: float = 0.0  # how long the moving groups' tuples waited here
    moved_bytes: int = 0
    moved_keys: int = 0
    # timings for the benchmark (docs/keyed_state.md "Metrics"): wall clock, so an old
    # owner's ship and a new owner's load on the same machine can be put side by side
    ship_started: float = 0.0  # time.time() the old owner began packing
    ship_ms: float = 0.0  # packing and writing every leaving group
    shipped_bytes: dict[int, int] = field(default_factory=dict)  # new owner -> bytes written
    loaded: dict[int, dict[str, float]] = field(default_factory=dict)  # old owner -> timings
    first_held: dict[int, float] = field(default_factory=dict)  # group -> first tuple held
    group_pause: dict[int, float] = field(default_factory=dict)  # group -> s its tuples waited

    @property
    def leaving(self) -> bool:
        return bool(self.out or self.keys_out or self.operator_to)

    @property
    def done(self) -> bool:
        return (self.shipped or not self.leaving) and not self.waiting


if TYPE_CHECKING:
    _Host = FrameworkParts
else:
    _Host = object  # at run time Framework is the host: nothing to inherit


class KeyedMigration(_Host):
    """Key groups leaving and joining this worker (see the module docstring)."""

    # keyed_cut.py starts it, this part reads and sets it (declared here: mypy cannot type
    # an attribute read before a subclass sets it)
    plan_version: int

    def _init_migration(self, store: Any = None) -> None:
        self.migration: Migration | None = None
        self.holding: dict[int, int] = {}  # group -> old owner, while its state travels
        self.holding_keys: dict[str, int] = {}  # direct-table key -> old owner, the same
        # (old owner waited for, sender, row) in arrival order
        self.held_rows: list[tuple[int, int, list[Any]]] = []
        # where moving state travels: the checkpoint store (opened when first needed)
        self._mig_store: Any = store if hasattr(store, "put_blob") else None
        self._next_poll = 0.0
        self.migrations_done = 0
        self.last_migration: dict[str, Any] = {}
        self.migration_log: dict[str, dict[str, Any]] = {}  # migration ID -> its figures
        self.hold_from: int | None = None  # a move: every tuple waits for this worker's state
        self.moved_to: int | None = None  # a move: this worker's state left for it

    # ----- control -------------------------------------------------------------------------

    def keygroups(self, body: dict[str, Any]) -> None:
        """A KEYGROUPS control tuple (prepare or finish)."""
        mid = body["migration"]
        m: Migration | None
        if body["phase"] == "prepare":
            moving = body.get("operator_out") or body.get("operator_in")
            if self.keyed is None and not moving:
                raise ValueError(
                    f"worker {self.worker_id} of '{self.node.name}' keeps no keyed state"
                )
            incoming = {int(g): w for g, w in body["in"].items()}
            out = {int(g): w for g, w in body["out"].items()}
            expect = {(s, st) for s, st in body["expect"] if s not in self.finished_upstream}
            m = Migration(mid, out, incoming, expect, body["keys_out"], body["keys_in"])
            m.operator_to, m.operator_from = body.get("operator_out"), body.get("operator_in")
            self.migration = m
            if not is_round(mid):  # an intermediate round installs no planned table
                self.plan_version = max(self.plan_version, mid)  # the table it installs
            m.waiting = set(incoming.values()) | set(m.keys_in.values())
            if m.operator_from is not None:
                m.waiting.add(m.operator_from)
                self.hold_from = m.operator_from
            self.holding.update(incoming)
            self.holding_keys.update(m.keys_in)
            m.pins = body.get("pins")
            if self.keyed is not None:
                self._prepare_keyed(m, self.keyed)
            self._ack("KEYGROUPS", body["version"])
            self._maybe_ship()
            return
        m = self.migration
        if m is None or m.id != mid:
            self._ack("KEYGROUPS", body["version"])  # nothing of ours moves in it
            return
        m.ack = body["version"]
        self._maybe_ship()
        self._migration_done()

    def _prepare_keyed(self, m: Migration, keyed: KeyedStates) -> None:
        keyed.owned |= set(m.incoming)
        if m.pins is None:  # a plan without the new tables' keys
            for k in m.keys_in:
                keyed.pinned[k] = True
        else:  # the keys the new tables name; leaving ones stay until shipped
            keyed.set_pins({**m.pins, **dict.fromkeys(m.keys_out, True)})

    def send_handoffs(self, stream: int, migration: int, hops: list[int]) -> None:
        """After a ROUTING with ``handoff``: the old receivers learn our old table ended."""
        self._broadcast_punctuation(ck.handoff_payload(stream, migration), sorted(hops))

    def _handoff_from(self, src: int, stream: int | None, migration: int | None) -> None:
        """A handoff (or the end of stream: ``stream`` None) arrived from ``src``."""
        m = self.migration
        if m is None or (migration is not None and migration != m.id):
            return
        if stream is None:
            m.expect = {(s, st) for s, st in m.expect if s != src}
        else:
            m.expect.discard((src, stream))
        self._maybe_ship()

    # ----- the old owner -------------------------------------------------------------------

    def _store(self) -> Any:
        if self._mig_store is None:
            from typhoon.checkpoint import open_store

            settings = checkpoint_settings(self.spec.topology)
            self._mig_store = open_store(settings.store_url, self.spec.topology.name)
        return self._mig_store

    def _maybe_ship(self) -> None:
        m = self.migration
        if m is None or m.shipped or not m.leaving or m.expect:
            return
        m.ship_started, t0 = time.time(), time.monotonic()
        by_dst: dict[int, tuple[set[int], set[str]]] = {}
        for g, dst in m.out.items():
            by_dst.setdefault(dst, (set(), set()))[0].add(g)
        for k, dst in m.keys_out.items():
            by_dst.setdefault(dst, (set(), set()))[1].add(k)
        if m.operator_to is not None:
            by_dst.setdefault(m.operator_to, (set(), set()))
        for dst, (groups, keys) in sorted(by_dst.items()):
            whole = dst == m.operator_to  # a move: every key, whatever its group
            moved: dict[str, Any] = {"epoch": self.epoch, "keyed": None}
            if self.keyed is not None:
                before = self.keyed.keys()
                # names a key that cannot be packed
                data = self.keyed.pack(
                    None if whole else groups, remove=True, keys=None if whole else keys
                )
                moved["keyed"] = data
                m.moved_keys += before - self.keyed.keys()
            if whole:
                moved["operator"] = self.op.snapshot()
                moved["timers"] = self.context.timers.snapshot()
            # with the newest epoch written before it left: a new owner's parts up to that
            # epoch would hold it twice (typhoon.runtime.keyed_cut)
            try:
                blob = msgpack.packb(moved, use_bin_type=True)
            except TypeError as e:  # only the operator's part is not bytes already
                raise TypeError(
                    f"operator '{self.node.operator}' of '{self.node.name}' (worker "
                    f"{self.worker_id}) cannot move to worker {dst}: its snapshot() is not "
                    f"msgpack-able plain data ({e})"
                ) from None
            self._store().put_blob(f"{m.id}-{self.worker_id}-{dst}", blob)
            size = len(moved["keyed"] or b"") if not whole else len(blob)
            m.moved_bytes += size
            m.shipped_bytes[dst] = size
        m.ship_ms = (time.monotonic() - t0) * 1000
        if self.keyed is not None:
            self._shipped_keyed(m, self.keyed)
        if m.operator_to is not None:  # retired: its state lives on the new worker now
            self.moved_to = m.operator_to
            self.context.timers.restore(None)
        m.shipped = True
        if not self._holding():
            self.watermark_released()  # held while the leaving keys were still here
        log.info(
            "worker %d: key groups %s left for %s (%d bytes)",
            self.worker_id, sorted(m.out), sorted(by_dst), m.moved_bytes,
        )  # fmt: skip
        self._migration_done()

    def _shipped_keyed(self, m: Migration, keyed: KeyedStates) -> None:
        keyed.owned -= set(m.out)
        if m.operator_to is not None:
            keyed.owned.clear()
        for k in m.keys_out:
            if m.pins is not None and k not in m.pins:
                keyed.pinned.pop(k, None)  # no table names it now: its group decides
            else:
                keyed.pinned[k] = False
        keyed.forget_checked()

    # ----- the new owner -------------------------------------------------------------------

    def _hold(self, src: int, rows: list[list[Any]]) -> list[list[Any]]:
        """The rows of groups and keys not moving here; the others wait for their state
        (held with the old owner they wait for)."""
        if self.hold_from is not None:  # a move: nothing runs before the operator's state
            m = self.migration
            if rows and m is not None and not m.first_held:  # every group waits from now
                m.first_held = dict.fromkeys(m.incoming, time.monotonic())
            self.held_rows.extend((self.hold_from, src, r) for r in rows)
            return []
        keyed, holding, held = self.keyed, self.holding, self.held_rows
        assert keyed is not None  # groups and keys wait for their state only with keyed state
        keys, key_str = self.holding_keys, keyed.key_str
        key, group_of = keyed.key, keyed.group_of
        first = self.migration.first_held if self.migration is not None else {}
        now = time.monotonic()
        kept = []
        for r in rows:
            try:
                k = key(r)
                g = None
                src_of = keys.get(key_str(k)) if keys else None
                if src_of is None:
                    g = group_of(k)
                    src_of = holding.get(g)
            except (IndexError, TypeError, ValueError):
                kept.append(r)  # the operator will say what is wrong with it
                continue
            if src_of is not None:
                held.append((src_of, src, r))
                if g is not None and g not in first:
                    first[g] = now
            else:
                kept.append(r)
        return kept

    def migration_tick(self) -> None:
        """Look for the state this worker waits for; run the held tuples it releases."""
        m = self.migration
        if m is None or not m.waiting or self.now < self._next_poll:
            return
        self._next_poll = self.now + POLL_S
        for src in sorted(m.waiting):
            name = f"{m.id}-{src}-{self.worker_id}"
            blob = self._store().get_blob(name)
            if blob is None:
                continue
            t0 = time.monotonic()
            moved = msgpack.unpackb(blob, raw=False, strict_map_key=False)  # snapshot keys
            data = moved["keyed"]
            self._moved_in(moved["epoch"])
            if self.keyed is not None:
                m.moved_keys += self.keyed.load(data)
            m.moved_bytes += len(data or b"") if src != m.operator_from else len(blob)
            if src == m.operator_from:  # a move: the operator resumes where it stopped
                self.op.restore(moved.get("operator"))
                self.context.timers.restore(moved.get("timers"))
                self.hold_from = None
            self._store().delete_blob(name)
            m.waiting.discard(src)
            done = time.monotonic()
            m.loaded[src] = {
                "at": time.time(),  # wall clock: against the old owner's ship_started
                "bytes": len(data or b"") if src != m.operator_from else len(blob),
                "load_ms": round((done - t0) * 1000, 3),
                "window_ms": round((done - m.started) * 1000, 3),  # since prepare
            }
            for g in [g for g, s in m.incoming.items() if s == src]:
                self.holding.pop(g, None)
                held_at = m.first_held.get(g)
                m.group_pause[g] = 0.0 if held_at is None else done - held_at
            for k in [k for k, s in m.keys_in.items() if s == src]:
                self.holding_keys.pop(k, None)
            release = [r for owner, _, r in self.held_rows if owner == src]
            self.held_rows = [h for h in self.held_rows if h[0] != src]
            if release:
                self._run(release)
        if not self._holding():
            self.watermark_released()
        if not m.waiting:
            m.pause_s = time.monotonic() - m.started
            self._migration_done()
            if self.input_done and not self.done and self._pump is None:
                self.finish()  # input ended while tuples waited here

    def _migration_done(self) -> None:
        m = self.migration
        if m is None or not m.done:
            return
        if not self.last_migration or self.last_migration.get("id") != m.id:
            self.migrations_done += 1
            self.last_migration = {
                "id": m.id,
                "out": len(m.out),
                "in": len(m.incoming),
                "keys_out": len(m.keys_out),
                "keys_in": len(m.keys_in),
                "keys": m.moved_keys,
                "bytes": m.moved_bytes,
                "pause_ms": round(m.pause_s * 1000, 3),
                # per group moved in: how long its first held tuple waited (0: none held)
                "group_pause_ms": {str(g): round(s * 1000, 3) for g, s in m.group_pause.items()},
                "ship_started": m.ship_started,
                "ship_ms": round(m.ship_ms, 3),
                "shipped": {str(w): n for w, n in m.shipped_bytes.items()},
                "loaded": {str(w): dict(t) for w, t in m.loaded.items()},
            }
            self.migration_log[str(m.id)] = self.last_migration
            while len(self.migration_log) > MIGRATION_LOG:
                del self.migration_log[next(iter(self.migration_log))]
        if m.ack is not None:
            self._ack("KEYGROUPS", m.ack)
            self.migration = None

    def _migration_metrics(self) -> dict[str, Any]:
        keyed = self.keyed
        assert keyed is not None  # (asked for only with keyed state)
        out: dict[str, Any] = {"keyed": {"groups": len(keyed.owned), "keys": keyed.keys()}}
        if self.held_rows:
            out["keyed"]["held"] = len(self.held_rows)
        if self.last_migration:
            out["keyed"]["migration"] = dict(self.last_migration)
            out["keyed"]["migrations"] = dict(self.migration_log)
        return out
