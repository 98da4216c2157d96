"""OpenFlow 1.3 meters as data: the live debugger's per-session sampling in the switch.

A debug session's copies leave table 0 by ``goto_table`` and pass the
session's meter (a packets-per-second band of type drop) before the output
toward the debug port (``controller/rules/mirror.py``), so the switch copies at most
``rate`` frames per second (plus ``burst``) to the debug worker and never
outputs the others: the debug worker cannot fall behind, whatever the observed
worker sends.  Measured on OVS 3.1 (userspace datapath): ``meter-features``
reports pktps, burst and stats; ``ofproto/trace`` of a mirrored frame gives the
datapath actions ``<original outputs>,meter(N),<debug port>``: the meter drops
only what comes after it, never the original output.

Meter ids, like group ids and cookies, say whose a meter is: ours are
``METER_BASE + debug port`` (a debug port is at most 0xFEFF, and OVS accepts ids
up to 262,144), so a stateless controller reconciles its meters and leaves
others alone.  Pure Python, no Ryu: ``controller/ofp.py`` translates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

METER_BASE = 0x20000  # ours: METER_BASE .. METER_BASE + 0xFEFF
MAX_PORT = 0xFEFF
MAX_RATE = 1_000_000  # frames/s: more than any mirror copy rate this emulation reaches


def meter_id(debug_port: int) -> int:
    """The meter of the session whose debug worker sits on ``debug_port``."""
    if not 0 < debug_port <= MAX_PORT:
        raise ValueError(f"debug port {debug_port} out of range 1..{MAX_PORT}")
    return METER_BASE + debug_port


def is_typhoon_meter(mid: int) -> bool:
    return METER_BASE < mid <= METER_BASE + MAX_PORT


@dataclass(frozen=True)
class MeterSpec:
    """One meter: a single drop band of ``rate`` packets/s with a ``burst`` of packets."""

    meter_id: int
    rate: int
    burst: int

    def __post_init__(self) -> None:
        if not 1 <= self.rate <= MAX_RATE:
            raise ValueError(f"meter rate must be 1..{MAX_RATE} frames/s, not {self.rate}")
        if not 1 <= self.burst <= MAX_RATE:
            raise ValueError(f"meter burst must be 1..{MAX_RATE} frames, not {self.burst}")


def sampling_meter(debug_port: int, rate: int) -> MeterSpec:
    """A session's meter: ``rate`` frames/s; the burst is a tenth of a second's worth
    (at least one frame), so a session never gets much more than ``rate`` x time."""
    return MeterSpec(meter_id(debug_port), rate, max(1, rate // 10))


@dataclass(frozen=True)
class MeterPlan:
    add: tuple[MeterSpec, ...] = ()
    modify: tuple[MeterSpec, ...] = ()
    delete: tuple[MeterSpec, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.add or self.modify or self.delete)


def diff_meters(desired: Iterable[MeterSpec], installed: Iterable[MeterSpec]) -> MeterPlan:
    """What to add, modify and delete so a switch holds exactly ``desired`` of our meters;
    meters that are already right are untouched (their counters survive), others' left alone."""
    want = {m.meter_id: m for m in desired}
    have = {m.meter_id: m for m in installed}

    def key(m: MeterSpec) -> int:
        return m.meter_id

    add = [m for i, m in want.items() if i not in have]
    modify = [m for i, m in want.items() if i in have and have[i] != m]
    delete = [m for i, m in have.items() if i not in want and is_typhoon_meter(i)]
    return MeterPlan(
        tuple(sorted(add, key=key)), tuple(sorted(modify, key=key)), tuple(sorted(delete, key=key))
    )
