"""Which node counts key pairs, and how much (topology ``config: {locality: ...}``).

Opt-in: ``config: {locality: {pairs: 1000, sample: 10}}`` makes every worker of a
node whose input is key-routed (``fields``/``direct`` on key ``a``) and whose
output is key-routed (key ``b``) count one in ``sample`` of its input tuples'
``(a, b)`` pairs in a SpaceSaving counter of ``pairs`` entries, and report the
``top`` most frequent in its METRIC_RESP.  The locality router reads them.
Which node can count (its two keys) is ``typhoon/topology/pair_keys.py``, which the
loader asks too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typhoon.topology.config import LOCALITY_DEFAULTS
from typhoon.topology.model import Topology

# declared with every other config key in typhoon/topology/config.py
DEFAULT_PAIRS = LOCALITY_DEFAULTS.pairs
DEFAULT_SAMPLE = LOCALITY_DEFAULTS.sample
DEFAULT_TOP = LOCALITY_DEFAULTS.top  # pairs per METRIC_RESP: a few frames, every metrics round


@dataclass(frozen=True)
class LocalitySettings:
    pairs: int = DEFAULT_PAIRS  # SpaceSaving capacity
    sample: int = DEFAULT_SAMPLE  # one input tuple in ``sample`` is counted
    top: int = DEFAULT_TOP  # pairs reported per METRIC_RESP


def locality_settings(topo: Topology) -> LocalitySettings | None:
    """The topology's settings, or None when it does not ask for pair statistics.

    The loader has checked the types (``typhoon/topology/schema.py``)."""
    raw: Any = topo.config.get("locality")
    if raw is None:
        return None
    return LocalitySettings(
        int(raw.get("pairs", DEFAULT_PAIRS)),
        int(raw.get("sample", DEFAULT_SAMPLE)),
        int(raw.get("top", DEFAULT_TOP)),
    )
