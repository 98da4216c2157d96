"""Desired rules vs. installed rules -> the smallest set of flow mods (docs/design.md §5).

This is what keeps the controller stateless and restartable: on connect (or
after any change) it reads the switch's flow table, compiles what the table
should hold, and sends only the difference. Rules that are already right are
not touched, so their counters survive and no packet sees a gap.

A rule is identified as OpenFlow's strict commands identify it: (table,
priority, match). Per key:

* desired, not installed                       -> add
* installed with other actions, same cookie    -> modify (MODIFY_STRICT keeps counters)
* installed with another cookie                -> add: OpenFlow 1.3 MODIFY never changes
  a cookie, but ADD of an identical (table, priority, match) atomically replaces the
  entry, cookie included; this also reclaims a key held by someone else's rule
* installed, not desired, owned by us          -> delete (DELETE_STRICT)
* installed, not desired, someone else's       -> left alone
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from controller.rules.cookies import is_typhoon
from controller.rules.flows import RuleSpec


@dataclass(frozen=True)
class Plan:
    """Flow mods to send, each tuple sorted so the same inputs give the same messages."""

    add: tuple[RuleSpec, ...] = ()
    modify: tuple[RuleSpec, ...] = ()
    delete: tuple[RuleSpec, ...] = ()

    def __bool__(self) -> bool:
        """True if there is anything to send."""
        return bool(self.add or self.modify or self.delete)

    def __len__(self) -> int:
        return len(self.add) + len(self.modify) + len(self.delete)


def _order(rule: RuleSpec) -> tuple[Any, ...]:
    """Sort key that never compares a str with an int (e.g. masked vs. plain eth_dst)."""
    return rule.table_id, rule.priority, repr(rule.match), repr(rule.actions), rule.cookie


def diff(
    desired: Iterable[RuleSpec],
    installed: Iterable[RuleSpec],
    owned: Callable[[int], bool] = is_typhoon,
) -> Plan:
    """What to add, modify and delete so the switch holds `desired` (module docstring).

    `owned(cookie)` says which installed rules we may delete; by default every
    Typhoon rule. Two desired rules with one key are a bug upstream: ValueError.
    """
    want: dict[tuple[Any, ...], RuleSpec] = {}
    for rule in desired:
        other = want.setdefault(rule.key, rule)
        if other != rule:
            raise ValueError(f"two desired rules for one flow entry: {other} and {rule}")
    have = {rule.key: rule for rule in installed}

    add, modify, delete = [], [], []
    for key, rule in want.items():
        old = have.get(key)
        if old is None or old.cookie != rule.cookie:
            add.append(rule)
        elif old.actions != rule.actions:
            modify.append(rule)
    for key, rule in have.items():
        if key not in want and owned(rule.cookie):
            delete.append(rule)
    return Plan(
        tuple(sorted(add, key=_order)),
        tuple(sorted(modify, key=_order)),
        tuple(sorted(delete, key=_order)),
    )
