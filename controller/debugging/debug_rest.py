"""REST routes of the live debugger, registered by ``apps/live_debugger.py``.

Same conventions as ``controller/rest.py`` (JSON, ``{"error": ...}`` on 4xx,
``X-Typhoon-Token`` on requests that change something).  Reading a session's
tuples needs the token too: they are the application's data.  Debug workers
post their records with the session's own key instead, so an agent host never
needs the controller's token.

    POST   /typhoon/apps/NAME/debug                    attach (body: worker, direction,
                                                       filter, sample, last)
    GET    /typhoon/apps/NAME/debug                    sessions of NAME
    GET    /typhoon/apps/NAME/debug/SID                one session, with statistics
    DELETE /typhoon/apps/NAME/debug/SID                detach
    GET    /typhoon/apps/NAME/debug/SID/tuples?after=N&limit=M   ring buffer
    POST   /typhoon/debug/sessions/SID/records         debug worker -> controller
"""

from __future__ import annotations

from typing import Any

from controller.debugging.debugger import DebugError
from controller.framework.ryu_compat import ControllerBase, route
from controller.rest import PREFIX, ApiError, TyphoonRest, handler, read_json
from typhoon.debug.spec import KEY_HEADER

API = "typhoon_debug"
MAX_LIMIT = 10_000


def _int_param(req: Any, name: str, default: int) -> int:
    raw = req.GET.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, f"'{name}' must be an integer") from None


class DebugRest(ControllerBase):
    def __init__(self, req, link, data, **config):
        super().__init__(req, link, data, **config)
        self.debugger = data["debugger"]
        self.core = data["core"]  # handler() logs through core.logger
        self.token: str = data["token"]

    check_token = TyphoonRest.check_token  # one token check for the whole API

    def call(self, fn, *args: Any) -> Any:
        try:
            return fn(*args)
        except DebugError as e:
            raise ApiError(e.status, e.message) from None

    @route(API, PREFIX + "/apps/{name}/debug", methods=["POST"])
    @handler(mutating=True)
    def attach(self, req, name, **_):
        session = self.call(self.debugger.attach, name, read_json(req))
        return 201, session

    @route(API, PREFIX + "/apps/{name}/debug", methods=["GET"])
    @handler()
    def sessions(self, req, name, **_):
        return 200, self.call(self.debugger.list_sessions, name)

    @route(API, PREFIX + "/apps/{name}/debug/{sid}", methods=["GET"])
    @handler()
    def session(self, req, name, sid, **_):
        return 200, self.call(self.debugger.session_status, name, sid)

    @route(API, PREFIX + "/apps/{name}/debug/{sid}", methods=["DELETE"])
    @handler(mutating=True)
    def detach(self, req, name, sid, **_):
        return 200, self.call(self.debugger.detach, name, sid)

    @route(API, PREFIX + "/apps/{name}/debug/{sid}/tuples", methods=["GET"])
    @handler(mutating=True)
    def tuples(self, req, name, sid, **_):
        after = _int_param(req, "after", 0)
        limit = min(max(_int_param(req, "limit", 1000), 0), MAX_LIMIT)
        return 200, self.call(self.debugger.read, name, sid, after, limit)

    @route(API, PREFIX + "/debug/sessions/{sid}/records", methods=["POST"])
    @handler()
    def records(self, req, sid, **_):
        key = req.headers.get(KEY_HEADER, "")
        return 200, self.call(self.debugger.receive, sid, key, read_json(req))
