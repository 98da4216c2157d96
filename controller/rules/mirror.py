"""Mirror outputs for the live debugger: one host's rules in, the same rules with copies out.

A debug session observes one worker's input, output or both.  The switch
already has a rule for every path that traffic takes (``controller.rules.flows``);
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

Sampling in the switch.  The copy does not go straight to the debug port: the
mirrored rule keeps its own actions and adds ``goto_table:1``; table 1 holds,
for each mirrored rule (same priority and match), the session's meter
(``controller/rules/meters.py``: ``rate`` frames/s, drop above) and then the output to
the debug port.  OVS executes ``<own outputs>,meter(N),<debug port>``: the
observed frame is always forwarded, the copy only when the meter lets it
through, so unsampled frames are never output toward the debug worker.  When
several sessions copy the same rule, they are chained through tables 1, 2, ...
(a meter drops everything after it, so they cannot sit side by side): fastest
rate first, so each session still gets min(its rate, the offered rate) frames
per second, a subsample of the sessions before it.

Every frame.  A session asked with ``rate`` None (``typhoon debug attach --rate
all``) has no meter: its table-1 entry outputs every copy, as the paper's
Fig. 12 mirror does.  It sorts first in a chain (it is the fastest), so the
metered sessions after it still sample the same frames.  What the debug port
cannot take is dropped by the switch and counted (the port's ``tx_dropped``).

Pure Python, tested by forwarding frames through fake tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from controller.rules.cookies import RuleKind, make_cookie, parse_cookie
from controller.rules.flows import RuleSpec, goto_table, meter, output
from controller.rules.meters import MeterSpec, meter_id, sampling_meter
from typhoon.wire import mac_str, worker_mac

DIRECTIONS = ("in", "out", "both")
DEFAULT_RATE = 200  # frames/s a session gets unless it asks: a debug worker keeps up with it
EVERY_FRAME = "all"  # what a request says for no meter (every frame copied): rate None here
MIRROR_TABLE = 1  # the first table of the sampled copies
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
    rate: int | None = DEFAULT_RATE  # frames/s the switch copies at most (its meter); None: all

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {self.direction!r}")

    @property
    def meter(self) -> MeterSpec | None:
        """The session's sampling meter; None when every frame is copied."""
        return None if self.rate is None else sampling_meter(self.debug_port, self.rate)

    @property
    def speed(self) -> float:
        """Frames/s at most, for ordering a chain: an unmetered session is the fastest."""
        return float("inf") if self.rate is None else float(self.rate)

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


def _mirror_cookie(rule: RuleSpec) -> int:
    c = parse_cookie(rule.cookie)
    assert c is not None, "only Typhoon data rules are mirrored"
    return make_cookie(c.app_id, RuleKind.MIRROR, c.worker, c.aux)


def mirror_rule(rule: RuleSpec, taps: Iterable[MirrorTap]) -> list[RuleSpec]:
    """``rule`` sending a copy on to table 1, and the chain of metered copies there.

    Fastest session first (unmetered before any meter, then by port, so the result is
    deterministic); a second session on the same debug port adds nothing.
    """
    chain: list[MirrorTap] = []
    for t in sorted(taps, key=lambda t: (-t.speed, t.debug_port)):
        if all(t.debug_port != c.debug_port for c in chain):
            chain.append(t)
    cookie = _mirror_cookie(rule)
    out = [replace(rule, actions=rule.actions + (goto_table(MIRROR_TABLE),), cookie=cookie)]
    for k, t in enumerate(chain):
        table = MIRROR_TABLE + k
        more = (goto_table(table + 1),) if k + 1 < len(chain) else ()
        metered = () if t.rate is None else (meter(meter_id(t.debug_port)),)
        actions = (*metered, output(t.debug_port), *more)
        out.append(RuleSpec(rule.priority, rule.match, actions, cookie, table_id=table))
    return out


def apply_mirrors(rules: frozenset[RuleSpec], taps: Iterable[MirrorTap]) -> frozenset[RuleSpec]:
    """One host's complete rule set with the sampled copies of ``taps`` (all on this host).

    The meters the result points at are :func:`mirror_meters` of the same taps."""
    taps = list(taps)
    if not taps:
        return rules
    out: set[RuleSpec] = set()
    for rule in rules:
        carrying = [t for t in taps if t.carries(rule)]
        if carrying:
            out.update(mirror_rule(rule, carrying))
        else:
            out.add(rule)
    return frozenset(out)


def mirror_meters(taps: Iterable[MirrorTap]) -> frozenset[MeterSpec]:
    """The meter of each metered tap (one per debug port) of one host."""
    return frozenset(m for t in taps if (m := t.meter) is not None)


def mirrored(rules: Iterable[RuleSpec], tap: MirrorTap) -> list[RuleSpec]:
    """The rules one tap adds a copy to (for logs: what a session changes)."""
    return sorted((r for r in rules if tap.carries(r)), key=lambda r: (r.priority, repr(r.match)))
