"""The one module that imports Ryu (or os-ken, its maintained fork).

Everything in `controller/` and `apps/` takes its Ryu names from here
(tests/unit/test_ryu_compat.py checks it).  Which framework: controller/framework/backend.py
(``TYPHOON_CONTROLLER_BACKEND``, else Ryu if installed, else os-ken).

Ryu 4.34 needs eventlet.wsgi.ALREADY_HANDLED, which controller/framework/eventlet_fix.py
provides: installed here before the first Ryu import (so `import controller.core`
works in any environment), by `typhoon-controller` before it starts
ryu-manager, and by a `.pth` file in the development venv (scripts/setup.sh) for
a bare `ryu-manager apps/...`, which imports `ryu.app.wsgi` before any app.

os-ken differs in three ways, all absorbed here: its app class is ``OSKenApp``
(exported as ``RyuApp``); it dropped Ryu's REST framework, which
controller/framework/osken_wsgi.py carries over; and since 4.0 its hub defaults to native
threads, while the controller is written for eventlet's cooperative green
threads as in Ryu, so ``OSKEN_HUB_TYPE`` defaults to eventlet.
"""

import importlib
import os

from controller.framework import backend as _backend

BACKEND = _backend.selected()  # BackendError (one sentence) if neither is installed

if BACKEND == _backend.RYU:
    from controller.framework.eventlet_fix import install as _install_eventlet_fix

    _install_eventlet_fix()  # before the first Ryu import below; idempotent
    _wsgi = importlib.import_module("ryu.app.wsgi")
else:
    os.environ.setdefault("OSKEN_HUB_TYPE", "eventlet")  # read once, when os_ken.lib.hub loads
    _wsgi = importlib.import_module("controller.framework.osken_wsgi")


def _mod(name: str):
    return importlib.import_module(f"{BACKEND}.{name}")


cfg = _mod("cfg")
app_manager = _mod("base.app_manager")
event = _mod("controller.event")
ofp_event = _mod("controller.ofp_event")
hub = _mod("lib.hub")
ofproto_v1_3 = _mod("ofproto.ofproto_v1_3")
ofproto_v1_3_parser = _mod("ofproto.ofproto_v1_3_parser")
_handler = _mod("controller.handler")

ControllerBase = _wsgi.ControllerBase
Response = _wsgi.Response
WSGIApplication = _wsgi.WSGIApplication
route = _wsgi.route
websocket = _wsgi.websocket
RyuApp = app_manager.RyuApp if BACKEND == _backend.RYU else app_manager.OSKenApp
lookup_service_brick = app_manager.lookup_service_brick
require_app = app_manager.require_app
Datapath = _mod("controller.controller").Datapath
CONFIG_DISPATCHER = _handler.CONFIG_DISPATCHER
DEAD_DISPATCHER = _handler.DEAD_DISPATCHER
HANDSHAKE_DISPATCHER = _handler.HANDSHAKE_DISPATCHER
MAIN_DISPATCHER = _handler.MAIN_DISPATCHER
set_ev_cls = _handler.set_ev_cls

__all__ = [
    "BACKEND",
    "CONFIG_DISPATCHER",
    "DEAD_DISPATCHER",
    "HANDSHAKE_DISPATCHER",
    "MAIN_DISPATCHER",
    "ControllerBase",
    "Datapath",
    "Response",
    "RyuApp",
    "WSGIApplication",
    "app_manager",
    "cfg",
    "event",
    "hub",
    "lookup_service_brick",
    "ofp_event",
    "ofproto_v1_3",
    "ofproto_v1_3_parser",
    "require_app",
    "route",
    "set_ev_cls",
    "websocket",
]
