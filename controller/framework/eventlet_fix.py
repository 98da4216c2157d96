"""Let Ryu 4.34 import under eventlet 0.33: ``install()`` before anything imports Ryu.

`ryu/app/wsgi.py` (imported by `ryu-manager` at start-up) does
`from eventlet.wsgi import ALREADY_HANDLED`; eventlet removed that constant in
0.30.3. Since then eventlet's websocket handler flags a handled request in
`eventlet.wsgi.WSGI_LOCAL.already_handled` and only *iterates* the result the
application returns, so an empty list is a faithful stand-in.

`install()` does not import eventlet itself: it adds a meta-path finder that
patches `eventlet.wsgi` when (and only when) something imports it, so Python
processes that never touch eventlet are unaffected.  Two callers: the
`typhoon-controller` entry point (controller/daemon.py) calls it before it
imports Ryu, which is all a `pip install` needs; scripts/setup.sh also copies
this file (standard library only) into the development venv with a `.pth` line
that calls it at interpreter start-up, so a bare `ryu-manager apps/...` works
there too.
"""

import importlib.machinery
import sys

_TARGET = "eventlet.wsgi"


# Not subclasses of importlib.abc's classes (the import system only calls the methods):
# importing importlib.abc costs every Python process of the venv ~25 ms at start-up.


class _PatchingLoader:
    """Runs the real loader, then adds the missing constant."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        if not hasattr(module, "ALREADY_HANDLED"):
            module.ALREADY_HANDLED = []

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _EventletWsgiFinder:
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader)
        return spec


def install() -> None:
    """Patch `eventlet.wsgi` on import (idempotent)."""
    if not any(isinstance(f, _EventletWsgiFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _EventletWsgiFinder())
