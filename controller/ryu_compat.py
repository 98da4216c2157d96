"""The one module that imports Ryu.

Everything in `controller/` and `apps/` takes its Ryu names from here, so the
project can move to os-ken (Ryu's maintained fork, same API under `os_ken`) by
changing this file alone.

Ryu 4.34 needs eventlet.wsgi.ALREADY_HANDLED, which controller/eventlet_fix.py
provides (called by `typhoon-controller`, and by a `.pth` file in the venv that
scripts/setup.sh builds); without it the `ryu.app.wsgi` import below fails.
"""

from ryu import cfg
from ryu.app.wsgi import (
    ControllerBase,
    Response,
    WSGIApplication,
    route,
    websocket,
)
from ryu.base import app_manager
from ryu.base.app_manager import RyuApp, lookup_service_brick, require_app
from ryu.controller import event, ofp_event
from ryu.controller.controller import Datapath
from ryu.controller.handler import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    HANDSHAKE_DISPATCHER,
    MAIN_DISPATCHER,
    set_ev_cls,
)
from ryu.lib import hub
from ryu.ofproto import ofproto_v1_3, ofproto_v1_3_parser

__all__ = [
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
