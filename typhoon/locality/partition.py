"""Routing tables from key-pair counts: the bipartite key graph split over hosts.

Vertices are the keys of the first grouping (``a``, into node A) and of the
second (``b``, into node B); an edge ``a - b`` weighs how often a tuple with
key ``a`` led to one with key ``b``.  METIS (pymetis) cuts the graph into one
part per host, each part's vertex weight (the keys' tuple counts) in
proportion to the workers the host runs, within ``imbalance``.  Inside a
host, keys go to that host's workers of their node, heaviest first onto the
least loaded.  Keys not in the counts keep the hash (``direct`` grouping:
table first, hash for the rest), as in the paper (§3.3).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pymetis

Key = str


@dataclass(frozen=True)
class Slot:
    """A worker of A or B and the host it runs on."""

    worker: int
    host: str


@dataclass
class LocalityPlan:
    """What the partition gives: a table per grouping and what it should achieve."""

    table_a: dict[Key, int]  # key -> worker of A
    table_b: dict[Key, int]  # key -> worker of B
    local_fraction: float  # pair weight whose two keys end on one host (the counted pairs)
    hash_local_fraction: float  # the same with both keys hashed (the baseline)
    load_a: dict[int, int] = field(default_factory=dict)  # tuples per worker of A (counted)
    load_b: dict[int, int] = field(default_factory=dict)

    def imbalance(self, load: Mapping[int, int]) -> float:
        """Most loaded worker over the mean (1.0 = even)."""
        if not load or not sum(load.values()):
            return 1.0
        return max(load.values()) / (sum(load.values()) / len(load))


def plan_locality(
    pairs: Mapping[tuple[Key, Key], int],
    a_workers: Sequence[Slot],
    b_workers: Sequence[Slot],
    hashed_a: Mapping[Key, int] | None = None,
    hashed_b: Mapping[Key, int] | None = None,
    imbalance: float = 1.03,
) -> LocalityPlan:
    """Tables for the counted keys (``pairs``: (a, b) -> count).

    ``hashed_a``/``hashed_b`` give the worker each key goes to today (the hash),
    for the baseline locality; missing keys count as not local.  ``imbalance``
    (>= 1) bounds each host's share of the key load over its fair share.
    """
    if imbalance < 1.0:
        raise ValueError(f"imbalance must be >= 1.0, got {imbalance}")
    if not a_workers or not b_workers:
        raise ValueError("both nodes need at least one worker")
    pairs = {p: int(w) for p, w in pairs.items() if w > 0}
    a_keys = sorted({a for a, _ in pairs})
    b_keys = sorted({b for _, b in pairs})
    load_a_key: dict[Key, int] = defaultdict(int)
    load_b_key: dict[Key, int] = defaultdict(int)
    for (a, b), w in pairs.items():
        load_a_key[a] += w
        load_b_key[b] += w
    hosts = sorted({s.host for s in (*a_workers, *b_workers)})
    part_of = _partition(pairs, a_keys, b_keys, load_a_key, load_b_key, hosts, a_workers,
                         b_workers, imbalance)  # fmt: skip
    table_a, load_a = _assign(a_keys, load_a_key, {k: part_of[("a", k)] for k in a_keys},
                              hosts, a_workers)  # fmt: skip
    table_b, load_b = _assign(b_keys, load_b_key, {k: part_of[("b", k)] for k in b_keys},
                              hosts, b_workers)  # fmt: skip
    host_a = {s.worker: s.host for s in a_workers}
    host_b = {s.worker: s.host for s in b_workers}
    total = sum(pairs.values()) or 1
    local = sum(w for (a, b), w in pairs.items() if host_a[table_a[a]] == host_b[table_b[b]])
    hashed = 0
    if hashed_a is not None and hashed_b is not None:
        hashed = sum(
            w
            for (a, b), w in pairs.items()
            if a in hashed_a
            and b in hashed_b
            and host_a.get(hashed_a[a]) == host_b.get(hashed_b[b])
        )
    return LocalityPlan(table_a, table_b, local / total, hashed / total, load_a, load_b)


def _partition(
    pairs: Mapping[tuple[Key, Key], int],
    a_keys: list[Key],
    b_keys: list[Key],
    load_a: Mapping[Key, int],
    load_b: Mapping[Key, int],
    hosts: list[str],
    a_workers: Sequence[Slot],
    b_workers: Sequence[Slot],
    imbalance: float,
) -> dict[tuple[str, Key], int]:
    """Vertex -> host index, METIS k-way with target weights per host."""
    vertices = [("a", k) for k in a_keys] + [("b", k) for k in b_keys]
    if len(hosts) == 1 or not vertices:
        return {v: 0 for v in vertices}
    index = {v: i for i, v in enumerate(vertices)}
    adj: list[dict[int, int]] = [dict() for _ in vertices]
    for (a, b), w in pairs.items():
        i, j = index[("a", a)], index[("b", b)]
        adj[i][j] = adj[i].get(j, 0) + w
        adj[j][i] = adj[j].get(i, 0) + w
    xadj, adjncy, eweights = [0], [], []
    for row in adj:
        for j, w in sorted(row.items()):
            adjncy.append(j)
            eweights.append(w)
        xadj.append(len(adjncy))
    vweights = [load_a[k] for k in a_keys] + [load_b[k] for k in b_keys]
    share = [
        sum(s.host == h for s in a_workers) / len(a_workers)
        + sum(s.host == h for s in b_workers) / len(b_workers)
        for h in hosts
    ]
    tpwgts = [x / sum(share) for x in share]
    options = pymetis.Options(ufactor=max(1, round((imbalance - 1.0) * 1000)), seed=1)
    _, parts = pymetis.part_graph(
        len(hosts), pymetis.CSRAdjacency(xadj, adjncy), vweights=vweights,
        eweights=eweights, tpwgts=tpwgts, options=options,
    )  # fmt: skip
    return {v: int(parts[i]) for i, v in enumerate(vertices)}


def _assign(
    keys: list[Key],
    load: Mapping[Key, int],
    host_index: Mapping[Key, int],
    hosts: list[str],
    workers: Sequence[Slot],
) -> tuple[dict[Key, int], dict[int, int]]:
    """Each key onto the least loaded worker of its host (heaviest keys first); a host
    without a worker of this node gives its keys to the least loaded worker anywhere."""
    per_worker = {s.worker: 0 for s in workers}
    by_host: dict[str, list[int]] = defaultdict(list)
    for s in workers:
        by_host[s.host].append(s.worker)
    table = {}
    for k in sorted(keys, key=lambda k: (-load[k], k)):
        pool = by_host.get(hosts[host_index[k]]) or list(per_worker)
        w = min(pool, key=lambda w: (per_worker[w], w))
        table[k] = w
        per_worker[w] += load[k]
    return table, per_worker
