"""Ryu events the controller core raises for control-plane apps (docs/design.md §5).

Apps subscribe with ``@set_ev_cls(EventWorkerDown)`` etc.; the core raises
them from switch messages (port status, PacketIn) and coordinator changes.
"""

from __future__ import annotations

from typing import Any

from controller.framework.ryu_compat import event


class EventWorkerUp(event.EventBase):
    """A worker's port came up on its bridge (it is attached and reachable)."""

    def __init__(self, app: str, worker_id: int, host: str, port: int, at: float) -> None:
        super().__init__()
        self.app, self.worker_id, self.host, self.port, self.at = app, worker_id, host, port, at


class EventWorkerDown(event.EventBase):
    """A worker's port went down or was deleted: its process is gone.

    ``at`` is the controller's clock (time.monotonic) when the switch told it.
    """

    def __init__(
        self, app: str, worker_id: int, host: str, port: int, reason: str, at: float
    ) -> None:
        super().__init__()
        self.app, self.worker_id, self.host, self.port = app, worker_id, host, port
        self.reason, self.at = reason, at


class EventWorkerMetrics(event.EventBase):
    """A METRIC_RESP from a worker (queue depth, counts, processing time)."""

    def __init__(self, app: str, worker_id: int, metrics: dict[str, Any], at: float) -> None:
        super().__init__()
        self.app, self.worker_id, self.metrics, self.at = app, worker_id, metrics, at


class EventWorkerAck(event.EventBase):
    """A worker confirmed a ROUTING, SIGNAL or DRAIN control tuple (stable updates)."""

    def __init__(self, app: str, worker_id: int, what: str, version: int, at: float) -> None:
        super().__init__()
        self.app, self.worker_id, self.what, self.version, self.at = (
            app,
            worker_id,
            what,
            version,
            at,
        )


class EventSparkMetrics(event.EventBase):
    """A Spark StreamingQueryListener progress event for a spark-engine node."""

    def __init__(self, app: str, node: str, progress: dict[str, Any], at: float) -> None:
        super().__init__()
        self.app, self.node, self.progress, self.at = app, node, progress, at


class EventTopologyChanged(event.EventBase):
    """An application was submitted, changed (new physical version) or killed."""

    def __init__(self, app: str, version: int | None) -> None:
        super().__init__()
        self.app, self.version = app, version  # version None: the app is gone
