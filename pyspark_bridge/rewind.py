"""Taking a spark node back to a global checkpoint: Spark's checkpoint, the outbox, the logs.

When the job rolls back to epoch ``E`` (docs/guarantees.md), each worker of a
spark node asks for it with a request ``rollback/w<log id>.json``
(``{"generation", "epoch", "pos", "seq"}``: its log position at ``E``).  Once
every worker of the node asked in the same generation, the driver stops the
node's query and calls :func:`rewind_node`:

* the batch to go back to is ``B_E``, the last batch that read nothing past
  the cut (``anchors.py``; :func:`rewind_batch`);
* Spark's checkpoint loses every batch after it: ``offsets/N``,
  ``commits/N`` and state store versions above ``B_E + 1``;
* the outbox loses the manifests after it; a worker's routed marker goes back
  to it, and ``done`` goes;
* each log is cut at the worker's position (what followed is replayed by the
  sources), its commit goes back to what ``B_E`` read, and its anchors after
  ``E`` go.

Then the driver writes ``rollback/ack`` with the generation and restarts the
query, which resumes after ``B_E``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from pyspark_bridge import anchors as anchor_log
from pyspark_bridge.log import ZERO, read_json, segments, worker_dir, write_json

Offset = dict[str, int]
# state store files: <version>.delta / .snapshot (HDFS provider), .zip / .changelog (RocksDB),
# checksum twins .<name>.crc; checkpoint format v2 adds _<unique id> to the version
_STATE_FILE = re.compile(r"^\.?(\d+)(?:_[\w-]+)?\.(delta|snapshot|zip|changelog)(?:\.crc)*$")


class RewindError(RuntimeError):
    """Spark's checkpoint does not fit the cut: going back would give a wrong answer."""


def _batch_ids(d: Path) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(d) if n.isdigit())
    except FileNotFoundError:
        return []


def batch_end(checkpoint: Path, batch: int) -> dict[str, Any]:
    """The source end offsets of batch ``batch`` in Spark's offset log."""
    # offsets/<batch>: a version line, a metadata line, then one JSON line per source
    lines = (Path(checkpoint) / "offsets" / str(batch)).read_text().splitlines()[2:]
    for line in lines:
        if line.startswith("{"):
            return json.loads(line)
    return {}


def latest_end(checkpoint: Path) -> dict[str, Any]:
    """Where the next batch starts: the end of the newest planned batch ({} before any)."""
    ids = _batch_ids(Path(checkpoint) / "offsets")
    for batch in reversed(ids):
        try:
            return batch_end(checkpoint, batch)
        except (FileNotFoundError, ValueError):
            continue  # being written or deleted
    return {}


def rewind_batch(checkpoint: Path, cut: dict[str, Offset]) -> int:
    """``B_E`` for the cut: the first batch that reached it, else the last one below it
    (-1: none).  Batches after one that reached the cut read nothing new (no-data
    batches) and were routed after the anchor."""
    below = -1
    for batch in _batch_ids(Path(checkpoint) / "offsets"):
        end = batch_end(checkpoint, batch)
        pos = {w: int((end.get(w) or ZERO)["pos"]) for w in cut}
        if any(pos[w] > o["pos"] for w, o in cut.items()):
            return below
        if all(pos[w] == o["pos"] for w, o in cut.items()):
            return batch
        below = batch
    return below


def rewind_checkpoint(checkpoint: Path, batch: int) -> int:
    """Forget every batch after ``batch`` (-1: the whole query); returns files deleted."""
    checkpoint = Path(checkpoint)
    if batch < 0:
        n = sum(1 for p in checkpoint.rglob("*") if p.is_file()) if checkpoint.exists() else 0
        shutil.rmtree(checkpoint, ignore_errors=True)
        return n
    n = 0
    for sub in ("offsets", "commits"):
        d = checkpoint / sub
        for b in _batch_ids(d):
            if b > batch:
                (d / str(b)).unlink(missing_ok=True)
                (d / f".{b}.crc").unlink(missing_ok=True)
                n += 1
    state = checkpoint / "state"
    if state.exists():
        for p in state.rglob("*"):
            m = _STATE_FILE.match(p.name)
            # the state of batch N is version N + 1
            if m and p.is_file() and int(m.group(1)) > batch + 1:
                p.unlink()
                n += 1
            elif p.is_file() and p.parent.name == "v2" and p.name.isdigit() and int(p.name) > batch:
                p.unlink()  # operator metadata per batch (checkpoint format v2)
                n += 1
    return n


def rewind_outbox(outdir: Path, batch: int, ends: dict[str, Any] | None = None) -> int:
    """Forget published batches after ``batch``; routed markers go back to it at most."""
    outdir = Path(outdir)
    n = 0
    for m in list(outdir.glob("*.json")):
        if m.stem.isdigit() and int(m.stem) > batch:
            bdir = outdir / m.stem
            if bdir.exists():
                shutil.rmtree(bdir)
            m.unlink(missing_ok=True)
            n += 1
    for marker in (outdir / "routed").glob("w*"):
        routed = read_json(marker, {}).get("batch")
        if routed is not None and routed > batch:
            if batch < 0:
                marker.unlink()
            else:
                write_json(marker, {"batch": batch, "ends": ends or {}})
    collected = read_json(outdir / "collected")
    if collected is not None and int(collected["below"]) > batch + 1:
        write_json(outdir / "collected", {"below": max(0, batch + 1)})
    (outdir / "done").unlink(missing_ok=True)
    return n


def truncate_log(log_dir: Path, at: Offset, read_to: Offset, epoch: int | None) -> None:
    """Cut one worker's log at ``at``: segments after it go, the head and commit go back
    (the commit to ``read_to``, what the kept batches read), anchors after ``epoch`` go."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    head = read_json(log_dir / "head", ZERO)
    if int(head["pos"]) < int(at["pos"]):
        raise RewindError(f"{log_dir}: the log ends at {head['pos']}, before the cut {at['pos']}")
    starts = segments(log_dir)
    if starts and starts[0] > int(read_to["pos"]):
        raise RewindError(
            f"{log_dir}: position {read_to['pos']} was trimmed; Spark cannot read it again"
        )
    for s in starts:
        path = log_dir / f"{s:020d}.seg"
        if s > int(at["pos"]) or (s == int(at["pos"]) and s != starts[0]):
            path.unlink()
        elif s <= int(at["pos"]):
            with open(path, "r+b") as f:
                f.truncate(min(os.path.getsize(path), int(at["pos"]) - s))
    write_json(log_dir / "head", {"pos": int(at["pos"]), "seq": int(at["seq"])})
    commit = read_json(log_dir / "commit", ZERO)
    if int(commit["pos"]) > int(read_to["pos"]):
        write_json(log_dir / "commit", {"pos": int(read_to["pos"]), "seq": int(read_to["seq"])})
    (log_dir / "eos").unlink(missing_ok=True)
    anchor_log.keep_anchors(log_dir, epoch)


def rewind_node(node_dir: Path, cut: dict[str, Offset], epoch: int | None) -> int:
    """Take a stopped node's query, outbox and logs back to ``cut``; returns ``B_E``."""
    node_dir = Path(node_dir)
    checkpoint = node_dir / "checkpoint"
    batch = rewind_batch(checkpoint, cut)
    ends = batch_end(checkpoint, batch) if batch >= 0 else {}
    for w, at in cut.items():
        truncate_log(worker_dir(node_dir, w), at, ends.get(w) or ZERO, epoch)
    rewind_checkpoint(checkpoint, batch)
    rewind_outbox(node_dir / "out", batch, ends)
    return batch


def acked(node_dir: Path) -> dict[str, Any] | None:
    return read_json(Path(node_dir) / "rollback" / "ack")


def requests(node_dir: Path) -> dict[str, dict[str, Any]]:
    """Log id -> the newest rollback request of each worker that wrote one."""
    rdir = Path(node_dir) / "rollback"
    out = {}
    for p in sorted(rdir.glob("w*.json")) if rdir.exists() else []:
        body = read_json(p)
        if isinstance(body, dict) and "generation" in body:
            out[p.stem[1:]] = body
    return out


def ready_cut(
    node_dir: Path, workers: list[str], acked_generation: int
) -> tuple[int, int | None, dict[str, Offset]] | None:
    """(generation, epoch, cut) once every worker asked for the same new generation."""
    reqs = requests(node_dir)
    gens = [r["generation"] for r in reqs.values()]
    if not gens or max(gens) <= acked_generation:
        return None
    gen = max(gens)
    mine = {w: r for w, r in reqs.items() if r["generation"] == gen}
    if any(w not in mine for w in workers):
        return None
    epochs = {r["epoch"] for r in mine.values()}
    if len(epochs) != 1:
        raise RewindError(f"{node_dir}: generation {gen} asks for epochs {sorted(epochs)}")
    (epoch,) = epochs
    c = {w: {"pos": int(r["pos"]), "seq": int(r["seq"])} for w, r in mine.items()}
    return gen, epoch, c
