"""What a tcp run is asked to do: :class:`RunOptions` of :class:`typhoon.tcp_cluster.TcpCluster`.

Kept apart from the run coordinator so the options (hosts, timing, scheduled
verbs, the control endpoint) read in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typhoon.topology.batching import DEFAULTS


@dataclass
class RunOptions:
    hosts: list[str] = field(default_factory=lambda: ["h1"])
    bind: dict[str, str] = field(default_factory=dict)  # host -> address workers listen on
    # the address the coordinator listens on; None: the one address every host's workers
    # reach it at (127.0.0.1 for local runs), 0.0.0.0 only when they differ
    control_bind: str | None = None
    duration: float | None = None  # seconds; then sources are drained
    # the file's config wins over these (Batching.of), as on sdn (EmulatedCluster.submit)
    batch_size: int = DEFAULTS.batch_size
    max_delay_ms: float = DEFAULTS.max_delay_ms
    live: bool = True
    live_every: float = 1.0
    timeout: float = 900.0  # hard limit for the whole run
    start_timeout: float = 60.0
    service_timeout: float = 300.0  # engine services (a Spark driver) may take this long to start
    failure_grace: float = 2.0  # seconds after a worker failed before the others are stopped
    # keep worker specs, logs and reports in WORKDIR/NAME/ (the sdn layout); None: a temp dir
    workdir: Path | None = None
    # (seconds, typhoon.reconfig.Scale): rescales while the job runs (typhoon.tcp_reconfig)
    scales: list[tuple[float, Any]] = field(default_factory=list)
    # called as f(cluster, elapsed) on every turn of the run loop (a locality run, say)
    on_turn: list[Callable[[Any, float], None]] = field(default_factory=list)
    # local workers forked from one process that imported the runtime (typhoon.zygote)
    # instead of each a fresh `python -m typhoon.runtime.worker`; False: spawn every one
    zygote: bool = True
    # HOST:PORT of the run's control endpoint, which `typhoon unchain NAME ...` and the
    # other verbs tcp runs reach (typhoon.tcp_control; port 0: any free one); None: none
    endpoint: str | None = None
