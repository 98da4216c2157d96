"""REST API of the controller (JSON), a thin layer over the core's services.

Every request that changes anything needs the token from the ``[typhoon]
api_token`` config option in an ``X-Typhoon-Token`` header.  Errors are 4xx
with ``{"error": "<one sentence>"}``; nothing is half-applied because each
handler validates everything before it calls a service.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from controller.ryu_compat import ControllerBase, Response, route
from typhoon.wire import Control, ControlTuple

API = "typhoon"
PREFIX = "/typhoon"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_response(status: int, body: Any) -> Response:
    return Response(
        status=status,
        content_type="application/json",
        charset="utf-8",
        body=json.dumps(body).encode(),
    )


def handler(mutating: bool = False) -> Callable:
    """Map ApiError (and any bug) to a JSON error; check the token when ``mutating``."""

    def wrap(fn: Callable) -> Callable:
        @wraps(fn)
        def inner(self: TyphoonRest, req, **kwargs):
            try:
                if mutating:
                    self.check_token(req)
                status, body = fn(self, req, **kwargs)
                return json_response(status, body)
            except ApiError as e:
                return json_response(e.status, {"error": e.message})
            except Exception as e:  # never let a request crash the controller
                self.core.logger.exception("REST %s %s failed", req.method, req.path)
                return json_response(500, {"error": f"internal error: {type(e).__name__}"})

        return inner

    return wrap


def read_json(req) -> dict[str, Any]:
    try:
        body = json.loads(req.body or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"request body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


class TyphoonRest(ControllerBase):
    def __init__(self, req, link, data, **config):
        super().__init__(req, link, data, **config)
        self.core = data["core"]
        self.token: str = data["token"]

    def check_token(self, req) -> None:
        given = req.headers.get("X-Typhoon-Token", "")
        if not self.token:
            raise ApiError(403, "changes are disabled: no api_token is configured")
        if not given:
            raise ApiError(401, "missing X-Typhoon-Token header")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise ApiError(403, "wrong token")

    def app_view(self, name: str):
        app = self.core.view.apps.get(name)
        if app is None:
            raise ApiError(404, f"no application named '{name}'")
        return app

    @route(API, PREFIX + "/apps", methods=["GET"])
    @handler()
    def list_apps(self, req, **_):
        return 200, {
            name: {"app_id": a.physical.app_id, "version": a.physical.version, **a.state}
            for name, a in self.core.view.apps.items()
        }

    @route(API, PREFIX + "/apps/{name}", methods=["GET"])
    @handler()
    def app_status(self, req, name, **_):
        app = self.app_view(name)
        metrics = self.core.coordinator.get_metrics(name)
        workers = []
        for w in app.physical.workers:
            s = app.statuses.get(w.worker_id)
            m = metrics.get(w.worker_id, {})
            workers.append(
                {
                    "worker": w.worker_id,
                    "node": w.node,
                    "index": w.index,
                    "host": w.host,
                    "port": w.port,
                    "state": s.state if s else "unknown",
                    "in": m.get("in", {}),
                    "out": m.get("out", {}),
                    "queue": m.get("queue"),
                }
            )
        return 200, {
            "name": name,
            "app_id": app.physical.app_id,
            "version": app.physical.version,
            "state": app.state,
            "workers": workers,
            "problem": self.core.view.problems.get(name),
        }

    @route(API, PREFIX + "/apps/{name}/metrics", methods=["GET"])
    @handler()
    def app_metrics(self, req, name, **_):
        self.app_view(name)
        return 200, {str(k): v for k, v in self.core.coordinator.get_metrics(name).items()}

    @route(API, PREFIX + "/apps/{name}/acks", methods=["GET"])
    @handler()
    def app_acks(self, req, name, **_):
        """Recent confirmations (ROUTING, SIGNAL, DRAIN) from the app's workers."""
        self.app_view(name)
        return 200, [a for a in self.core.acks if a["app"] == name]

    @route(API, PREFIX + "/apps/{name}/responses/{request_id}", methods=["GET"])
    @handler()
    def app_responses(self, req, name, request_id, **_):
        """METRIC_RESPs that answered one METRIC_REQ, by worker."""
        app = self.app_view(name)
        try:
            rid = int(request_id)
        except ValueError:
            raise ApiError(400, "request id must be an integer") from None
        ids = {w.worker_id for w in app.physical.workers}
        got = self.core.responses.get(rid, {})
        return 200, {str(w): m for w, m in got.items() if w in ids}

    @route(API, PREFIX + "/apps/{name}/control", methods=["POST"])
    @handler(mutating=True)
    def control(self, req, name, **_):
        """Send a control tuple: {"type": "INPUT_RATE", "body": {...}, "workers": [..] | "node"}."""
        app = self.app_view(name)
        body = read_json(req)
        unknown = set(body) - {"type", "body", "workers", "node"}
        if unknown:
            raise ApiError(400, f"unknown field(s): {', '.join(sorted(unknown))}")
        tname = body.get("type")
        if not isinstance(tname, str) or tname.upper() not in Control.__members__:
            raise ApiError(400, f"'type' must be one of {', '.join(Control.__members__)}")
        ctype = Control[tname.upper()]
        if ctype == Control.METRIC_RESP:
            raise ApiError(400, "METRIC_RESP is sent by workers, not to them")
        ct_body = body.get("body", {})
        if not isinstance(ct_body, dict):
            raise ApiError(400, "'body' must be a JSON object")
        ids = {w.worker_id for w in app.physical.workers}
        if "workers" in body and "node" in body:
            raise ApiError(400, "give 'workers' or 'node', not both")
        if "node" in body:
            if body["node"] not in app.topology.nodes:
                raise ApiError(404, f"no node named '{body['node']}' in '{name}'")
            targets = [w.worker_id for w in app.physical.of_node(body["node"])]
        else:
            targets = body.get("workers", sorted(ids))
            if not isinstance(targets, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in targets
            ):
                raise ApiError(400, "'workers' must be a list of worker ids")
            missing = sorted(set(targets) - ids)
            if missing:
                raise ApiError(404, f"no worker(s) {missing} in '{name}'")
        ct = ControlTuple(ctype, ct_body)
        try:
            from typhoon.wire import encode_control

            encode_control(ct)
        except (ValueError, TypeError) as e:
            raise ApiError(400, f"bad {ctype.name} body: {e}") from None
        sent = self.core.send_control(name, targets, ct)
        return 202, {"sent": sent, "workers": targets}
