"""controller/framework/osken_wsgi.py, Ryu's REST framework carried over for os-ken.

The same requests through it and through Ryu's own ``ryu.app.wsgi`` (when
Ryu is installed) give the same answers: routing by path and method, path
variables, the data registered with a controller class, 404 off the map.
"""

from __future__ import annotations

import json
import os

import pytest
from webob import Request

from controller.framework import backend

if not backend.installed("os_ken"):  # a dependency of the package: only a broken venv lacks it
    pytest.fail("os-ken is not installed (pip install -e .)", pytrace=False)
os.environ.setdefault("OSKEN_HUB_TYPE", "eventlet")  # as controller/framework/ryu_compat.py does
from controller.framework import osken_wsgi  # noqa: E402


def frameworks():
    yield osken_wsgi
    if backend.installed("ryu"):
        from controller.framework.eventlet_fix import install

        install()
        import ryu.app.wsgi

        yield ryu.app.wsgi


def make_app(wsgi):
    class Items(wsgi.ControllerBase):
        @wsgi.route("items", "/items/{name}", methods=["GET"])
        def get(self, req, name):
            body = json.dumps({"name": name, "owner": self.data["owner"]})
            return wsgi.Response(status=200, content_type="application/json", body=body)

        @wsgi.route("items", "/items/{name}", methods=["DELETE"])
        def delete(self, req, name):
            return wsgi.Response(status=204)

        @wsgi.route("items", "/count/{n}", methods=["GET"], requirements={"n": r"[0-9]+"})
        def count(self, req, n):
            return wsgi.Response(status=200, body=str(int(n) + 1).encode())

    app = wsgi.WSGIApplication()
    app.register(Items, {"owner": "typhoon"})
    return app


def answers(app) -> list[tuple[int, str]]:
    out = []
    for method, path in [
        ("GET", "/items/a%20b"),
        ("DELETE", "/items/x"),
        ("POST", "/items/x"),
        ("GET", "/count/41"),
        ("GET", "/count/x"),
        ("GET", "/nowhere"),
    ]:
        resp = Request.blank(path, method=method).get_response(app)
        out.append((resp.status_int, resp.text if resp.status_int != 404 else ""))
    return out


def test_the_port_routes_as_ryu_does():
    got = {w.__name__: answers(make_app(w)) for w in frameworks()}
    port = got["controller.framework.osken_wsgi"]
    assert port == [
        (200, '{"name": "a b", "owner": "typhoon"}'),
        (204, ""),
        (404, ""),
        (200, "42"),
        (404, ""),
        (404, ""),
    ]
    if "ryu.app.wsgi" in got:
        assert got["ryu.app.wsgi"] == port


def test_responses_are_utf8():
    resp = osken_wsgi.Response(status=200, body="é".encode())
    assert resp.charset.lower() == "utf-8" and resp.text == "é"
