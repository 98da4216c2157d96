"""Which node counts key pairs, and how much (topology ``config: {locality: ...}``).

Opt-in: ``config: {locality: {pairs: 1000, sample: 10}}`` makes every worker of a
node whose input is key-routed (``fields``/``direct`` on key ``a``) and whose
output is key-routed (key ``b``) count one in ``sample`` of its input tuples'
``(a, b)`` pairs in a SpaceSaving counter of ``pairs`` entries, and report the
``top`` most frequent in its METRIC_RESP.  The locality router reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from typhoon.topology.config import LOCALITY_DEFAULTS

if TYPE_CHECKING:
    from typhoon.topology.model import Topology

KEYED = ("fields", "direct")  # groupings that route by key fields
# declared with every other config key in typhoon/topology/config.py
DEFAULT_PAIRS = LOCALITY_DEFAULTS.pairs
DEFAULT_SAMPLE = LOCALITY_DEFAULTS.sample
DEFAULT_TOP = LOCALITY_DEFAULTS.top  # pairs per METRIC_RESP: a few frames, every metrics round


@dataclass(frozen=True)
class LocalitySettings:
    pairs: int = DEFAULT_PAIRS  # SpaceSaving capacity
    sample: int = DEFAULT_SAMPLE  # one input tuple in ``sample`` is counted
    top: int = DEFAULT_TOP  # pairs reported per METRIC_RESP


@dataclass(frozen=True)
class PairKeys:
    """Where a counting node finds its two keys."""

    in_fields: tuple[int, ...]  # key a: indices into the node's input tuple
    out_stream: str  # the output stream name whose tuples carry key b
    out_fields: tuple[int, ...]  # key b: indices into the node's output tuple


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


def pair_keys(topo: Topology, node: str) -> PairKeys | None:
    """The key fields of ``node``'s keyed input and keyed output, or None if it has not both.

    Every input stream must be keyed on the same fields (else ``a`` would mean
    different things per tuple); the first keyed output stream gives ``b``.
    """
    ins = topo.inputs_of(node)
    if not ins or any(s.grouping.type not in KEYED or not s.grouping.fields for s in ins):
        return None
    in_fields = set()
    for s in ins:
        src_fields = list(topo.nodes[s.src].output_fields)
        if any(f not in src_fields for f in s.grouping.fields):
            return None
        in_fields.add(tuple(src_fields.index(f) for f in s.grouping.fields))
    if len(in_fields) != 1:
        return None
    out_fields = list(topo.nodes[node].output_fields)
    for s in topo.outputs_of(node):
        g = s.grouping
        if g.type in KEYED and g.fields and all(f in out_fields for f in g.fields):
            return PairKeys(in_fields.pop(), s.name, tuple(out_fields.index(f) for f in g.fields))
    return None


def counting_nodes(topo: Topology) -> list[str]:
    """The nodes that count pairs under ``config: {locality: ...}``, in file order."""
    return [n for n in topo.nodes if pair_keys(topo, n) is not None]
