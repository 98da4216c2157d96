# Derived from ryu/app/wsgi.py of Ryu 4.34:
# Copyright (C) 2012 Nippon Telegraph and Telephone Corporation.
# Licensed under the Apache License, Version 2.0 (LICENSE in this repository).
"""Ryu's REST framework (``ryu.app.wsgi``) for os-ken, which dropped it in 2.0.

The controller's REST API (controller/rest.py) and the dashboard's websocket
are written against ``ryu.app.wsgi``.  On os-ken, controller/framework/ryu_compat.py
takes the same names from here: routes + WebOb as in Ryu, served by os-ken's
eventlet hub.  Left out: Ryu's JSON-RPC over websocket (tinyrpc), which the
project does not use.  controller/framework/launcher.py starts the server with
``start_service`` as ``ryu-manager`` does.
"""

from __future__ import annotations

import inspect
from types import MethodType

import webob.dec
import webob.exc
from os_ken import cfg
from os_ken.lib import hub
from routes import Mapper
from routes.util import URLGenerator
from webob.request import Request as WebobRequest
from webob.response import Response as WebobResponse

DEFAULT_WSGI_HOST = "0.0.0.0"
DEFAULT_WSGI_PORT = 8080

CONF = cfg.CONF
CONF.register_cli_opts(
    [
        cfg.StrOpt("wsapi-host", default=DEFAULT_WSGI_HOST, help="webapp listen host"),
        cfg.IntOpt("wsapi-port", default=DEFAULT_WSGI_PORT, help="webapp listen port"),
    ]
)


def route(name, path, methods=None, requirements=None):
    """Mark a ControllerBase method as the handler of ``path``."""

    def _route(controller_method):
        controller_method.routing_info = {
            "name": name,
            "path": path,
            "methods": methods,
            "requirements": requirements,
        }
        return controller_method

    return _route


class Request(WebobRequest):
    """A WebOb request that decodes as UTF-8, as Ryu's does."""

    def __init__(self, environ, *args, charset="UTF-8", **kwargs):
        super().__init__(environ, *args, charset=charset, **kwargs)


class Response(WebobResponse):
    """A WebOb response that encodes as UTF-8, as Ryu's does."""

    def __init__(self, *args, charset="UTF-8", **kwargs):
        super().__init__(*args, charset=charset, **kwargs)


class _WebSocketRegistration:
    def __init__(self, func, controller):
        self._controller = controller
        self._method = MethodType(func, controller)

    def __call__(self, ws):
        manager = self._controller.parent.websocketmanager
        manager.add_connection(ws)
        try:
            self._method(ws)
        finally:
            manager.delete_connection(ws)


class _AlreadyHandledResponse(Response):
    # eventlet's websocket handler marks the request handled itself (since 0.30.3) and
    # only iterates what the application returns: nothing more may be written.
    def __call__(self, environ, start_response):
        return []


def websocket(name, path):
    """Mark a ControllerBase method as the handler of the websocket at ``path``."""

    def _websocket(controller_func):
        def __websocket(self, req, **_):
            ws_wsgi = hub.WebSocketWSGI(_WebSocketRegistration(controller_func, self))
            ws_wsgi(req.environ, req.start_response)
            return _AlreadyHandledResponse()

        __websocket.routing_info = {
            "name": name,
            "path": path,
            "methods": None,
            "requirements": None,
        }
        return __websocket

    return _websocket


class ControllerBase:
    special_vars = ["action", "controller"]

    def __init__(self, req, link, data, **config):
        self.req = req
        self.link = link
        self.data = data
        self.parent = None
        for name, value in config.items():
            setattr(self, name, value)

    def __call__(self, req):
        action = self.req.urlvars.get("action", "index")
        if hasattr(self, "__before__"):
            self.__before__()
        kwargs = {k: v for k, v in self.req.urlvars.items() if k not in self.special_vars}
        return getattr(self, action)(req, **kwargs)


class _WsgifyWithStartResponse(webob.dec.wsgify):
    def __call__(self, environ, start_response):
        self.kwargs["start_response"] = start_response
        return super().__call__(environ, start_response)


class WebSocketManager:
    def __init__(self):
        self._connections = []

    def add_connection(self, ws):
        self._connections.append(ws)

    def delete_connection(self, ws):
        self._connections.remove(ws)

    def broadcast(self, msg):
        for connection in self._connections:
            connection.send(msg)


class WSGIApplication:
    """The ``wsgi`` context apps register their ControllerBase classes with."""

    def __init__(self, **config):
        self.config = config
        self.mapper = Mapper()
        self.registory = {}  # Ryu's spelling: apps may read it
        self._wsmanager = WebSocketManager()

    @_WsgifyWithStartResponse
    def __call__(self, req, start_response):
        match = self.mapper.match(environ=req.environ)
        if not match:
            return webob.exc.HTTPNotFound()
        req.start_response = start_response
        req.urlvars = match
        link = URLGenerator(self.mapper, req.environ)
        data = self.registory.get(match["controller"].__name__)
        controller = match["controller"](req, link, data, **self.config)
        controller.parent = self
        return controller(req)

    def register(self, controller, data=None):
        def _routed(attr):
            return (inspect.ismethod(attr) or inspect.isfunction(attr)) and hasattr(
                attr, "routing_info"
            )

        for method_name, method in inspect.getmembers(controller, _routed):
            info = method.routing_info
            conditions = {"method": info["methods"]} if info.get("methods") else {}
            self.mapper.connect(
                info["name"],
                info["path"],
                controller=controller,
                requirements=info.get("requirements") or {},
                action=method_name,
                conditions=conditions,
            )
        if data:
            self.registory[controller.__name__] = data

    @property
    def websocketmanager(self):
        return self._wsmanager


class WSGIServer(hub.WSGIServer):
    def __init__(self, application, **config):
        super().__init__((CONF.wsapi_host, CONF.wsapi_port), application, **config)

    def __call__(self):
        self.serve_forever()


def start_service(app_mgr):
    """The REST server, if an app asked for the ``wsgi`` context (as in ``ryu-manager``)."""
    for instance in app_mgr.contexts.values():
        if instance.__class__ == WSGIApplication:
            return WSGIServer(instance)
    return None
