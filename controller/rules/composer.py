"""Every bridge's desired rules and groups, composed from the view and the apps' sources.

Apps (and the reconfiguration executor) contribute to the switches through one
door, :meth:`RuleComposer.set` / :meth:`RuleComposer.clear`, with a
:class:`Source` saying how the contribution combines with the topology's rules:

* ``EXTRA``: rules besides the topology's (keyed by host); an extra rule replaces
  the compiled rule with the same match.
* ``GROUPS``: a function of the view returning OpenFlow groups and the rules
  that use them, called again on every recompute so groups follow the workers.
* ``KEPT``: rules that stay installed through a reconfiguration unless a
  current rule has their match.
* ``OVERLAY``: a rewrite of each host's final rules (the live debugger's
  mirror outputs), applied last so it follows every other change in the same step.
* ``METERS``: OpenFlow meters by host (the live debugger's sampling); an owner
  sets them before an overlay that uses them and clears them after.

Pure: the core (``controller/core.py``) recomputes and reconciles after each change.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Any

from controller.rules.flows import RuleSpec, compile_default_rules
from controller.rules.groups import GroupSpec
from controller.rules.meters import MeterSpec
from controller.rules.view import ClusterView

DEFAULT_RULES = frozenset(compile_default_rules())

RulesByHost = dict[str, frozenset[RuleSpec]]
GroupsByHost = dict[str, frozenset[GroupSpec]]
MetersByHost = dict[str, frozenset[MeterSpec]]
# (host, its complete rule set) -> the rule set to install instead
Overlay = Callable[[str, frozenset[RuleSpec]], frozenset[RuleSpec]]
# view -> (host -> groups, host -> rules that point at them)
GroupProvider = Callable[[ClusterView], tuple[GroupsByHost, RulesByHost]]


class Source(enum.Enum):
    """How one owner's contribution combines with the rest (see the module docstring)."""

    EXTRA = "extra"  # RulesByHost
    GROUPS = "groups"  # GroupProvider
    KEPT = "kept"  # RulesByHost
    OVERLAY = "overlay"  # Overlay
    METERS = "meters"  # MetersByHost


def _union(into: dict[str, frozenset[Any]], add: dict[str, frozenset[Any]]) -> None:
    for host, items in add.items():
        into[host] = into.get(host, frozenset()) | items


class RuleComposer:
    """The apps' contributions, by source and owner, and what they compose to."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.sources: dict[Source, dict[str, Any]] = {s: {} for s in Source}
        self.logger = logger or logging.getLogger(__name__)

    def set(self, source: Source, owner: str, value: Any) -> None:
        """Replace ``owner``'s contribution of kind ``source``."""
        self.sources[source][owner] = dict(value) if isinstance(value, dict) else value

    def clear(self, source: Source, owner: str) -> bool:
        """Drop ``owner``'s contribution; False if it had none (nothing to recompute)."""
        return self.sources[source].pop(owner, None) is not None

    def compose(self, view: ClusterView) -> tuple[RulesByHost, GroupsByHost]:
        """Every host's rules and groups; one owner's failing function is skipped."""
        merged: RulesByHost = {}
        groups: GroupsByHost = {}
        for owner, provider in self.sources[Source.GROUPS].items():
            try:
                by_host, rules = provider(view)
            except Exception:  # one app's bug must not keep the topology's rules out
                self.logger.exception("group provider of %s failed; skipped", owner)
                continue
            _union(groups, by_host)
            _union(merged, rules)
        for per_host in self.sources[Source.EXTRA].values():
            _union(merged, per_host)
        desired = view.desired(merged)
        for per_host in self.sources[Source.KEPT].values():
            for host, rules in per_host.items():
                # rules kept through a reconfiguration yield to the current ones (same match)
                have = desired.get(host, DEFAULT_RULES)
                keys = {r.key for r in have}
                desired[host] = have | {r for r in rules if r.key not in keys}
        for owner, overlay in self.sources[Source.OVERLAY].items():
            try:
                desired = {host: overlay(host, rules) for host, rules in desired.items()}
            except Exception:  # one app's bug must not keep the topology's rules out
                self.logger.exception("rule overlay of %s failed; skipped", owner)
        return desired, groups

    def meters(self) -> MetersByHost:
        """Every host's meters (the union of the owners')."""
        out: MetersByHost = {}
        for per_host in self.sources[Source.METERS].values():
            _union(out, per_host)
        return out
