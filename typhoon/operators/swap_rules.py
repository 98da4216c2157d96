"""Which operators a worker can replace in place (``typhoon swap``), and how keyed state
goes over to the new one.

A swap in place ends the old instance inside its worker and opens the new one on the
same framework: routes, links, counters and the chain's function calls stay.  That is
only right when the framework holds nothing for the operator that the new one would
inherit or lose: an engine's output still in flight (``pump``, ``anchor_ready``) or
event-time callbacks and their timers (``on_watermark``, ``on_timer``,
``output_watermark``).  Checkpoints are the plan's and the worker's own checks
(``typhoon.reconfig.swap_in_place``, ``typhoon.runtime.operator_swap``).

Keyed state is the framework's, so it can outlive the instance: between two operators
that both declare their ``keyed_shape`` (mapping name -> the form of its values) the
new one goes on from the old one's mappings (:func:`keyed_carry`).  A mapping of the
same name and form is kept; a mapping only the new operator keeps starts empty; a
mapping whose form changes is rewritten value by value by the new operator's
``migrate_keyed``; a mapping the new operator does not keep, or a new form without a
migration, makes the swap a refusal, since state would be dropped or misread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

IN_PLACE_BLOCKERS = ("pump", "anchor_ready", "on_watermark", "on_timer", "output_watermark")


def in_place_blockers(operator: Any) -> list[str]:
    """The hooks of ``operator`` (a class or an instance) that keep it from a swap in place."""
    return [h for h in IN_PLACE_BLOCKERS if getattr(operator, h, None) is not None]


@dataclass
class KeyedCarry:
    """How keyed state goes from the old operator to the new one in a swap in place."""

    kept: list[str] = field(default_factory=list)  # same name, same form
    added: list[str] = field(default_factory=list)  # only the new operator's: start empty
    migrated: dict[str, Callable[[Any], Any]] = field(default_factory=dict)  # new form
    dropped: list[str] = field(default_factory=list)  # the new operator does not keep them
    refusal: str | None = None  # why it cannot be carried over at all (one sentence)

    def summary(self) -> dict[str, list[str]]:
        """What the worker's report says of the carry."""
        return {"kept": self.kept, "added": self.added, "migrated": sorted(self.migrated)}


def keyed_carry(
    old: tuple[str, Any, dict[str, Any]], new: tuple[str, Any, dict[str, Any]]
) -> KeyedCarry | None:
    """How the keyed state of ``old`` goes to ``new``, each (operator name, class, args);
    None when one of them declares no ``keyed_shape`` (nothing can be said of its state);
    ``refusal`` says why it cannot go over."""
    (a, _, _), (b, b_cls, b_args) = old, new
    carry = KeyedCarry()
    shapes = []
    for name, cls, args in (old, new):
        try:
            shape = cls.state_shape(args)
        except Exception as e:  # an operator's own code: its error is the reason
            carry.refusal = f"operator '{name}' cannot say its keyed_shape for {args}: {e}"
            return carry
        if shape is None:
            return None
        shapes.append(shape)
    before, after = shapes
    for name, tag in sorted(before.items()):
        if name not in after:
            carry.dropped.append(name)
        elif after[name] == tag:
            carry.kept.append(name)
        else:
            try:
                fn = b_cls.migrate_keyed(b_args, name, tag)
            except Exception as e:
                carry.refusal = f"operator '{b}' cannot say how it migrates '{name}': {e}"
                return carry
            if fn is None:
                carry.refusal = (
                    f"operator '{b}' keeps keyed state '{name}' as '{after[name]}' where "
                    f"'{a}' kept it as '{tag}', and declares no migration from it "
                    "(migrate_keyed)"
                )
                return carry
            carry.migrated[name] = fn
    carry.added = sorted(set(after) - set(before))
    return carry


def carry_refusal(carry: KeyedCarry, old: str, new: str) -> str | None:
    """The plan's reason to refuse a swap whose keyed state cannot go over (one sentence)."""
    if carry.refusal is not None:
        return carry.refusal
    if carry.dropped:
        return (
            f"operator '{new}' does not keep keyed state {carry.dropped} that '{old}' keeps, "
            "so the swap would drop it"
        )
    return None
