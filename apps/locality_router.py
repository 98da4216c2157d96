"""Locality router (seed paper 003, issue 17): ``ryu-manager apps/locality_router.py``.

On ``POST /typhoon/apps/NAME/locality`` (``typhoon locality NAME``), or every
``interval`` seconds, it collects the key-pair counts of the application's
counting node (``config: {locality: ...}``) from METRIC_RESPs, partitions the
key graph over the hosts (``controller/locality/router.py``) and installs the tables
as ``direct`` groupings on the node's input and output streams, one stable
reroute after the other (a keyed receiver hands each key whose worker changes
to its new owner with its state, docs/keyed_state.md; only ``stateful: true``
receivers are flushed).  ``GET /typhoon/apps/NAME/locality`` (or
``/typhoon/locality``) shows the last run: the plan (table sizes, predicted
local pair weight against today's routing) and the measured fraction of the
node's output tuples that crossed hosts before the switch and since.  The
steps are in ``controller/locality/job.py``; this file only wires them.

Settings: section ``[locality]`` of the Ryu config file, declared once by
``RouterSettings`` in ``controller/locality/job.py`` (table in ``docs/locality.md``).
"""

from __future__ import annotations

import time
from typing import Any

from controller.app_support import EventTick, TyphoonApp, start_ticks
from controller.events import EventTopologyChanged
from controller.framework.ryu_compat import (
    ControllerBase,
    cfg,
    require_app,
    route,
    set_ev_cls,
)
from controller.locality.job import LocalityJob, RouterSettings, periodic_due
from controller.locality.router import LocalityError
from controller.options import read_settings, register_settings
from controller.rest import API, PREFIX, ApiError, TyphoonRest, handler
from controller.services import services

require_app("controller.core")

CONF = cfg.CONF
register_settings(RouterSettings)

TICK_S = 0.2


class LocalityRest(ControllerBase):
    """``POST``/``GET /typhoon/apps/NAME/locality``, ``GET /typhoon/locality``."""

    def __init__(self, req, link, data, **config):
        super().__init__(req, link, data, **config)
        self.app: Any = data["app"]
        self.core = self.app  # handler() logs through self.core.logger
        self.token: str = data["token"]

    check_token = TyphoonRest.check_token

    @route(API + "_locality", PREFIX + "/apps/{name}/locality", methods=["POST"])
    @handler(mutating=True)
    def run(self, req, name, **_):
        try:
            return 202, self.app.begin_run(name, auto=False)
        except LocalityError as e:
            raise ApiError(e.status, e.message) from None

    @route(API + "_locality", PREFIX + "/apps/{name}/locality", methods=["GET"])
    @handler()
    def one_app(self, req, name, **_):
        report = self.app.report()
        if name not in report:
            raise ApiError(404, f"no locality run of an application named '{name}'")
        return 200, report[name]

    @route(API + "_locality", PREFIX + "/locality", methods=["GET"])
    @handler()
    def all_apps(self, req, **_):
        return 200, self.app.report()


class LocalityRouter(TyphoonApp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = read_settings(RouterSettings)
        self.jobs: dict[str, LocalityJob] = {}  # the latest run of every application
        kwargs["wsgi"].register(LocalityRest, {"app": self, "token": CONF.typhoon.api_token})
        start_ticks(self, TICK_S)
        self.logger.info("locality router ready: %s", self.settings)

    @staticmethod
    def core():
        return services()

    def begin_run(self, name: str, auto: bool) -> dict[str, Any]:
        """Begin a run (LocalityError: no such application, nothing to plan, one running)."""
        job = self.jobs.get(name)
        if job is not None and job.running:
            raise LocalityError(f"a locality run of '{name}' is still in phase {job.phase}")
        core = self.core()
        job = LocalityJob(name, auto, self.settings, time.monotonic())
        job.begin(core, job.started)
        self.jobs[name] = job
        self.logger.info("app %s: locality run started (%s)", name, "periodic" if auto else "asked")
        return job.report(core)

    @set_ev_cls(EventTick)
    def _tick(self, ev):
        now = time.monotonic()
        core = self.core()
        for name, job in list(self.jobs.items()):
            if job.running:
                job.step(core, now)
                if not job.running:
                    self.logger.info("app %s: locality run %s %s", name, job.phase, job.reason)
        for name, app in list(core.view.apps.items()):
            rec = core.reconfiguration(name)
            if periodic_due(self.settings, self.jobs.get(name),
                            "locality" in app.topology.config, bool(app.state.get("active")),
                            rec is not None and rec.running, now):  # fmt: skip
                try:
                    self.begin_run(name, auto=True)
                except LocalityError as e:
                    self.logger.info("app %s: no periodic locality run: %s", name, e.message)

    @set_ev_cls(EventTopologyChanged)
    def _topology_changed(self, ev):
        if ev.version is None:  # the application is gone
            self.jobs.pop(ev.app, None)

    def report(self) -> dict[str, Any]:
        core = self.core()
        return {name: job.report(core) for name, job in sorted(self.jobs.items())}
