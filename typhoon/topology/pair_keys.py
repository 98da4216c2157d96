"""Where a node finds the two keys of a key pair, if it has both.

A node whose input is key-routed (``fields``/``direct`` on key ``a``) and whose output
is key-routed (key ``b``) can count ``(a, b)`` pairs for locality-aware routing
(``config: {locality: ...}``, ``typhoon/locality/settings.py``).  A question about the
topology alone, so it lives here: the loader refuses a ``locality`` config no node can
count, and the worker's and the router's pair statistics read the keys from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from typhoon.topology.model import Topology

KEYED = ("fields", "direct")  # groupings that route by key fields


@dataclass(frozen=True)
class PairKeys:
    """Where a counting node finds its two keys."""

    in_fields: tuple[int, ...]  # key a: indices into the node's input tuple
    out_stream: str  # the output stream name whose tuples carry key b
    out_fields: tuple[int, ...]  # key b: indices into the node's output tuple


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
