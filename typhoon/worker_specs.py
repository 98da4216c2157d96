"""What the agent tells a worker on its host: the spec file and its I/O-layer settings.

The spec (``typhoon/runtime/spec.py``) carries the topology, the worker's
place and the transport: the TAP, the frame size the fabric carries, the
credit window and the worker's share of the switch's buffers.
"""

from __future__ import annotations

import logging
from pathlib import Path

from typhoon.cluster import Cluster
from typhoon.port_budgets import plan_budgets
from typhoon.runtime import links as lk
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.tap import tap_name
from typhoon.runtime.tcp import TCP_MTU
from typhoon.topology.batching import Batching
from typhoon.topology.config import SdnConfig, keys_of
from typhoon.topology.model import PhysicalTopology, Topology, WorkerAssignment

log = logging.getLogger("typhoon.agent")

# Frame size of a worker when nothing smaller is asked for: the emulated fabric's links
# carry 65,000 bytes (mininet_env/network.py).  Per-frame costs (a TAP write and read, a
# pass through the switch, the link protocol's bookkeeping) dominate at 9,000 bytes:
# forward.yaml on one host went from 1.15M to 1.51M tuples/s (docs/performance.md).
WORKER_MTU = 64000
# Frame size of a tcp worker when the topology asks for none (TCP_MTU, the tcp transport's
# own default, imported above): the same, so that sdn and the tcp baseline are measured
# with equal frames (docs/performance.md, "A columnar emit").


SDN_OPTIONS = keys_of(SdnConfig)  # declared in typhoon/topology/config.py


def sdn_options(config: dict) -> dict:
    """I/O-layer settings from the topology's ``config``.

    ``flow_control: false`` turns credits off (the largest window, no byte
    window or budget): only for showing what flow control prevents; the links still resend
    what the switch drops.  ``sdn: {window, window_bytes, window_bytes_max,
    port_budget, credit_timeout_s}`` tunes it (``control_priority: false`` hands
    urgent control tuples out in arrival order, behind queued data: only for
    measuring what the priority buys); without ``port_budget`` every
    worker gets its share of the switch's socket buffers
    (:func:`typhoon.port_budgets.plan_budgets`), kept current by the controller.
    """
    opts = {k: v for k, v in (config.get("sdn") or {}).items() if k in SDN_OPTIONS}
    if config.get("flow_control") is False:
        opts.update(window=lk.MAX_WINDOW, window_bytes=0, port_budget=0)
    return opts


def worker_mtu(config: dict, cluster: Cluster | None) -> int:
    """Frame size of a worker: what the fabric carries whole, or less if the topology asks.

    A cluster file's fabric fixes ``cluster.mtu`` (e.g. 1450 over VXLAN on a
    1500-byte underlay); a larger frame would be dropped on the way, so a
    topology's ``sdn: {mtu: N}`` can only lower it.  Tuples larger than a
    frame travel segmented (``typhoon.wire.pack_frames``).
    """
    path = cluster.mtu if cluster is not None and cluster.mtu else None
    asked = (config.get("sdn") or {}).get("mtu")
    if asked is None:
        return path or WORKER_MTU
    asked = int(asked)
    if path is not None and asked > path:
        log.warning("sdn.mtu %d does not fit the fabric: frames of %d bytes instead", asked, path)
        return path
    return asked


def tcp_mtu(config: dict) -> int:
    """Frame size of a tcp worker: the topology's ``tcp: {mtu: N}``, else :data:`TCP_MTU`.

    sdn's rule without the fabric: a TCP stream has no path MTU (the kernel cuts
    it into segments), so a frame is only the unit a sender batches tuples into and
    a receiver bounds what it decodes by; a frame over it is a counted drop
    (``malformed_frame``).  Every worker of a run gets the same size.
    """
    asked = (config.get("tcp") or {}).get("mtu")
    return TCP_MTU if asked is None else int(asked)


def write_spec(
    workdir: Path,
    topology: Topology,
    physical: PhysicalTopology,
    w: WorkerAssignment,
    tap: str,
    cluster: Cluster | None,
) -> Path:
    """``DIR/NAME/worker-WID.spec.json``: what the worker process is told."""
    appdir = workdir / physical.name
    (appdir / "reports").mkdir(parents=True, exist_ok=True)
    config = topology.config
    transport = {"kind": "sdn", "tap": tap, **sdn_options(config)}
    transport["mtu"] = worker_mtu(config, cluster)
    if "port_budget" not in transport and cluster is not None:
        budgets = plan_budgets(topology, physical, cluster).budgets
        if w.worker_id in budgets:
            transport["port_budget"] = budgets[w.worker_id]
    batching = Batching.of(config)
    spec = WorkerSpec(
        topology,
        physical,
        w.worker_id,
        batch_size=batching.batch_size,
        max_delay_ms=batching.max_delay_ms,
        report_dir=str(appdir / "reports"),
        transport=transport,
    )
    path = appdir / f"worker-{w.worker_id}.spec.json"
    spec.save(path)
    return path


def write_group_specs(
    workdir: Path,
    topology: Topology,
    physical: PhysicalTopology,
    group: list[WorkerAssignment],
    cluster: Cluster | None,
    ports: tuple[int, int],
) -> list[tuple[WorkerAssignment, str, Path]]:
    """(worker, TAP, spec path) of the workers one process runs: one, or a chain's
    (typhoon.topology.chaining), head first.  ValueError: a port outside ``ports``."""
    out = []
    for w in group:
        if not ports[0] <= w.port <= ports[1]:
            raise ValueError(f"port {w.port} is outside this host's range {ports}")
        tap = tap_name(physical.app_id, w.worker_id)
        out.append((w, tap, write_spec(workdir, topology, physical, w, tap, cluster)))
    return out
