"""What the control-plane apps (and the core) share: timers that post events on
the app's own event loop, and a read-only REST view of the app's ``report()``.

Ryu runs each app's event handlers on one green thread, so an app whose timer
posts an event to itself never needs a lock between its periodic work and its
switch/worker events.  The REST view gives every app the same two URLs: the
report of every application, and one application's part of it.
"""

from __future__ import annotations

from typing import Any

from controller.framework.ryu_compat import (
    ControllerBase,
    RyuApp,
    WSGIApplication,
    event,
    hub,
    ofproto_v1_3,
    route,
)
from controller.rest import API, PREFIX, ApiError, handler


class TyphoonApp(RyuApp):
    """Base of every Typhoon app: OpenFlow 1.3 and the WSGI server its REST API shares.

    Ryu runs the intersection of its apps' ``OFP_VERSIONS``; the core speaks 1.3 only.
    """

    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"wsgi": WSGIApplication}


class EventTick(event.EventBase):
    """Posted by an app's timer to that app only (see :func:`start_ticks`)."""


def start_timer(app: RyuApp, period_s: float, event_cls: type[event.EventBase]) -> None:
    """Post ``event_cls()`` to ``app`` every ``period_s`` seconds; the app handles
    it with ``@set_ev_cls(event_cls)``, on its own event loop."""

    def loop() -> None:
        while True:
            hub.sleep(period_s)
            app.send_event(app.name, event_cls())

    app.threads.append(hub.spawn(loop))


def start_ticks(app: RyuApp, period_s: float) -> None:
    """Post :class:`EventTick` to ``app`` every ``period_s`` seconds."""
    start_timer(app, period_s, EventTick)


class _ReportRest(ControllerBase):
    """Base of the REST views below: ``data["app"]`` is the app with ``report()``."""

    def __init__(self, req, link, data, **config):
        super().__init__(req, link, data, **config)
        self.app: Any = data["app"]
        self.core = self.app  # handler() logs through self.core.logger


def report_rest(resource: str, missing: str) -> type[ControllerBase]:
    """A view serving ``GET /typhoon/<resource>`` (the whole ``report()``, a
    dict keyed by application) and ``GET /typhoon/apps/{name}/<resource>``
    (one application's entry; 404 saying ``missing`` when it has none).

    Register it with ``wsgi.register(view, {"app": app})``."""

    class ReportRest(_ReportRest):
        @route(API + "_" + resource, PREFIX + "/" + resource, methods=["GET"])
        @handler()
        def all_apps(self, req, **_):
            return 200, self.app.report()

        @route(API + "_" + resource, PREFIX + "/apps/{name}/" + resource, methods=["GET"])
        @handler()
        def one_app(self, req, name, **_):
            report = self.app.report()
            if name not in report:
                raise ApiError(404, f"{missing} in an application named '{name}'")
            return 200, report[name]

    ReportRest.__name__ = ReportRest.__qualname__ = f"{resource.title()}Rest"
    return ReportRest


def list_rest(resource: str) -> type[ControllerBase]:
    """A view serving ``GET /typhoon/<resource>``: the app's ``report()`` as is
    (for reports that are one list, not one entry per application)."""

    class ListRest(_ReportRest):
        @route(API + "_" + resource, PREFIX + "/" + resource, methods=["GET"])
        @handler()
        def everything(self, req, **_):
            return 200, self.app.report()

    ListRest.__name__ = ListRest.__qualname__ = f"{resource.title()}Rest"
    return ListRest
