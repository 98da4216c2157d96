"""``typhoon run --transport tcp --locality AT``: the locality router's run on a tcp job.

The same job as ``apps/locality_router.py`` runs on sdn
(``controller/locality/job.py``: fresh pair statistics from the counting node's
workers, ``compute_plan``, the two ``direct`` reroutes one after the other, then
the measurement), driven by the tcp run loop instead of the Ryu app's timer.  Each
reroute is the sdn plan run by the tcp coordinator's executor
(``typhoon/tcp_reconfig.py``): pinned keys move with their keyed state, under a
guarantee too.  This module is the adapter between the two, in the CLI layer,
which is the one allowed to import both ``controller`` and ``typhoon``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from controller.locality.job import LocalityJob, RouterSettings
from controller.locality.router import LocalityError, find_chain
from typhoon.topology.model import Topology
from typhoon.wire import Control, ControlTuple


def parse_locality_option(text: str) -> float:
    """``AT`` (``--locality``): seconds into the run, >= 0."""
    try:
        at = float(text)
    except ValueError:
        at = -1.0
    if not at >= 0:
        raise ValueError(f"--locality '{text}' is not a number of seconds >= 0, e.g. 3")
    return at


def check_locality(topology: Topology) -> str | None:
    """One sentence saying why ``topology`` cannot be moved for locality; None: it can."""
    try:
        find_chain(topology)
    except LocalityError as e:
        return e.message
    return None


@dataclass
class _App:
    topology: Topology
    physical: Any


class _View:
    def __init__(self, driver: TcpLocality) -> None:
        self.driver = driver

    @property
    def apps(self) -> dict[str, _App]:
        c = self.driver.cluster
        return {} if c is None else {c.topology.name: _App(c.topology, c.physical)}


@dataclass
class _Status:
    """A tcp rescale record as the locality job reads a reconfiguration."""

    id: int
    state: str
    error: str

    @property
    def running(self) -> bool:
        return self.state == "pending"


class TcpLocality:
    """One locality run at ``at`` seconds into a tcp run (``RunOptions.on_turn``)."""

    def __init__(self, at: float, settings: RouterSettings | None = None) -> None:
        self.at = at
        self.settings = settings or RouterSettings()
        self.cluster: Any = None
        self.job: LocalityJob | None = None
        self.view = _View(self)
        self.request_ids = itertools.count(1_000_000)  # apart from the run loop's polls
        self.last: dict[str, Any] = {}

    # ----- the run loop's hook --------------------------------------------------------------

    def __call__(self, cluster: Any, elapsed: float) -> None:
        self.cluster = cluster
        now = time.monotonic()
        if self.job is None:
            if elapsed < self.at:
                return
            name = cluster.topology.name
            self.job = LocalityJob(name, auto=False, settings=self.settings, started=now)
            try:
                self.job.begin(self, now)
            except LocalityError as e:
                self.job.phase, self.job.reason, self.job.finished = "failed", e.message, now
        self.job.step(self, now)

    def report(self) -> dict[str, Any]:
        """The locality job's report (``controller/locality/job.py``), or why none ran."""
        if self.job is None:
            return {"phase": "not started", "reason": f"the run ended before {self.at:g} s"}
        return self.job.report(self)

    # ----- what the job asks of the controller core, from the tcp coordinator ---------------

    def request_metrics(self, app: str, worker_ids: Any = None) -> int:
        c = self.cluster
        rid = next(self.request_ids)
        for wid in worker_ids if worker_ids is not None else list(c.conns):
            if wid in c.conns:
                c.send(wid, ControlTuple(Control.METRIC_REQ, {"request_id": rid}))
        return rid

    def worker_metrics(self, app: str) -> dict[int, dict]:
        return dict(self.cluster.metrics)

    def reconfigure(self, app: str, request: Any) -> _Status:
        rec = self.cluster.rescaler.request(request)
        return _Status(rec.id, rec.state, rec.error)

    def reconfiguration(self, app: str) -> _Status | None:
        records = self.cluster.rescaler.records
        if not records:
            return None
        rec = records[-1]
        return _Status(rec.id, rec.state, rec.error)
