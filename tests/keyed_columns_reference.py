"""The exact result of ``topologies/keyed_columns.yaml`` (``keyed_columns`` → ``max_and_prev``
→ ``digest``), computed without running it, for the tcp and sdn tests that kill its workers.

With one source worker each key's tuples reach ``max_and_prev`` in sequence order (one
link, in order; a rollback replays in that order), so every output, and so the digest
of the outputs, is a function of the source's arguments.  ``check`` compares a run
report with it; a tuple lost or processed twice, or a key's state restored wrong,
changes the key's outputs.  Tests import it by name (``tests/`` is on ``sys.path``).
"""

from __future__ import annotations

from typing import Any

from typhoon.operators.keyed import MASK64, tuple_digest
from typhoon.operators.keyed_columns import generate_keyed_columns


def reference(args: dict[str, Any], key_fields: tuple[str, ...] = ("key",)) -> dict[str, Any]:
    """``{"max", "last"}`` per key (as the run report names keys) and ``{"tuples", "sum",
    "xor"}`` of the sink's digest, for a source of one worker with these ``args``."""
    rows = generate_keyed_columns(args["count"], 1, args.get("seed", 1), args.get("keys", 64))
    where = [("key", "name", "seq", "value").index(f) for f in key_fields]
    state: dict[str, list[int]] = {}
    digest = {"tuples": 0, "sum": 0, "xor": 0}
    for row in rows:
        k = [row[i] for i in where]
        name = str(k) if len(k) > 1 else str(k[0])
        v = row[3]
        top, prev = (v, -1) if name not in state else (max(state[name][0], v), state[name][1])
        state[name] = [top, v]
        h = tuple_digest([*row, top, prev])
        digest["tuples"] += 1
        digest["sum"] = (digest["sum"] + h) & MASK64
        digest["xor"] ^= h
    return {
        "max": {k: s[0] for k, s in state.items()},
        "last": {k: s[1] for k, s in state.items()},
        "digest": digest,
    }


def check(report: dict[str, Any], want: dict[str, Any]) -> None:
    """Assert the run's per-key results and digest equal ``want`` (from :func:`reference`)."""
    peak, sink = report["results"]["peak"], report["results"]["sink"]
    assert peak["keys_on_several_workers"] == 0, peak
    wrong = {k: (peak["max"].get(k), v) for k, v in want["max"].items() if peak["max"].get(k) != v}
    assert not wrong and set(peak["max"]) == set(want["max"]), list(wrong.items())[:5]
    wrong = {k: (peak["last"].get(k), v) for k, v in want["last"].items() if peak["last"][k] != v}
    assert not wrong, list(wrong.items())[:5]
    got = {k: sink[k] for k in ("tuples", "sum", "xor")}
    assert got["tuples"] == want["digest"]["tuples"], (got, want["digest"])  # lost / duplicated
    assert got == want["digest"], (got, want["digest"])  # every output as computed
