"""The one module that imports Ryu.

Everything in `controller/` and `apps/` takes its Ryu names from here, so the
project can move to os-ken (Ryu's maintained fork, same API under `os_ken`) by
changing this file alone.

Ryu 4.34 needs eventlet.wsgi.ALREADY_HANDLED, which controller/eventlet_fix.py
provides: installed here before the first Ryu import (so `import controller.core`
works in any environment), by `typhoon-controller` before it starts
ryu-manager, and by a `.pth` file in the development venv (scripts/setup.sh) for
a bare `ryu-manager apps/...`, which imports `ryu.app.wsgi` before any app.
"""

from controller.eventlet_fix import install as _install_eventlet_fix

_install_eventlet_fix()  # before the first Ryu import below; idempotent

from ryu import cfg  # noqa: E402
from ryu.app.wsgi import (  # noqa: E402
    ControllerBase,
    Response,
    WSGIApplication,
    route,
    websocket,
)
from ryu.base import app_manager  # noqa: E402
from ryu.base.app_manager import RyuApp, lookup_service_brick, require_app  # noqa: E402
from ryu.controller import event, ofp_event  # noqa: E402
from ryu.controller.controller import Datapath  # noqa: E402
from ryu.controller.handler import (  # noqa: E402
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    HANDSHAKE_DISPATCHER,
    MAIN_DISPATCHER,
    set_ev_cls,
)
from ryu.lib import hub  # noqa: E402
from ryu.ofproto import ofproto_v1_3, ofproto_v1_3_parser  # noqa: E402

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
