"""Anchors: where a spark node's workers checkpointed, so that a Spark batch ends exactly there.

Under a guarantee (docs/guarantees.md, "Spark nodes") each worker appends one
line per epoch it checkpoints to ``in/w<log id>/anchors``:
``{"epoch": E, "pos", "seq"}``, its log head when it wrote epoch ``E``.  The
**cut** of ``E`` is every worker's anchor ``E`` (a worker whose input ended
without one contributes its ``eos``).

``B_E`` is the last micro-batch that read nothing after the cut.  Spark's
state after ``B_E`` plus the logs from where ``B_E`` ended up to the cut is
the node's state at epoch ``E``; the output of the batches up to ``B_E`` is
the output that belongs before anchor ``E``.  So a worker passes anchor ``E``
downstream once it routed a batch that :func:`reached` the cut, or before it
routes the first batch that :func:`crosses` it, and routes nothing after
``B_E`` until then.  Batches stay as Spark plans them; with the node arg
``cut_batches: true`` the source also caps every batch at the oldest cut not
reached yet (:func:`cap`), so ``B_E`` ends exactly at the cut and a rollback
recomputes nothing from before it -- at the cost of one batch per epoch at
least.

Offsets are ``{"pos", "seq"}`` as in ``log.py``; a worker missing from a batch's
offsets is at position 0.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pyspark_bridge.log import ZERO, read_json, worker_dir, write_json

ANCHORS = "anchors"
Offset = dict[str, int]


def append_anchor(log_dir: Path, epoch: int, offset: Offset) -> None:
    """Record that the worker checkpointed ``epoch`` with its log head at ``offset``."""
    line = json.dumps({"epoch": int(epoch), "pos": int(offset["pos"]), "seq": int(offset["seq"])})
    with open(Path(log_dir) / ANCHORS, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def read_anchors(log_dir: Path) -> dict[int, Offset]:
    """Epoch -> offset of one worker's anchors (a torn or foreign line is skipped)."""
    try:
        text = (Path(log_dir) / ANCHORS).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    out: dict[int, Offset] = {}
    for line in text.splitlines():
        try:
            a = json.loads(line)
            out[int(a["epoch"])] = {"pos": int(a["pos"]), "seq": int(a["seq"])}
        except (ValueError, KeyError, TypeError):
            continue
    return out


def keep_anchors(log_dir: Path, upto: int | None) -> None:
    """Forget the anchors of epochs after ``upto`` (None: all), as a rollback to it does."""
    path = Path(log_dir) / ANCHORS
    kept = {e: o for e, o in read_anchors(log_dir).items() if upto is not None and e <= upto}
    tmp = path.with_name(f".{ANCHORS}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps({"epoch": e, **o}) + "\n" for e, o in sorted(kept.items())))
    os.replace(tmp, path)


def read_node(
    node_dir: Path, workers: list[str]
) -> tuple[dict[str, dict[int, Offset]], dict[str, Offset | None]]:
    """Every worker's anchors and ``eos`` (read after the heads: see :func:`cap`)."""
    anchors = {w: read_anchors(worker_dir(node_dir, w)) for w in workers}
    eos = {w: read_json(worker_dir(node_dir, w) / "eos") for w in workers}
    return anchors, eos


def cut(
    epoch: int, anchors: dict[str, dict[int, Offset]], eos: dict[str, Offset | None]
) -> dict[str, Offset | None]:
    """Each worker's position at ``epoch``: its anchor, else its end of input, else None."""
    return {w: a.get(epoch) or eos.get(w) for w, a in anchors.items()}


def _pos(offsets: dict[str, Any], w: str) -> int:
    return int((offsets.get(w) or ZERO)["pos"])


def reached(ends: dict[str, Any], c: dict[str, Offset | None]) -> bool:
    """A batch ending at ``ends`` covers the whole cut ``c`` (False while any part is unknown)."""
    return all(o is not None and _pos(ends, w) >= o["pos"] for w, o in c.items())


def crosses(ends: dict[str, Any], c: dict[str, Offset | None]) -> bool:
    """A batch ending at ``ends`` read past the cut ``c`` in some worker's log.

    A worker whose anchor is not known yet cannot have been read past it, if
    the batch was planned before the anchors were read (the caller reads the
    manifest first).
    """
    return any(o is not None and _pos(ends, w) > o["pos"] for w, o in c.items())


def cap(
    heads: dict[str, Offset],
    start: dict[str, Any],
    anchors: dict[str, dict[int, Offset]],
    eos: dict[str, Offset | None],
) -> dict[str, Offset]:
    """The end of the next micro-batch: ``heads``, capped at the oldest cut ``start`` has not
    reached.

    A worker that has not written its anchor of that epoch yet is read up to
    its head: the heads are read before the anchors, so a head read while the
    anchor was missing is at or below the anchor's position.  Without anchors
    (no guarantee) this is ``heads``.
    """
    epochs = sorted({e for a in anchors.values() for e in a})
    for epoch in epochs:
        c = cut(epoch, anchors, eos)
        if reached(start, c):
            continue
        out = {}
        for w, h in heads.items():
            o = c.get(w)
            out[w] = dict(o) if o is not None and o["pos"] < h["pos"] else dict(h)
        return out
    return {w: dict(h) for w, h in heads.items()}


def write_request(node_dir: Path, log_id: str, body: dict[str, Any]) -> None:
    """A worker asks the driver to take its node back to an epoch (see ``rewind.py``)."""
    rdir = Path(node_dir) / "rollback"
    rdir.mkdir(parents=True, exist_ok=True)
    write_json(rdir / f"w{log_id}.json", body)
