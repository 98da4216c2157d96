"""Locality-aware key routing, the controller's part (seed paper 003; issue 17).

Pure: the app (``apps/locality_router.py``) feeds it the workers' METRIC_RESPs
and the application's topologies, and sends what it returns through the
reconfiguration executor.  A *chain* is a node ``A`` that counts key pairs
(``config: {locality: ...}``, ``typhoon/locality/settings.py``) with its keyed
input stream (key ``a``) and keyed output stream to ``B`` (key ``b``).  The
plan is ``plan_locality`` over the pairs summed from ``A``'s workers, with the
hosts of the physical topology; applying it is one ``direct`` reroute per stream.
Whether it worked is measured, not predicted: the tuples ``A``'s workers sent
on the output stream, per receiver, give the fraction that crossed hosts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from typhoon.locality.partition import LocalityPlan, Slot, plan_locality
from typhoon.locality.settings import locality_settings
from typhoon.reconfig import Reroute
from typhoon.topology.keygroups import DEFAULT_MAX_PARALLELISM, default_table, stable_hash, table_of
from typhoon.topology.model import Grouping, PhysicalTopology, Stream, Topology
from typhoon.topology.pair_keys import pair_keys

Link = tuple[int, int]  # (sender worker, receiver worker)


class LocalityError(Exception):
    """Why an application cannot be planned for; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Chain:
    """The counting node and the two key-routed streams around it."""

    node: str  # A
    stream_in: Stream  # into A, keyed on a
    stream_out: Stream  # A -> B, keyed on b


def find_chain(topo: Topology) -> Chain:
    """The application's counting node with its streams (the first one in file order)."""
    if locality_settings(topo) is None:
        raise LocalityError(
            f"'{topo.name}' does not count key pairs: its topology has no config 'locality'"
        )
    for name in topo.nodes:
        keys = pair_keys(topo, name)
        if keys is None:
            continue
        ins = topo.inputs_of(name)
        if len(ins) != 1:
            continue  # one reroute per stream: a node fed by several streams is left alone
        out = next(
            s for s in topo.outputs_of(name) if s.name == keys.out_stream and s.grouping.fields
        )
        return Chain(name, ins[0], out)
    raise LocalityError(f"'{topo.name}' has no node with one key-routed input and output")


def merged_pairs(metrics: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """``(a, b) -> count`` summed over the workers' METRIC_RESPs (``pairs: {a: {b: n}}``)."""
    total: dict[tuple[str, str], int] = {}
    for m in metrics:
        for a, bs in (m.get("pairs") or {}).items():
            for b, n in bs.items():
                total[(a, b)] = total.get((a, b), 0) + int(n)
    return total


def routed_index(grouping: Grouping, key: str, n: int, table: list[int] | None = None) -> int:
    """The receiver index a key goes to today: its table entry, else its key group's owner.

    ``table`` is the node's worker index per key group (``typhoon.topology.keygroups``,
    the default for ``n`` workers if None).  The hash is that of the key as a string
    (``typhoon/runtime/policies.py`` hashes the field values): exact for string keys,
    the workload's case."""
    index = grouping.table.get(key)
    if index is not None and index < n:
        return index
    if table is None:
        table = default_table(DEFAULT_MAX_PARALLELISM, n)
    return table[stable_hash([key]) % len(table)]


def slots(physical: PhysicalTopology, node: str) -> list[Slot]:
    """The node's active workers as (index, host): tables name receivers by index."""
    return [Slot(w.index, w.host) for w in physical.active_of_node(node)]


def compute_plan(
    topo: Topology,
    physical: PhysicalTopology,
    chain: Chain,
    pairs: Mapping[tuple[str, str], int],
    imbalance: float,
) -> LocalityPlan:
    """Tables for both streams; its ``hash_local_fraction`` is today's routing."""
    a_slots = slots(physical, chain.node)
    b_slots = slots(physical, chain.stream_out.dst)
    if not pairs:
        raise LocalityError(f"no key pairs counted yet by '{chain.node}' of '{topo.name}'")
    ga, gb = chain.stream_in.grouping, chain.stream_out.grouping
    ta = table_of(topo, physical, chain.node)
    tb = table_of(topo, physical, chain.stream_out.dst)
    hashed_a = {a: routed_index(ga, a, len(a_slots), ta) for a, _ in pairs}
    hashed_b = {b: routed_index(gb, b, len(b_slots), tb) for _, b in pairs}
    return plan_locality(pairs, a_slots, b_slots, hashed_a, hashed_b, imbalance)


def reroutes(chain: Chain, plan: LocalityPlan) -> list[Reroute]:
    """The updates that install the plan: ``direct`` on both streams, same fields; a
    stream that already routes by exactly that table is left alone."""
    out = []
    for s, table in ((chain.stream_in, plan.table_a), (chain.stream_out, plan.table_b)):
        if s.grouping != Grouping("direct", s.grouping.fields, dict(table)):
            out.append(Reroute(s.id, "direct", s.grouping.fields, tuple(sorted(table.items()))))
    return out


def sent_links(metrics: Mapping[int, Mapping[str, Any]], stream: int) -> dict[Link, int]:
    """Tuples each worker sent to each receiver on ``stream`` (``sent_to: {"dst:sid": n}``)."""
    links: dict[Link, int] = {}
    for src, m in metrics.items():
        for key, n in (m.get("sent_to") or {}).items():
            dst, sid = key.split(":")
            if int(sid) == stream:
                links[(src, int(dst))] = int(n)
    return links


def minus(now: Mapping[Link, int], base: Mapping[Link, int]) -> dict[Link, int]:
    """What was sent since ``base`` (links absent from ``base`` count from 0)."""
    return {k: n - base.get(k, 0) for k, n in now.items() if n - base.get(k, 0) > 0}


@dataclass(frozen=True)
class Crossing:
    crossed: int
    total: int

    @property
    def fraction(self) -> float:
        return self.crossed / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"tuples": self.total, "crossed": self.crossed, "fraction": round(self.fraction, 4)}


def crossing(links: Mapping[Link, int], physical: PhysicalTopology) -> Crossing:
    """How many of the tuples on ``links`` went from one host to another."""
    host = {w.worker_id: w.host for w in physical.workers}
    crossed = sum(n for (s, d), n in links.items() if host.get(s) != host.get(d))
    return Crossing(crossed, sum(links.values()))


def plan_summary(plan: LocalityPlan, pairs: Mapping[tuple[str, str], int]) -> dict[str, Any]:
    """What ``GET .../locality`` shows of a plan."""
    return {
        "pairs": len(pairs),
        "pair_weight": sum(pairs.values()),
        "table_a": len(plan.table_a),
        "table_b": len(plan.table_b),
        "predicted_local": round(plan.local_fraction, 4),
        "current_local": round(plan.hash_local_fraction, 4),
        "imbalance_a": round(plan.imbalance(plan.load_a), 3),
        "imbalance_b": round(plan.imbalance(plan.load_b), 3),
    }
