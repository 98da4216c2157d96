"""The schedule of one live-debugging run (``benchmarks/scenarios/live_debug.py``).

When someone starts and stops watching the source (the live debugger through
:class:`benchmarks.debug_watcher.Watcher`, or the SIGNAL that switches the
event-logger copy), and the source's counters polled from the controller's
metrics meanwhile: the ``on_tick`` hook of the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from benchmarks.cpu_sampler import pin_nodes
from benchmarks.debug_watcher import Watcher
from mininet_env.run import EmulatedCluster
from typhoon.client import ApiCallError, Client

SAMPLE_PERCENT = 1.0  # of the decoded copies the debug worker ships to the controller


@dataclass(frozen=True)
class Timing:
    """Seconds since the topology became active."""

    duration: float  # then the source is drained
    attach_at: float
    warmup: float  # nothing before this counts
    window: float = 8.0  # the "before" stretch: this long up to the attach (after warmup)
    settle: float = 0.5  # the "attached" stretch starts this long after the copy began

    @property
    def detach_at(self) -> float:
        return self.duration - 1.0


FULL = Timing(duration=28.0, attach_at=18.0, warmup=2.0)
QUICK = Timing(duration=9.0, attach_at=3.0, warmup=1.0)


PINNED = {"source": 0, "sink": 1}  # the observed pair gets a core each (pin_nodes)


@dataclass
class Timeline:
    """The on_tick hook of one run: the schedule, and the source's counters polled."""

    cluster: EmulatedCluster
    name: str
    variant: str
    timing: Timing
    api: Client
    t0: float = 0.0  # wall time the topology became active
    source: int = 0  # worker id
    data_stream: str = ""  # id of the source -> sink stream, as the metrics key it
    polled: list[tuple[float, int, int]] = field(default_factory=list)
    watcher: Watcher | None = None
    attach_requested: float = 0.0
    detach_requested: float = 0.0
    error: str = ""
    pinned: dict[str, list[int]] = field(default_factory=dict)  # node -> pids
    mirror: bool = False  # watched by the live debugger (else: the event-logger copy)
    rate: int | str | None = None  # the attach's ``rate``: "all" = every frame, None = default

    def __call__(self, elapsed: float) -> None:
        if not self.t0:
            self.t0 = time.time() - elapsed
            self.source = self.cluster.coordinator.get_physical(self.name).of_node("source")[0]
            self.source = self.source.worker_id
            topo = self.cluster.coordinator.get_topology(self.name)
            sid = next(s.id for s in topo.outputs_of("source") if s.dst == "sink")
            self.data_stream = str(sid)
            self.pinned = pin_nodes(self.name, PINNED)
        m = self.cluster.coordinator.get_metrics(self.name).get(self.source)
        if m and (not self.polled or m["time"] > self.polled[-1][0]):
            # tuples out on the data stream only: the event-log copies count as "out" too
            self.polled.append((m["time"], m["serializations"], m["out"].get(self.data_stream, 0)))
        try:
            if elapsed >= self.timing.attach_at and not self.attach_requested:
                self.attach_requested = time.time()
                if self.mirror:
                    self.watcher = Watcher(self.api, self.name, SAMPLE_PERCENT, rate=self.rate)
                    self.watcher.attach()
                else:
                    self._signal(1)
            if elapsed >= self.timing.detach_at and self.attach_requested:
                if not self.detach_requested:
                    if self.watcher is not None:
                        self.detach_requested = self.watcher.detach()
                    else:
                        self.detach_requested = time.time()
                        self._signal(2)
        except ApiCallError as e:
            self.error = self.error or f"{type(e).__name__}: {e}"

    def _signal(self, version: int) -> None:
        body = {"type": "SIGNAL", "body": {"version": version}, "node": "source"}
        self.api.call("POST", f"/apps/{self.name}/control", body)
