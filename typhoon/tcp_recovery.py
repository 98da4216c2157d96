"""Recovery of a tcp run under a guarantee: a dead worker relaunched, the job rolled back.

The tcp counterpart of the fault detector's recovery on sdn: the run
coordinator (:class:`typhoon.tcp_cluster.TcpCluster`) relaunches the dead
worker with the same ID from the newest verified global checkpoint in a new
generation, tells every worker its new address, and rolls the others back.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from typhoon.checkpoint import CheckpointError, checkpoint_settings, open_store
from typhoon.checkpoint.progress import recovery_point
from typhoon.wire import Control, ControlTuple

log = logging.getLogger(__name__)


def recover(cluster: Any, wid: int) -> None:
    """Relaunch a dead worker (same ID) from the newest verified global checkpoint in
    a new generation, tell everyone its new address, and roll the others back."""
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
    cluster.recovered.append(wid)
    old = cluster.conns.pop(wid, None)
    if old is not None:
        cluster.sel.unregister(old.sock)
        old.sock.close()
    w = cluster.physical.by_id(wid)
    cluster._launch_worker(w)
    cluster.peers.update(cluster._accept_hellos({wid}))
    cluster._broadcast_peers()
    body = {"generation": cluster.generation, "epoch": -1 if epoch is None else epoch}
    rolled_back = []
    for other in [o for o in cluster.conns if o != wid]:
        cluster.send(other, ControlTuple(Control.ROLLBACK, body))
        rolled_back.append(other)
    if w.node in {n.name for n in cluster.topology.spouts()}:
        cluster.send(wid, ControlTuple(Control.ACTIVATE, {}))
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
