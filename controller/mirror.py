"""Mirror outputs for the live debugger: one host's rules in, the same rules with copies out.

A debug session observes one worker's input, output or both.  The switch
already has a rule for every path that traffic takes (``controller.flows``);
mirroring adds one output action, toward the debug worker's port, to exactly
the rules that carry the observed worker's data frames, and changes nothing
else.  The result replaces the host's rules as a whole, so "detach" is just
"stop applying the function": the next reconcile puts the original rules back,
cookie and all.

Which rules carry the observed traffic, on the observed worker's host:

* out: the rules matching ``in_port`` = the worker's port (and, by the
  anti-spoofing design, its ``eth_src``): LOCAL, REMOTE_SEND, MULTICAST, and
  any load-balancer rule an app adds for the worker's frames;
* in: the rules with an output to the worker's port: LOCAL and REMOTE_RECV
  unicast, MULTICAST toward local receivers.

Credit frames (flow control) and control tuples are never mirrored: only data
rules, recognised by their cookie, get a copy.  With the load balancer's ``sdn``
grouping, ``out`` copies the frame before the group picks a receiver (its
destination is still the balancer's virtual address), and ``in`` sees what
reaches the worker from another host (a REMOTE_RECV rule) but not what a group
bucket on the same bridge outputs to it directly.

A mirrored rule carries a MIRROR cookie (same app, worker and peer fields), so
``ovs-ofctl dump-flows`` shows every mirror and a delete by cookie mask finds them.
Pure Python, tested by forwarding frames through fake tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from controller.cookies import RuleKind, make_cookie, parse_cookie
from controller.flows import RuleSpec, output
from typhoon.wire import mac_str, worker_mac

DIRECTIONS = ("in", "out", "both")
DATA_KINDS = frozenset(
    {
        RuleKind.LOCAL,
        RuleKind.REMOTE_SEND,
        RuleKind.REMOTE_RECV,
        RuleKind.MULTICAST,
        RuleKind.LB_GROUP,
    }
)


@dataclass(frozen=True)
class MirrorTap:
    """Copy the data frames that ``worker_id`` (on ``worker_port``) sends and/or receives
    to ``debug_port`` of the same bridge."""

    app_id: int
    worker_id: int
    worker_port: int
    direction: str
    debug_port: int

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {self.direction!r}")

    def carries(self, rule: RuleSpec) -> bool:
        """Does ``rule`` forward data frames this tap observes?"""
        cookie = parse_cookie(rule.cookie)
        if cookie is None or cookie.credit or cookie.app_id != self.app_id:
            return False
        if cookie.kind not in DATA_KINDS or not rule.actions:
            return False
        if self.direction in ("out", "both"):
            m = rule.match_dict()
            mac = mac_str(worker_mac(self.app_id, self.worker_id))
            if m.get("in_port") == self.worker_port and m.get("eth_src") == mac:
                return True
        if self.direction in ("in", "both"):
            return output(self.worker_port) in rule.actions
        return False


def mirror_rule(rule: RuleSpec, debug_ports: Iterable[int]) -> RuleSpec:
    """``rule`` with one more output per debug port (after its own), under a MIRROR cookie."""
    extra = tuple(output(p) for p in sorted(set(debug_ports)) if output(p) not in rule.actions)
    c = parse_cookie(rule.cookie)
    assert c is not None, "only Typhoon data rules are mirrored"
    cookie = make_cookie(c.app_id, RuleKind.MIRROR, c.worker, c.aux)
    return replace(rule, actions=rule.actions + extra, cookie=cookie)


def apply_mirrors(rules: frozenset[RuleSpec], taps: Iterable[MirrorTap]) -> frozenset[RuleSpec]:
    """One host's complete rule set with the mirror outputs of ``taps`` (all on this host)."""
    taps = list(taps)
    if not taps:
        return rules
    out = set()
    for rule in rules:
        ports = [t.debug_port for t in taps if t.carries(rule)]
        out.add(mirror_rule(rule, ports) if ports else rule)
    return frozenset(out)


def mirrored(rules: Iterable[RuleSpec], tap: MirrorTap) -> list[RuleSpec]:
    """The rules one tap adds a copy to (for logs: what a session changes)."""
    return sorted((r for r in rules if tap.carries(r)), key=lambda r: (r.priority, repr(r.match)))
