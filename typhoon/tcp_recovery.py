"""Recovery of a tcp run under a guarantee: a dead worker relaunched, its region rolled back.

The tcp counterpart of the fault detector's recovery on sdn, with the same pure
parts (``typhoon/checkpoint/regions.py``, ``recovery_point``): the run
coordinator (:class:`typhoon.tcp_cluster.TcpCluster`) relaunches the dead
worker with the same ID in a new generation, from the newest checkpoint that
verifies for the workers of its failover region, tells every worker its new
address, and sends ROLLBACK to the other live workers of that region only
(:func:`recover`).  The other regions are told nothing: they never stop,
restore or replay.  A job that is one region (wordcount), or says
``config: {failover: global}``, rolls every worker back, as before regions.

The incident records what the failure cost the results as on sdn: the sinks the
dead worker's node reaches, their rate before, their lowest 1 s window since and
``back_at_80_ms`` (:class:`IncidentWatch`, the rule of ``typhoon/sink_rates.py``
applied to the sink workers' METRIC_RESPs as the coordinator receives them), the
tuples each rolled-back source replayed, and when every worker told confirmed its
ROLLBACK (``rolled_back_ms``).

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from typhoon.checkpoint import CheckpointError, checkpoint_settings, open_store
from typhoon.checkpoint.progress import recovery_point
from typhoon.checkpoint.regions import replayed_since, roll_back, rollback_set
from typhoon.sink_rates import WINDOW_S, SinkWatch, downstream_sinks
from typhoon.topology.chaining import group_of
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.wire import Control, ControlTuple

log = logging.getLogger(__name__)


def recover(cluster: Any, wid: int) -> None:
    """Relaunch a dead worker (same ID) in a new generation from the newest checkpoint
    that verifies for its failover region, tell everyone its new address, and roll the
    other live workers of its region back (module docstring).  A chained worker's process
    is its chain's (typhoon.topology.chaining): the chain comes back whole, once (its other
    workers' turn finds it running)."""
    if cluster.procs[wid].poll() is None:
        return  # relaunched with its chain
    group = group_of(cluster.topology, cluster.physical, wid)
    code = cluster.procs[wid].returncode
    detected = time.monotonic()
    generation = max(cluster.generation, cluster.physical.generation) + 1
    cluster.generation = generation
    rollback = rollback_set(cluster.topology, cluster.physical, set(group))
    try:
        store = open_store(checkpoint_settings(cluster.topology).store_url, cluster.topology.name)
        epoch = recovery_point(cluster.physical, store, set(rollback.workers))
    except CheckpointError as e:
        log.error("checkpoint store: %s; rolling back to the start", e)
        epoch = None
    cluster.physical = roll_back(cluster.physical, rollback.workers, generation, epoch)
    log.warning(
        "worker %d exited with %s: relaunched as generation %d from checkpoint %s; %s "
        "rollback of %d workers (%d regions)",
        wid, code, generation, epoch, rollback.path, len(rollback.workers), rollback.regions,
    )  # fmt: skip
    cluster.recovered.extend(group)
    for m in group:
        cluster.watch.sinks.relaunched(cluster.topology.name, m)
        old = cluster.conns.pop(m, None)
        if old is not None:
            cluster.sel.unregister(old.sock)
            old.sock.close()
    w = cluster.physical.by_id(wid)
    cluster._launch_worker(w)
    cluster.peers.update(cluster._accept_hellos(set(group)))
    cluster._broadcast_peers()
    body = {"generation": generation, "epoch": -1 if epoch is None else epoch}
    rolled_back = []
    for other in sorted(rollback.workers - set(group)):
        p = cluster.procs.get(other)
        # not poll(): a death reaped here would be seen by the run loop as a failure before
        # its next turn recovers it; one not reaped yet is recovered then, and rolls back
        if other not in cluster.conns or p is None or p.returncode is not None:
            continue  # died too (recovered on its own), or a drained one gone
        cluster.send(other, ControlTuple(Control.ROLLBACK, body))
        rolled_back.append(other)
    spouts = {n.name for n in cluster.topology.spouts()}
    for m in group:
        if cluster.physical.by_id(m).node in spouts:
            cluster.send(m, ControlTuple(Control.ACTIVATE, {}))
    cluster.incidents.append(
        {
            "app": cluster.topology.name,
            "worker": wid,
            "node": w.node,
            "index": w.index,
            "host": w.host,
            "reason": f"exited with {code}",
            "exit_code": code,
            "detected": detected,  # the coordinator's monotonic clock, as sdn's
            "detected_wall": time.time() - (time.monotonic() - detected),
            "state": "rejoined",
            "replacement": wid,  # tcp relaunches the same worker ID
            "generation": generation,
            "restore_epoch": epoch,
            "rollback": rollback.path,  # "region", or "global" when that is every worker
            "region": sorted(rollback.workers),  # the replacement included
            "rolled_back": rolled_back,
            "rolled_back_ms": None,  # every one of them confirmed it (IncidentWatch.acked)
            "replayed": {},
            "rejoined_ms": round((time.monotonic() - detected) * 1000, 2),
            **unjudged(cluster.topology, w.node),
        }
    )


def unjudged(topology: Topology, node: str) -> dict[str, Any]:
    """An incident's sink fields before :class:`IncidentWatch` judged them: the sink nodes
    a death of ``node`` reaches, and nothing known of their rate yet."""
    return {
        "sinks": sorted(downstream_sinks(topology, node)),
        "sink_rate_before": None,
        "sink_rate_lowest": None,
        "back_at_80_ms": None,
    }


@dataclass
class IncidentWatch:
    """What the METRIC_RESPs the coordinator receives after a recovery say of its
    incidents, as the fault detector records it on sdn: when every worker sent ROLLBACK
    confirmed it, the tuples each rolled-back source replayed, and what the failure
    cost its sinks."""

    sinks: SinkWatch = field(default_factory=SinkWatch)
    confirmed: dict[int, set[int]] = field(default_factory=dict)  # generation -> workers

    def acked(
        self, incidents: list[dict[str, Any]], wid: int, metrics: Mapping[str, Any], at: float
    ) -> None:
        """A worker confirmed a control tuple: ``rolled_back_ms`` of an incident once every
        worker it sent ROLLBACK has confirmed that generation."""
        gen = metrics.get("version")
        if metrics.get("ack") != "ROLLBACK" or type(gen) is not int:
            return
        done = self.confirmed.setdefault(gen, set())
        done.add(wid)
        for i in incidents:
            if i.get("generation") == gen and i.get("rolled_back_ms") is None and i["rolled_back"]:
                if done >= set(i["rolled_back"]):
                    i["rolled_back_ms"] = round((at - i["detected"]) * 1000, 2)

    def heard(
        self,
        topology: Topology,
        physical: PhysicalTopology,
        incidents: list[dict[str, Any]],
        wid: int,
        metrics: Mapping[str, Any],
        at: float,
    ) -> None:
        """A worker's METRIC_RESP arrived at ``at``: a sink's progress counts, a source's
        replays go to the incidents that rolled it back, and every incident not judged
        yet is judged again."""
        app = topology.name
        if metrics.get("replayed"):
            for i in incidents:
                if wid in i["rolled_back"]:
                    n = replayed_since(metrics["replayed"], i["generation"])
                    if n is not None:
                        i["replayed"][wid] = n
        node = next((w.node for w in physical.workers if w.worker_id == wid), None)
        if node is None or topology.outputs_of(node):
            return
        self.sinks.note(app, wid, node, metrics, at)
        for i in incidents:
            if i.get("back_at_80_ms") is not None or node not in i.get("sinks", ()):
                continue
            if at - i["detected"] > self.sinks.give_up_s + WINDOW_S:
                continue  # left unknown, as on sdn
            back = self.sinks.judge(app, set(i["sinks"]), i["detected"], at)
            if back is not None:
                i["sink_rate_before"] = round(back.before, 2)
                i["sink_rate_lowest"] = round(back.lowest, 2)
                if back.after_s is not None:
                    i["back_at_80_ms"] = round(back.after_s * 1000, 2)


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
        cluster.watch.sinks.relaunched(topology.name, w.worker_id)
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
                "app": topology.name,
                "worker": wid,
                "node": w.node,
                "index": w.index,
                "host": w.host,
                "reason": f"exited with {codes[wid]} {reason}",
                "exit_code": codes[wid],
                "detected": detected,
                "detected_wall": time.time() - (time.monotonic() - detected),
                "state": "rejoined",
                "replacement": wid if wid in ids else None,  # None: the update removed it
                "generation": generation,
                "restore_epoch": epoch,
                "rollback": "restart",  # every worker started again, in the update's topology
                "region": sorted(ids),
                "rolled_back": sorted(ids - {wid}),
                "rolled_back_ms": None,  # started again, not sent ROLLBACK
                "replayed": {},  # every source is a new process: it cannot know
                "rejoined_ms": round((time.monotonic() - detected) * 1000, 2),
                **unjudged(topology, w.node),
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
