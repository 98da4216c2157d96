"""REST API of the controller (JSON), a thin layer over the core's services.

Every request that changes anything needs the token from the ``[typhoon]
api_token`` config option in an ``X-Typhoon-Token`` header.  Reading is open
unless ``[typhoon] read_token`` is set: then every GET (``/metrics`` too, not
the dashboard page's own files) needs it, or the change token, in that header
or as ``Authorization: Bearer TOKEN`` (what Prometheus sends).  Errors are 4xx
with ``{"error": "<one sentence>"}``; nothing is half-applied because each
handler validates everything before it calls a service (a reconfiguration is
planned in full before its first step runs).

    GET    /typhoon/apps                       applications
    POST   /typhoon/apps                       submit {"topology": "<YAML text>",
                                               "remove_when_done": false} (or YAML body)
    GET    /typhoon/apps/NAME                  workers, hosts, ports, states, rates
    DELETE /typhoon/apps/NAME                  kill
    POST   /typhoon/apps/NAME/scale            {"node": N, "parallelism": P}
    POST   /typhoon/apps/NAME/route            {"stream": ID, "policy": P, "fields": [..]}
    POST   /typhoon/apps/NAME/swap             {"node": N, "operator": OP, "args": {..}}
    POST   /typhoon/apps/NAME/insert           {"node": N, "operator": OP, "from": A, "to": B, ..}
    POST   /typhoon/apps/NAME/remove           {"node": N}
    POST   /typhoon/apps/NAME/move             {"worker": ID, "host": H} (with its state)
    POST   /typhoon/apps/NAME/unchain|chain    {"node": N, "worker": ID (optional)}: chained
                                               edges on the network / calls again, live
    GET    /typhoon/apps/NAME/reconfig         the running (or last) reconfiguration, step by step
    POST   /typhoon/apps/NAME/control          one control tuple to workers {"type": T, "body":
                                               {..}, "node": N | "workers": [..]}; protocol
                                               steps refused unless "force" (control_request.py)
    GET    /typhoon/apps/NAME/report           the merged run report (also of a removed job)
    GET    /typhoon/apps/NAME/metrics|acks     raw worker metrics, recent acks
    GET    /typhoon/dashboard                  what the dashboard shows (controller/dashboard.py)
    GET    /metrics                            Prometheus text format (controller/metrics.py)
    GET    /dashboard                          the web dashboard (controller/dashboard_static/)

A reconfiguration answers 202 with its plan; 409 while another one of the
same application runs.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

from controller.control_request import ControlRequestError, parse_control
from controller.dashboard import gather, snapshot
from controller.framework.ryu_compat import ControllerBase, Response, lookup_service_brick, route
from controller.metrics import CONTENT_TYPE, exposition
from typhoon.client import token_in
from typhoon.job_report import read_job_report
from typhoon.manager import ManagerError
from typhoon.reconfig import ReconfigError, parse_request
from typhoon.topology import TopologyError, load_topology_text

API = "typhoon"
PREFIX = "/typhoon"
MAX_BODY = 1 << 20  # bytes; a topology file is far smaller
DASHBOARD_DIR = Path(__file__).with_name("dashboard_static")
# the page's files, by the name in the URL: nothing else under the directory is served
DASHBOARD_FILES = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "control.js": "text/javascript",
    "dashboard.css": "text/css",
}


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


READ_TOKENS = "typhoon_read_tokens"  # attribute of the WSGI app: the tokens a GET needs


def set_read_tokens(wsgi: Any, read_token: str, api_token: str) -> None:
    """Once ``read_token`` is set, every GET served by ``wsgi`` needs it (or ``api_token``).

    Kept on the one WSGI application every app registers its views with, so a
    view added by any app is covered without being told.
    """
    setattr(wsgi, READ_TOKENS, tuple(t for t in (read_token, api_token) if t) if read_token else ())


def given_token(req) -> str:
    """The token in ``X-Typhoon-Token``, else in ``Authorization: Bearer``."""
    return token_in(req.headers)


def check_read(view: Any, req) -> None:
    """Refuse a GET without a token the controller accepts for reading (if it needs one)."""
    tokens = getattr(getattr(view, "parent", None), READ_TOKENS, ())
    if not tokens:
        return
    given = given_token(req)
    if not given:
        raise ApiError(
            401,
            "missing token: this controller needs its read token on every GET "
            "(X-Typhoon-Token or Authorization: Bearer)",
        )
    matches = [hmac.compare_digest(given.encode(), t.encode()) for t in tokens]
    if not any(matches):
        raise ApiError(403, "wrong token")


def handler(mutating: bool = False) -> Callable:
    """Map ApiError (and any bug) to a JSON error; check the token when ``mutating``,
    the read token (if one is set) on a GET."""

    def wrap(fn: Callable) -> Callable:
        @wraps(fn)
        def inner(self: TyphoonRest, req, **kwargs):
            try:
                if mutating:
                    self.check_token(req)
                elif req.method in ("GET", "HEAD"):
                    check_read(self, req)
                status, body = fn(self, req, **kwargs)
                return json_response(status, body)
            except ApiError as e:
                return json_response(e.status, {"error": e.message})
            except ReconfigError as e:
                return json_response(e.status, {"error": e.message})
            except Exception as e:  # never let a request crash the controller
                self.core.logger.exception("REST %s %s failed", req.method, req.path)
                return json_response(500, {"error": f"internal error: {type(e).__name__}"})

        return inner

    return wrap


def read_body(req) -> bytes:
    """The request body, refused (413) once more than MAX_BODY bytes have been read.

    Content-Length is checked before reading; a chunked body has none, so it
    is read from the server's decoded input in pieces and the count decides.
    Without either there is no body (reading on would wait for the client).
    """
    length = req.content_length
    if length is not None and length > MAX_BODY:
        raise ApiError(413, f"request body is larger than {MAX_BODY} bytes")
    environ = req.environ
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    if length is None and not (chunked or environ.get("wsgi.input_terminated")):
        return b""
    stream, want = environ["wsgi.input"], MAX_BODY + 1 if length is None else length
    parts: list[bytes] = []
    got = 0
    while got < want:
        piece = stream.read(min(1 << 16, want - got))
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    if got > MAX_BODY:
        raise ApiError(413, f"request body is larger than {MAX_BODY} bytes")
    return b"".join(parts)


def read_json(req) -> dict[str, Any]:
    try:
        body = json.loads(read_body(req) or b"{}")
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
        # finds the control-plane apps for the dashboard (a dict's .get in unit tests)
        self.lookup: Callable[[str], Any] = data.get("lookup", lookup_service_brick)

    def check_token(self, req) -> None:
        given = given_token(req)
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

    @route(API, "/metrics", methods=["GET"])
    def prometheus_metrics(self, req, **_):
        """Prometheus scrapes this (with ``authorization: {credentials: READ_TOKEN}`` when a
        read token is set)."""
        try:
            check_read(self, req)
        except ApiError as e:
            return json_response(e.status, {"error": e.message})
        try:
            body = exposition(self.core.metrics_registry)
        except Exception as e:  # never let a scrape crash the controller
            self.core.logger.exception("GET /metrics failed")
            return json_response(500, {"error": f"internal error: {type(e).__name__}"})
        resp = Response(status=200, body=body)
        resp.headers["Content-Type"] = CONTENT_TYPE
        return resp

    # ----- the web dashboard -----------------------------------------------------------------

    @route(API, "/dashboard", methods=["GET"])
    def dashboard_page(self, req, **_):
        """The page itself; it reads ``GET /typhoon/dashboard`` and calls the API below."""
        return self._dashboard_file("index.html")

    @route(API, "/dashboard/{asset}", methods=["GET"])
    def dashboard_asset(self, req, asset, **_):
        return self._dashboard_file(asset)

    def _dashboard_file(self, name: str) -> Response:
        """A file of the page: open even with a read token (no data in it; the page reads
        the API with the token typed into it)."""
        ctype = DASHBOARD_FILES.get(name)
        if ctype is None:
            return json_response(404, {"error": f"the dashboard has no file named '{name}'"})
        resp = Response(status=200, body=(DASHBOARD_DIR / name).read_bytes())
        resp.headers["Content-Type"] = f"{ctype}; charset=utf-8"
        resp.headers["Cache-Control"] = "no-cache"
        return resp

    @route(API, PREFIX + "/dashboard", methods=["GET"])
    @handler()
    def dashboard_data(self, req, **_):
        """Hosts, applications (nodes, workers, streams, rates) and the apps' reports."""
        return 200, snapshot(gather(self.core, self.lookup, time.time()))

    @route(API, PREFIX + "/apps", methods=["GET"])
    @handler()
    def list_apps(self, req, **_):
        return 200, {
            name: {"app_id": a.physical.app_id, "version": a.physical.version, **a.state}
            for name, a in self.core.view.apps.items()
        }

    @route(API, PREFIX + "/apps", methods=["POST"])
    @handler(mutating=True)
    def api_submit(self, req, **_):
        """Submit a topology: {"topology": "<YAML>"} or the YAML text itself as the body."""
        ctype = (req.content_type or "").lower()
        remove_when_done = False
        if "yaml" in ctype or ctype.startswith("text/"):
            try:
                text = read_body(req).decode("utf-8")
            except UnicodeDecodeError:
                raise ApiError(400, "topology text is not UTF-8") from None
        else:
            body = read_json(req)
            unknown = sorted(str(k) for k in set(body) - {"topology", "remove_when_done"})
            if unknown:
                raise ApiError(400, f"unknown field(s): {', '.join(unknown)}")
            remove_when_done = body.get("remove_when_done", False)
            if not isinstance(remove_when_done, bool):
                raise ApiError(400, "'remove_when_done' must be true or false")
            text = body.get("topology")
            if not isinstance(text, str) or not text.strip():
                raise ApiError(400, "'topology' must be the topology file's YAML text")
        try:
            topology = load_topology_text(text, "topology", allow_imports=False, env="refuse")
        except TopologyError as e:
            raise ApiError(400, str(e)) from None
        refusal = self.core.recovery_refusal(topology)  # a guarantee needs its recovery
        if refusal:
            raise ApiError(409, refusal)
        try:
            physical = self.core.manager.submit(topology, remove_when_done)
        except ManagerError as e:
            raise ApiError(409, str(e)) from None
        return 201, {
            "name": topology.name,
            "app_id": physical.app_id,
            "version": physical.version,
            "workers": [w.to_dict() for w in physical.workers],
        }

    @route(API, PREFIX + "/apps/{name}", methods=["DELETE"])
    @handler(mutating=True)
    def api_kill(self, req, name, **_):
        try:
            self.core.manager.kill(name)
        except ManagerError as e:
            raise ApiError(404, str(e)) from None
        return 200, {"killed": name}

    @route(API, PREFIX + "/apps/{name}", methods=["GET"])
    @handler()
    def app_status(self, req, name, **_):
        app = self.app_view(name)
        metrics = self.core.coordinator.get_metrics(name)
        rates = self.core.rates.get(name, {})
        workers = []
        for w in app.physical.workers:
            m = metrics.get(w.worker_id, {})
            workers.append(
                {
                    **app.worker_summary(w),
                    "in": m.get("in", {}),
                    "out": m.get("out", {}),
                    "queue": m.get("queue"),
                    "rate": rates.get(w.worker_id, {}),
                    # event time (docs/windows.md): None before the first watermark
                    **{k: m[k] for k in ("watermark", "watermark_closed") if k in m},
                }
            )
        reconfig = self.core.reconfigs.get(name)
        return 200, {
            "name": name,
            "app_id": app.physical.app_id,
            "version": app.physical.version,
            "state": app.state,
            "nodes": {
                n.name: {"operator": n.operator, "args": n.args, "parallelism": n.parallelism}
                for n in app.topology.nodes.values()
            },
            "streams": [
                {
                    "id": s.id,
                    "from": s.src,
                    "to": s.dst,
                    "policy": s.grouping.type,
                    "fields": list(s.grouping.fields),
                }
                for s in app.topology.streams
            ],
            "workers": workers,
            "reconfig": reconfig.to_dict() if reconfig else None,
            "problem": self.core.view.problems.get(name),
        }

    # ----- reconfiguration -----------------------------------------------------------------

    def _reconfigure(self, req, name: str, kind: str):
        body = read_json(req)
        request = parse_request(kind, body)
        record = self.core.reconfigure(name, request)
        return 202, record.to_dict()

    @route(API, PREFIX + "/apps/{name}/scale", methods=["POST"])
    @handler(mutating=True)
    def api_scale(self, req, name, **_):
        return self._reconfigure(req, name, "scale")

    @route(API, PREFIX + "/apps/{name}/route", methods=["POST"])
    @handler(mutating=True)
    def api_route(self, req, name, **_):
        return self._reconfigure(req, name, "route")

    @route(API, PREFIX + "/apps/{name}/swap", methods=["POST"])
    @handler(mutating=True)
    def api_swap(self, req, name, **_):
        return self._reconfigure(req, name, "swap")

    @route(API, PREFIX + "/apps/{name}/insert", methods=["POST"])
    @handler(mutating=True)
    def api_insert(self, req, name, **_):
        return self._reconfigure(req, name, "insert")

    @route(API, PREFIX + "/apps/{name}/remove", methods=["POST"])
    @handler(mutating=True)
    def api_remove(self, req, name, **_):
        return self._reconfigure(req, name, "remove")

    @route(API, PREFIX + "/apps/{name}/move", methods=["POST"])
    @handler(mutating=True)
    def api_move(self, req, name, **_):
        return self._reconfigure(req, name, "move")

    @route(API, PREFIX + "/apps/{name}/unchain", methods=["POST"])
    @handler(mutating=True)
    def api_unchain(self, req, name, **_):
        return self._reconfigure(req, name, "unchain")

    @route(API, PREFIX + "/apps/{name}/chain", methods=["POST"])
    @handler(mutating=True)
    def api_chain(self, req, name, **_):
        return self._reconfigure(req, name, "chain")

    @route(API, PREFIX + "/apps/{name}/reconfig", methods=["GET"])
    @handler()
    def reconfig_status(self, req, name, **_):
        """The running or last reconfiguration of ``name``, step by step."""
        record = self.core.reconfigs.get(name)
        if record is None:
            if self.core.coordinator.get_topology(name) is None:
                raise ApiError(404, f"no application named '{name}'")
            raise ApiError(404, f"'{name}' has not been reconfigured by this controller")
        return 200, record.to_dict()

    @route(API, PREFIX + "/apps/{name}/report", methods=["GET"])
    @handler()
    def app_report(self, req, name, **_):
        """The merged run report (typhoon/job_report.py): stored once finished, else as
        it stands; a finished job's report outlives the job."""
        app = self.core.view.apps.get(name)
        stored = self.core.coordinator.get_result(name)
        if stored is not None and (app is None or app.state.get("finished")):
            return 200, stored
        report = read_job_report(self.core.coordinator, name)  # also just submitted
        if report is None and stored is not None:
            # removed since the view's last poll (--remove-when-done runs right after the
            # report is stored): the stored report is its final one
            return 200, stored
        if report is None:
            raise ApiError(404, f"no application named '{name}' and no stored report of one")
        return 200, report

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
        """Send a control tuple: {"type": "INPUT_RATE", "body": {...}, "workers": [..] | "node",
        "force": false} (controller/control_request.py says what is refused)."""
        app = self.app_view(name)
        body = read_json(req)
        try:
            request = parse_control(
                body, name, app.topology, app.physical, self.core.channel.next_request_id
            )
        except ControlRequestError as e:
            raise ApiError(e.status, e.message) from None
        sent = self.core.send_control(name, request.workers, request.tuple)
        return 202, request.reply(sent)
