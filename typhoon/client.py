"""Client of the controller's REST API, for the CLI verbs and for scripts.

Where the controller is and which token to send, first found wins:

1. ``--controller URL`` / ``--token T`` on the command line;
2. ``$TYPHOON_CONTROLLER`` / ``$TYPHOON_TOKEN``;
3. a config file: ``--config FILE``, else ``$TYPHOON_CONFIG``, else
   ``~/.config/typhoon/client.ini``, an INI file with a ``[typhoon]`` section::

       [typhoon]
       controller = http://127.0.0.1:8080
       token = 5f2c...        # or api_token, so the controller's own file works too

4. ``http://127.0.0.1:8080`` and no token (reads work unless the controller has a
   ``read_token``; changes are refused).

The URL may be given with or without the ``/typhoon`` prefix of the API.

A request the controller could not take (connection refused or reset,
502/503/504) is tried again with exponential backoff (``retries``,
``backoff``): a read always, a change only when it surely was not sent
(refused).  A timeout is not tried again.
"""

from __future__ import annotations

import configparser
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_CONTROLLER = "http://127.0.0.1:8080"
DEFAULT_CONFIG = Path("~/.config/typhoon/client.ini")
RETRY_STATUS = (502, 503, 504)  # a proxy or a controller still starting


def token_in(headers: Mapping[str, str]) -> str:
    """The token a request carries: ``X-Typhoon-Token``, else ``Authorization: Bearer``
    (the controller's REST API and a tcp run's control endpoint read it the same way)."""
    token = headers.get("X-Typhoon-Token", "")
    if token:
        return token
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


class ApiCallError(Exception):
    """A request the controller refused (``status`` 4xx/5xx) or could not get (0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    @property
    def bad_request(self) -> bool:
        return 400 <= self.status < 500


@dataclass
class Endpoint:
    controller: str
    token: str


def resolve(
    controller: str | None = None, token: str | None = None, config: str | None = None
) -> Endpoint:
    """The controller URL and token (module docstring); a named config file must exist."""
    env = os.environ
    path = config or env.get("TYPHOON_CONFIG")
    section: dict[str, str] = {}
    if path and not Path(path).expanduser().is_file():
        raise ApiCallError(400, f"config file {path} does not exist")
    file = Path(path or DEFAULT_CONFIG).expanduser()
    if file.is_file():
        parser = configparser.ConfigParser()
        try:
            parser.read(file, encoding="utf-8")
        except configparser.Error as e:
            raise ApiCallError(400, f"config file {file} is not valid INI: {e}") from None
        if parser.has_section("typhoon"):
            section = dict(parser["typhoon"])
    url = (
        controller
        or env.get("TYPHOON_CONTROLLER")
        or section.get("controller")
        or DEFAULT_CONTROLLER
    )
    tok = token or env.get("TYPHOON_TOKEN") or section.get("token") or section.get("api_token")
    return Endpoint(url, tok or "")


class Client:
    """JSON over HTTP to the controller's ``/typhoon`` API."""

    def __init__(
        self,
        endpoint: Endpoint,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.2,
    ) -> None:
        base = endpoint.controller.rstrip("/")
        if "://" not in base:
            base = "http://" + base
        # the API root, or a resource under it (a debug worker's session URL)
        self.base = base if "/typhoon" in urllib.parse.urlsplit(base).path else base + "/typhoon"
        self.token = endpoint.token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.attempts = 0  # requests sent, retries included (tests, logs)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        text: str | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """One request, tried again on a transient failure (module docstring); the decoded
        JSON answer, or ApiCallError with the controller's reason."""
        for attempt in range(self.retries + 1):
            try:
                return self._once(method, path, body, text, content_type)
            except _Transient as t:
                if attempt == self.retries or not (method == "GET" or t.unsent):
                    raise t.error from None
                time.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")  # the loop returns or raises

    def exchange(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        text: str | None = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One request, not tried again: (HTTP status, decoded JSON body) for any answer,
        errors included; ApiCallError (status 0) if the controller did not answer."""
        try:
            return self._send(method, path, body, text, content_type, headers or {})
        except _Transient as t:
            raise t.error from None

    def _once(self, method: str, path: str, body: Any, text: str | None, content_type: str) -> Any:
        status, doc = self._send(method, path, body, text, content_type, {})
        if status < 400:
            return doc
        message = str((doc.get("error") if isinstance(doc, dict) else None) or f"HTTP {status}")
        if status == 401 and not self.token:
            message += f" ({NO_TOKEN})"
        error = ApiCallError(status, message)
        if status in RETRY_STATUS:
            raise _Transient(error, unsent=False)
        raise error

    def _send(
        self,
        method: str,
        path: str,
        body: Any,
        text: str | None,
        content_type: str,
        headers: dict[str, str],
    ) -> tuple[int, Any]:
        """The one place that speaks HTTP; _Transient when nothing answered."""
        self.attempts += 1
        data = text.encode() if text is not None else None
        if body is not None:
            data = json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("X-Typhoon-Token", self.token)
        for k, v in headers.items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
            try:
                return status, json.loads(raw or b"null")
            except ValueError:  # an error page that is not ours
                return status, {"error": str(e.reason)}
        except (urllib.error.URLError, OSError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            error = ApiCallError(0, unreachable(self.base, e))
            if isinstance(reason, TimeoutError):  # a hung controller: no waiting it out again
                raise error from None
            raise _Transient(error, isinstance(reason, ConnectionRefusedError)) from None
        try:
            return status, json.loads(raw or b"null")
        except ValueError as e:  # not JSON: not our controller, or a broken answer
            raise ApiCallError(0, f"the controller at {self.base} answered no JSON: {e}") from None


class _Transient(Exception):
    """A failure worth another try; ``unsent``: the request surely did not arrive."""

    def __init__(self, error: ApiCallError, unsent: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.unsent = unsent


NO_TOKEN = (
    "this request needs the API token: give it with --token, $TYPHOON_TOKEN or token = in "
    f"{DEFAULT_CONFIG}; the controller reads it from its api_token_file"
)


def unreachable(url: str, e: Exception) -> str:
    """One sentence for a controller that did not answer: where, why, and the likely cause."""
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, OSError) and reason.strerror:
        why = reason.strerror.lower()
    else:
        why = str(reason) or type(reason).__name__
    where = f"set it with --controller URL, $TYPHOON_CONTROLLER or controller = in {DEFAULT_CONFIG}"
    if isinstance(reason, ConnectionRefusedError):
        return (
            f"cannot reach the controller at {url} (connection refused): is it running, and "
            "does its REST API listen there? It listens on wsapi_host:wsapi_port of the "
            "[controller] section of its controller.conf, 127.0.0.1:8080 by default, so from "
            "another host go through ssh -L 8080:127.0.0.1:8080 or a TLS proxy "
            f"(docs/deploy.md section 6); {where}"
        )
    return f"cannot reach the controller at {url} ({why}): is the controller running? ({where})"
