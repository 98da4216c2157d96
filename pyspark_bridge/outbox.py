"""The outbox: each Spark batch's output rows, published once per batch ID, for the workers.

Spark tasks stage their rows; the driver-side commit of batch ``B`` publishes
them by writing the manifest ``<B:020d>.json`` -- unless it exists, which means
``B`` is a replay after a failure whose output was already published: the
replay's rows are dropped, so downstream never sees a batch twice.

Every manifest names the batch's ``owners`` (worker IDs): part ``p`` leaves
through ``owners[p % len(owners)]``, so which worker emits a row never depends
on what a worker believes about the node's shape.  The driver names the
workers the node started with; workers a scale-up adds feed Spark more input
partitions but own no output (they read the manifests only to know when the
node is done).  Each worker routes, in batch order, the parts it owns and
records the last batch it routed.

Layout under ``<node dir>/out/``::

    staging/<uuid>.mp          rows written by a Spark task (msgpack arrays)
    <B:020d>/p<partition>.mp   published parts of batch B
    <B:020d>.json              manifest {"batch", "owners", "parts": [[partition, file, rows]],
                               "time", "ends"}: ends are the batch's source end offsets
                               (``{"<worker_id>": {"pos", "seq"}}``, anchors.py)
    routed/w<worker_id>        {"batch": last batch the worker routed, "ends": its ends}
    collected                  {"below": B}: manifests below B were deleted (every owner
                               routed them); a reader that starts later skips to B
    done                       {"batch": last batch}: the driver saw Spark process all input
    replays.log                one JSON line per replayed batch that was not published again
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from pyspark_bridge.log import read_json, write_json

Staged = tuple[int, str, int]  # (spark partition, staging file name, rows)


def out_dir(node_dir: str | Path) -> Path:
    return Path(node_dir) / "out"


def manifest_path(outdir: Path, batch: int) -> Path:
    return outdir / f"{batch:020d}.json"


def _to_wire(value: Any) -> Any:
    """msgpack fallback for what Spark hands back: times as epoch seconds, decimals as floats."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.timestamp()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot send a {type(value).__name__} downstream")


def stage_rows(outdir: Path, partition: int, rows: Iterable[Iterable[Any]]) -> Staged:
    """Write rows (sequences of column values) to a new staging file (Spark task side)."""
    staging = outdir / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    name = f"{uuid.uuid4().hex}.mp"
    pack = msgpack.Packer(default=_to_wire, use_bin_type=True).pack
    n = 0
    with open(staging / name, "wb") as f:
        for row in rows:
            f.write(pack(list(row)))
            n += 1
    return (partition, name, n)


def discard(outdir: Path, staged: Iterable[Staged | None]) -> None:
    for s in staged:
        if s is not None:
            (outdir / "staging" / s[1]).unlink(missing_ok=True)


def publish(
    outdir: Path,
    batch: int,
    staged: list[Staged | None],
    owners: list[int],
    ends: dict[str, Any] | None = None,
) -> bool:
    """Publish batch ``batch`` once (driver side); False when it was a replay (rows dropped).

    ``owners``: the workers that route the batch's parts (see the module docstring);
    ``ends``: where the batch ended in each worker's log.
    """
    if not owners:
        raise ValueError("a batch needs at least one owner worker to route its rows")
    manifest = manifest_path(outdir, batch)
    if manifest.exists():
        discard(outdir, staged)
        with open(outdir / "replays.log", "a", encoding="utf-8") as f:
            f.write(json.dumps({"batch": batch, "time": time.time()}) + "\n")
        return False
    bdir = outdir / f"{batch:020d}"
    bdir.mkdir(parents=True, exist_ok=True)
    parts = []
    for partition, name, rows in sorted(s for s in staged if s is not None):
        if rows == 0:
            (outdir / "staging" / name).unlink(missing_ok=True)
            continue
        final = f"p{partition}.mp"
        os.replace(outdir / "staging" / name, bdir / final)
        parts.append([partition, final, rows])
    doc = {
        "batch": batch,
        "owners": [int(w) for w in owners],
        "parts": parts,
        "time": time.time(),
        "ends": ends,
    }
    write_json(manifest, doc)
    collect_garbage(outdir, owners)
    return True


def owner_of(partition: int, owners: list[int]) -> int:
    """The worker that routes Spark partition ``partition`` of a batch with these owners."""
    return int(owners[partition % len(owners)])


def collect_garbage(outdir: Path, owners: list[int]) -> None:
    """Delete batches every owner has routed (keeping the newest, which a replay checks)."""
    routed = [read_json(outdir / "routed" / f"w{w}", {}).get("batch") for w in owners]
    if None in routed:
        return
    below = min(routed)
    write_json(outdir / "collected", {"below": below})  # before deleting: readers skip ahead
    for m in outdir.glob("*.json"):
        b = int(m.stem) if m.stem.isdigit() else None
        if b is not None and b < below:
            bdir = outdir / m.stem
            if bdir.exists():
                for p in bdir.glob("*"):
                    p.unlink(missing_ok=True)
                bdir.rmdir()
            m.unlink(missing_ok=True)


def replays(outdir: Path) -> int:
    try:
        with open(outdir / "replays.log", encoding="utf-8") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


@dataclass
class RouteStats:
    batches: int = 0
    rows: int = 0


class OutboxReader:
    """Worker side: route the parts of published batches this worker owns, in order, once."""

    def __init__(self, outdir: Path, worker_id: int) -> None:
        self.dir = Path(outdir)
        (self.dir / "routed").mkdir(parents=True, exist_ok=True)
        self.worker_id = int(worker_id)
        self.marker = self.dir / "routed" / f"w{worker_id}"
        routed = read_json(self.marker, {})
        last = routed.get("batch")
        self.next = 0 if last is None else last + 1
        self.ends: dict[str, Any] = routed.get("ends") or {}  # of the last batch routed
        self.stats = RouteStats()

    def peek(self) -> dict[str, Any] | None:
        """The manifest of the next batch to route, if it is published."""
        return read_json(manifest_path(self.dir, self.next))

    def poll(
        self,
        emit: Callable[[list], None],
        hold: Callable[[dict[str, Any]], bool] | None = None,
        done: Callable[[dict[str, Any]], None] | None = None,
    ) -> int:
        """Route every batch published since the last call; returns the rows emitted.

        ``hold(manifest)``: asked for each next manifest before it is routed;
        True stops here (an anchor goes before that batch).  ``done(manifest)``:
        called once its rows were emitted (the output watermark, ``watermarks.py``).
        """
        n = 0
        while True:
            manifest = read_json(manifest_path(self.dir, self.next))
            if manifest is not None and hold is not None and hold(manifest):
                break
            if manifest is None:
                # deleted because every owner routed it: this worker owned none of them
                below = int(read_json(self.dir / "collected", {}).get("below", 0))
                if self.next < below:
                    self.next = below
                    continue
                break
            owners = manifest["owners"]
            for partition, name, _rows in manifest["parts"]:
                if owner_of(partition, owners) != self.worker_id:
                    continue
                path = self.dir / f"{self.next:020d}" / name
                with open(path, "rb") as f:
                    for row in msgpack.Unpacker(f, raw=False, strict_map_key=False):
                        emit(row)
                        n += 1
                path.unlink(missing_ok=True)
            self.ends = manifest.get("ends") or self.ends
            write_json(self.marker, {"batch": self.next, "ends": self.ends})
            self.next += 1
            self.stats.batches += 1
            if done is not None:
                done(manifest)
        self.stats.rows += n
        return n

    def finished(self) -> bool:
        """The driver declared the node done and every batch up to its last one is routed."""
        done = read_json(self.dir / "done")
        return done is not None and self.next > int(done["batch"])
