"""The control endpoint of a running tcp job: the sdn REST API's update routes, served by the run.

A tcp run has no controller; with an endpoint (``RunOptions.endpoint``, on by
default for ``typhoon run --transport tcp``) the same verbs reach it as on sdn,
with the same paths, bodies and answers (``controller/rest.py``)::

    POST /typhoon/apps/NAME/scale|route|swap|insert|remove|move|unchain|chain   202 + record
    GET  /typhoon/apps/NAME/reconfig       the running (or last) update, step by step

The endpoint is thin: it checks the token and the body (``parse_request``, as
the controller does), hands the request to the run's
:class:`typhoon.tcp_reconfig.Rescaler` and waits until the run loop planned or
refused it.  What tcp cannot do (insert, remove, move, a reroute that is not
``direct``, a swap not in place) is refused there in one sentence naming
``--transport sdn`` (``typhoon.tcp_requests.tcp_refusal``); an unknown node or
worker is the plan's 404.

Security: it listens on 127.0.0.1 unless told otherwise, and every request
needs the run's own token (``X-Typhoon-Token`` or ``Authorization: Bearer``,
compared in constant time), which only the run's user can read
(``typhoon.tcp_jobs``).  A request it refuses gets a 4xx JSON error with one
sentence and is counted by reason (the run report's ``control_endpoint``); none
stops the run.  One request at a time, each connection with a 5 s timeout.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import socketserver
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Protocol, TextIO, cast

from typhoon.client import token_in
from typhoon.private_files import SecretFileError
from typhoon.reconfig import KINDS, ReconfigError, describe, parse_request
from typhoon.tcp_jobs import JobNameTaken, TcpJob, register, unregister
from typhoon.tcp_reconfig import Record

log = logging.getLogger(__name__)

MAX_BODY = 1 << 16  # bytes: an update request is a few dozen
SETTLE_S = 10.0  # how long a POST waits for the run loop to plan or refuse it
REQUEST_TIMEOUT_S = 5.0  # a connection that sends nothing for this long is closed
PREFIX = "/typhoon/apps/"
SDN_ONLY = (
    "a tcp run's control endpoint takes only the update verbs ({verbs}) and GET "
    "/typhoon/apps/{name}/reconfig; {what} needs --transport sdn"
)


class Rescaler(Protocol):
    """What the endpoint needs of :class:`typhoon.tcp_reconfig.Rescaler`."""

    records: list[Record]

    def request(self, request: Any) -> Record: ...


@dataclass
class ControlApi:
    """The routes, without HTTP: ``handle`` maps one request to (status, JSON body)."""

    name: str
    token: str
    rescaler: Rescaler
    settle_s: float = SETTLE_S
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    closing: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, Any]]:
        """Token, route, body, then the rescaler; every refusal is counted."""
        try:
            status, doc = self._route(method, path, headers, body)
        except _Refused as r:
            self.count(r.reason)
            return r.status, {"error": r.message}
        self.accepted += 1
        return status, doc

    def count(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def summary(self) -> dict[str, Any]:
        """What the run report says of the endpoint."""
        return {"accepted": self.accepted, "rejected": dict(self.rejected)}

    def _route(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, Any]]:
        self._check_token(headers)
        parts = path.split("?", 1)[0].split("/")
        # "", "typhoon", "apps", NAME, WHAT
        if len(parts) != 5 or parts[:3] != ["", "typhoon", "apps"] or not parts[4]:
            what = "this path" if not path.startswith(PREFIX) else f"{method} {path}"
            raise _Refused(404, "not_found", self._sdn_only(what))
        name, what = parts[3], parts[4]
        if name != self.name:
            raise _Refused(
                404, "unknown_app", f"no application named '{name}' (this tcp run is '{self.name}')"
            )
        if what == "reconfig":
            if method != "GET":
                raise _Refused(405, "method", f"{method} {path}: use GET")
            return 200, self._latest()
        if what not in KINDS:
            raise _Refused(404, "not_found", self._sdn_only(f"'{what}'"))
        if method != "POST":
            raise _Refused(405, "method", f"{method} {path}: use POST")
        return self._update(what, body)

    def _sdn_only(self, what: str) -> str:
        return SDN_ONLY.format(verbs=", ".join(KINDS), name=self.name, what=what)

    def _check_token(self, headers: Mapping[str, str]) -> None:
        given = token_in(headers)
        if not given:
            raise _Refused(
                401,
                "missing_token",
                f"missing token: the tcp run '{self.name}' needs its own token "
                "(typhoon finds it by the job's name, typhoon/tcp_jobs.py)",
            )
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise _Refused(403, "wrong_token", "wrong token")

    def _update(self, kind: str, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            doc = json.loads(body or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise _Refused(400, "malformed", f"request body is not valid JSON ({e})") from None
        try:
            request = parse_request(kind, doc)
        except ReconfigError as e:
            raise _Refused(e.status, "bad_request", e.message) from None
        with self._lock:  # one update at a time, as on sdn
            running = next((r for r in self.rescaler.records if r.state == "pending"), None)
            if running is not None:
                raise _Refused(
                    409,
                    "busy",
                    f"reconfiguration {running.id} ({describe(running.request)}) of "
                    f"'{self.name}' is still running; wait for it (typhoon reconfig {self.name})",
                )
            rec = self.rescaler.request(request)
        deadline = time.monotonic() + self.settle_s
        while not rec.settled.wait(0.05):
            if self.closing.is_set():
                why = f"the tcp run '{self.name}' ended before it ran {describe(request)}"
                raise _Refused(409, "ended", why)
            if time.monotonic() > deadline:
                break  # the run loop is busy (a recovery, say): it runs the request later
        if rec.state == "refused":
            raise _Refused(rec.status or 409, "refused", rec.error)
        return 202, record_doc(self.name, rec)

    def _latest(self) -> dict[str, Any]:
        records = list(self.rescaler.records)
        if not records:
            raise _Refused(
                404, "not_found", f"'{self.name}' has not been reconfigured during this run"
            )
        running = next((r for r in records if r.state == "pending"), None)
        return record_doc(self.name, running or records[-1])


class _Refused(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def record_doc(name: str, rec: Record) -> dict[str, Any]:
    """A tcp update record in the shape of the controller's (``GET .../reconfig``): a
    queued or running one is ``running``; the tcp states ``refused``, ``failed`` and
    ``restarted`` (typhoon.tcp_reconfig.Record) stay as they are."""
    doc = rec.to_dict()
    doc["steps"] = [_on_tcp(dict(s)) for s in list(rec.steps)]
    state = "running" if doc["state"] == "pending" else doc["state"]
    version = rec.physical.version if rec.physical is not None else None
    return {**doc, "app": name, "state": state, "version": version, "rollback": []}


def _on_tcp(step: dict[str, Any]) -> dict[str, Any]:
    """The plan's rule steps say what the controller does on sdn; on tcp they do nothing."""
    if step["action"] in ("keep_rules", "wait_rules", "drop_rules") and not step["detail"]:
        step["detail"] = "no switch on tcp: nothing to do"
    return step


class _Handler(BaseHTTPRequestHandler):
    api: ControlApi  # set on the subclass ControlEndpoint makes
    timeout = REQUEST_TIMEOUT_S
    server_version = "typhoon-tcp"

    def _serve(self) -> None:
        self.close_connection = True  # one request per connection: no idle keep-alive
        try:
            body = self._body()
            if body is None:
                return
            headers = cast(Mapping[str, str], self.headers)
            status, doc = self.api.handle(self.command, self.path, headers, body)
        except OSError:  # the client went away or stalled: nothing to answer
            self.api.count("closed")
            return
        except Exception:  # never let a request stop the run
            log.exception("tcp control endpoint: %s %s failed", self.command, self.path)
            self.api.count("internal")
            status, doc = 500, {"error": "internal error of the tcp control endpoint"}
        self._reply(status, doc)

    def _body(self) -> bytes | None:
        raw = self.headers.get("Content-Length")
        if raw is None:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                self.api.count("malformed")
                self._reply(411, {"error": "send the body with a Content-Length"})
                return None
            return b""
        try:
            length = int(raw)
        except ValueError:
            length = -1
        if length < 0:
            self.api.count("malformed")
            self._reply(400, {"error": f"Content-Length '{raw[:40]}' is not a length"})
            return None
        if length > MAX_BODY:
            self.api.count("too_large")
            self._reply(413, {"error": f"request body is larger than {MAX_BODY} bytes"})
            return None
        body = self.rfile.read(length)
        if len(body) < length:
            raise OSError("the request body ended early")
        return body

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve

    def _reply(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            self.api.count("closed")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """A request line or headers http.server could not parse: counted, JSON."""
        self.api.count("malformed")
        self.close_connection = True
        self._reply(code, {"error": message or HTTPStatus(code).phrase})

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        log.debug("tcp control endpoint: " + format, *args)


class _Server(HTTPServer):
    def server_bind(self) -> None:
        """As HTTPServer's, without its reverse DNS lookup of the address (getfqdn)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class ControlEndpoint:
    """The HTTP server of one run, on its own thread (``close`` stops it)."""

    def __init__(self, api: ControlApi, host: str, port: int) -> None:
        self.api = api
        handler = type("Handler", (_Handler,), {"api": api})
        self.server = _Server((host, port), handler)
        bound, bound_port = self.server.server_address[:2]
        self.loopback = ipaddress.ip_address(bound).is_loopback
        shown = "127.0.0.1" if bound == "0.0.0.0" else str(bound)
        self.url = f"http://{shown}:{bound_port}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(0.1,), name="tcp-control", daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.api.closing.set()  # a POST waiting for the run loop answers now
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``typhoon run --control``; port 0: any free one); ValueError says why."""
    host, sep, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not sep or not host or ":" in host or not 0 <= number <= 65535:
        raise ValueError(
            f"--control '{text}' is not of the form HOST:PORT (an IPv4 address or name, port "
            "0-65535, 0: any free one), e.g. 127.0.0.1:0, or 'off'"
        )
    return host, number


@contextlib.contextmanager
def serving(cluster: Any, address: str | None, out: TextIO) -> Iterator[ControlEndpoint | None]:
    """The run's endpoint at ``address`` (None: none) while the block runs, registered under
    the job's name (typhoon.tcp_jobs); a name taken by a running job, or an address that
    cannot be bound, leaves the run without one (one line on ``out``)."""
    if address is None:
        yield None
        return
    name = cluster.topology.name
    api = ControlApi(name, secrets.token_urlsafe(32), cluster.rescaler)
    try:
        endpoint = ControlEndpoint(api, *parse_endpoint(address))
    except (OSError, ValueError) as e:
        print(f"warning: no control endpoint for '{name}' at {address}: {e}", file=out)
        yield None
        return
    job = TcpJob(name, endpoint.url, api.token, os.getpid())
    try:
        register(job)
    except (JobNameTaken, SecretFileError, OSError) as e:
        print(f"warning: {e}", file=out)
        endpoint.close()
        yield None
        return
    if not endpoint.loopback:
        print(
            f"warning: the control endpoint of '{name}' listens on {endpoint.url}, plain "
            "HTTP beyond this host: its token crosses the network readable",
            file=out,
        )
    log.info("tcp run '%s': control endpoint at %s", name, endpoint.url)
    if getattr(cluster.options, "live", False):
        print(
            f"control endpoint of '{name}': {endpoint.url} ({name}: typhoon unchain, …)", file=out
        )
    try:
        yield endpoint
    finally:
        unregister(job)
        endpoint.close()
