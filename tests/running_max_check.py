"""The exact check of a ``running_max`` swapped in place mid-run (keyed state kept).

The job: one ``keyed_source`` worker (``seed``, ``keys``, ``count``) -> fields on
``key`` -> ``running_max`` (``count: false``) -> one ``collect`` sink; mid-run the
running max is swapped in place to ``running_max`` with ``count: true``, whose rows
carry a count (the old logic's carry null).  Each key lives on one worker and its
tuples come from one source over one link each way, so the sink holds each key's
rows in the order the running max took them.  :func:`check_swapped_running_max`
recomputes every row from the source's generator: the maximum continues across the
cut (the keyed state was kept), the count restarts at the cut (a mapping the new
logic added) and there is one cut per key; every tuple once, none lost.  Shared by
the unit model, the tcp runtime test and the sdn integration test, with the job
itself (:func:`swap_job`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from typhoon.operators.keyed import keyed_tuple


def swap_job(
    name: str, seed: int, keys: int, count: int, size: int, rate: int = 0, spread: bool = False
) -> str:
    """The job's YAML: ``keyed_source`` -> fields on ``key`` -> ``running_max`` x2 ->
    one ``collect`` sink; ``rate``: the source's tuples/s (0: unpaced); ``spread``: one
    worker of each node per host (``placement: spread``)."""
    source = {"count": count, "keys": keys, "seed": seed, "size": size}
    if rate:
        source["rate"] = rate
    return yaml.safe_dump(
        {
            "name": name,
            **({"config": {"placement": "spread"}} if spread else {}),
            "spouts": [
                {"id": "source", "operator": "keyed_source", "parallelism": 1, "args": source},
            ],
            "bolts": [
                {"id": "rmax", "operator": "running_max", "parallelism": 2},
                {"id": "sink", "operator": "collect", "parallelism": 1},
            ],
            "streams": [
                {"from": "source", "to": "rmax", "grouping": {"type": "fields", "fields": ["key"]}},
                {"from": "rmax", "to": "sink", "grouping": "global"},
            ],
        },
        sort_keys=False,
    )


@dataclass
class SwapCheck:
    """What the rows showed (every row already checked exactly)."""

    old_rows: int  # taken by the old logic (count null)
    new_rows: int  # by the new logic
    keys_cut: int  # keys with rows on both sides of the cut
    carried: int  # new-logic rows whose maximum an old-logic row had set: the state went on


def check_swapped_running_max(
    rows: list[list[Any]], seed: int, keys: int, count: int, size: int
) -> SwapCheck:
    """Assert every row of the sink against the reference; see the module docstring."""
    pad = "p" * size
    by_seq: dict[int, list[Any]] = {}
    per_key: dict[str, list[list[Any]]] = {}
    for row in rows:
        key, seq, value, p, mx, n = row
        assert seq not in by_seq, f"tuple {seq} emitted twice: {by_seq[seq]} and {row}"
        by_seq[seq] = row
        assert [key, seq, value, p] == keyed_tuple(seed, seq, keys, pad), row
        per_key.setdefault(key, []).append(row)
    missing = sorted(set(range(count)) - set(by_seq))
    assert not missing, f"{len(missing)} tuples lost, the first {missing[:5]}"
    assert len(by_seq) == count, sorted(set(by_seq) - set(range(count)))[:5]
    old = new = cut_keys = carried = 0
    for key, krows in per_key.items():
        seqs = [r[1] for r in krows]
        assert seqs == sorted(seqs), f"key {key}: rows out of order {seqs[:20]}"
        best, best_old, n_new = None, False, 0
        for r in krows:
            value, mx, n = r[2], r[4], r[5]
            if best is None or value > best:
                best, best_old = value, n is None
            assert mx == best, f"key {key}, tuple {r[1]}: max {mx}, want {best}"
            if n is None:
                assert n_new == 0, f"key {key}, tuple {r[1]}: old logic after the new one"
                old += 1
            else:
                n_new += 1
                new += 1
                assert n == n_new, f"key {key}, tuple {r[1]}: count {n}, want {n_new}"
                carried += best_old
        cut_keys += 0 < n_new < len(krows)
    return SwapCheck(old, new, cut_keys, carried)
