"""Recovery of a tcp run under a guarantee: a dead worker relaunched, the job rolled back.

The tcp counterpart of the fault detector's recovery on sdn: the run
coordinator (:class:`typhoon.tcp_cluster.TcpCluster`) relaunches the dead
worker with the same ID from the newest verified global checkpoint in a new
generation, tells every worker its new address, and rolls the others back
(:func:`recover`).

A worker that dies *during* a rescale (``typhoon/tcp_reconfig.py``) leaves
the others half-way through the update: some routes switched, key groups
held or in transit, which no ROLLBACK undoes.  Then :func:`restart` stops
every worker and starts the job again as a whole in the update's final
topology, in a new generation, from the newest checkpoint complete under it
(``recovery_point``).  Each worker restores its key groups of the final table
from whichever parts of that epoch hold them (``typhoon/runtime/keyed_cut.py``);
with no such epoch yet the job starts over from the beginning (exact, with a
full replay).  The update is then done, reached by the restart.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from typhoon.checkpoint import CheckpointError, checkpoint_settings, open_store
from typhoon.checkpoint.progress import recovery_point
from typhoon.topology.chaining import group_of
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.wire import Control, ControlTuple

log = logging.getLogger(__name__)


def recover(cluster: Any, wid: int) -> None:
    """Relaunch a dead worker (same ID) from the newest verified global checkpoint in
    a new generation, tell everyone its new address, and roll the others back.  A chained
    worker's process is its chain's (typhoon.topology.chaining): the chain comes back whole,
    once (its other workers' turn finds it running)."""
    if cluster.procs[wid].poll() is None:
        return  # relaunched with its chain
    group = group_of(cluster.topology, cluster.physical, wid)
    code = cluster.procs[wid].returncode
    detected = time.monotonic()
    cluster.generation = cluster.physical.generation + 1
    try:
        store = open_store(checkpoint_settings(cluster.topology).store_url, cluster.topology.name)
        epoch = recovery_point(cluster.physical, store)
    except CheckpointError as e:
        log.error("checkpoint store: %s; rolling back to the start", e)
        epoch = None
    cluster.physical = dataclasses.replace(
        cluster.physical, generation=cluster.generation, restore_epoch=epoch
    )
    log.warning(
        "worker %d exited with %s: relaunched as generation %d from checkpoint %s",
        wid, code, cluster.generation, epoch,
    )  # fmt: skip
    cluster.recovered.extend(group)
    for m in group:
        old = cluster.conns.pop(m, None)
        if old is not None:
            cluster.sel.unregister(old.sock)
            old.sock.close()
    w = cluster.physical.by_id(wid)
    cluster._launch_worker(w)
    cluster.peers.update(cluster._accept_hellos(set(group)))
    cluster._broadcast_peers()
    body = {"generation": cluster.generation, "epoch": -1 if epoch is None else epoch}
    rolled_back = []
    for other in [o for o in cluster.conns if o not in group]:
        cluster.send(other, ControlTuple(Control.ROLLBACK, body))
        rolled_back.append(other)
    spouts = {n.name for n in cluster.topology.spouts()}
    for m in group:
        if cluster.physical.by_id(m).node in spouts:
            cluster.send(m, ControlTuple(Control.ACTIVATE, {}))
    cluster.incidents.append(
        {
            "worker": wid,
            "node": w.node,
            "index": w.index,
            "host": w.host,
            "reason": f"exited with {code}",
            "exit_code": code,
            "detected_wall": time.time() - (time.monotonic() - detected),
            "state": "rejoined",
            "replacement": wid,  # tcp relaunches the same worker ID
            "generation": cluster.generation,
            "restore_epoch": epoch,
            "rollback": "global",  # the tcp runner rolls every worker back
            "rolled_back": sorted(rolled_back),
            "rejoined_ms": round((time.monotonic() - detected) * 1000, 2),
        }
    )


def restarted(physical: PhysicalTopology, generation: int, epoch: int | None) -> PhysicalTopology:
    """``physical`` as every worker starts again in: one ``generation`` for all (a restart
    ends any per-region generations), restored to ``epoch`` (None: from the beginning)."""
    return dataclasses.replace(
        physical, generation=generation, restore_epoch=epoch, worker_generations={}
    )


def restart(cluster: Any, topology: Topology, physical: PhysicalTopology, reason: str) -> None:
    """Every worker again, in ``physical`` (a rescale's final topology), in a new generation
    from the newest checkpoint complete under it (module docstring).  Workers ``physical``
    no longer has are stopped for good (their exit is not a failure of the run).
    RuntimeError: the workers did not all start again."""
    detected = time.monotonic()
    codes = {w: p.poll() for w, p in cluster.procs.items()}
    dead = sorted(w for w, code in codes.items() if code not in (None, 0))
    before = cluster.physical
    generation = max(cluster.generation, before.generation, physical.generation) + 1
    try:
        store = open_store(checkpoint_settings(topology).store_url, topology.name)
        epoch = recovery_point(physical, store)
    except CheckpointError as e:
        log.error("checkpoint store: %s; starting over from the beginning", e)
        epoch = None
    for p in cluster.procs.values():  # SIGKILL: a stopped worker must not write a report
        if p.poll() is None:
            p.kill()
            p.wait()
        p.close_log()
    for c in cluster.conns.values():
        cluster.sel.unregister(c.sock)
        c.sock.close()
    cluster.conns.clear()
    active = [w for w in physical.workers if w.active]
    cluster.procs = {}
    cluster.topology, cluster.generation = topology, generation
    cluster.physical = restarted(physical, generation, epoch)
    log.warning(
        "%s: every worker restarted as generation %d from checkpoint %s",
        reason, generation, epoch,
    )  # fmt: skip
    for w in active:
        cluster._launch_worker(w)
    cluster.peers = cluster._accept_hellos({w.worker_id for w in active})
    cluster._broadcast_peers()
    spouts = {n.name for n in topology.spouts()}
    for w in active:
        if w.node in spouts:
            cluster.send(w.worker_id, ControlTuple(Control.ACTIVATE, {}))
    cluster.recovered.extend(dead)
    ids = {w.worker_id for w in active}
    for wid in dead:
        w = cluster.launched.get(wid) or before.by_id(wid)
        cluster.incidents.append(
            {
                "worker": wid,
                "node": w.node,
                "index": w.index,
                "host": w.host,
                "reason": f"exited with {codes[wid]} {reason}",
                "exit_code": codes[wid],
                "detected_wall": time.time() - (time.monotonic() - detected),
                "state": "rejoined",
                "replacement": wid if wid in ids else None,  # None: the update removed it
                "generation": generation,
                "restore_epoch": epoch,
                "rollback": "restart",  # every worker started again, in the update's topology
                "rolled_back": sorted(ids - {wid}),
                "rejoined_ms": round((time.monotonic() - detected) * 1000, 2),
            }
        )


def drop_left_links(reports: list[dict[str, Any]], left: set[int], generation: int) -> None:
    """Link counts of the workers a rescale removed (``left``) whose report ends in an
    older generation than ``generation``: their receivers rolled back since, and a
    rollback starts every link count over, so the two ends no longer count the same
    tuples.  The report then leaves those links out (``report.link_problems`` skips a
    report without ``links``); what they sent was replayed from the checkpoint."""
    for r in reports:
        gen = (r.get("metrics") or {}).get("generation", 0)
        if r.get("worker") in left and isinstance(gen, int) and gen < generation:
            r["links"] = None
