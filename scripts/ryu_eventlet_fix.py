"""Let Ryu 4.34 import under eventlet 0.33 (installed into the venv by scripts/setup.sh).

`ryu/app/wsgi.py` (imported by `ryu-manager` at start-up) does
`from eventlet.wsgi import ALREADY_HANDLED`; eventlet removed that constant in
0.30.3. Since then eventlet's websocket handler flags a handled request in
`eventlet.wsgi.WSGI_LOCAL.already_handled` and only *iterates* the result the
application returns, so an empty list is a faithful stand-in.

setup.sh copies this file into the venv's site-packages as
`_typhoon_ryu_eventlet_fix.py` and adds a `.pth` file that imports it at
interpreter start-up. It does not import eventlet itself: it adds a meta-path
finder that patches `eventlet.wsgi` when (and only when) something imports it,
so Python processes that never touch eventlet (Spark workers, tests) are
unaffected.
"""

import importlib.abc
import importlib.machinery
import sys

_TARGET = "eventlet.wsgi"


class _PatchingLoader(importlib.abc.Loader):
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


class _EventletWsgiFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader)
        return spec


def install():
    if not any(isinstance(f, _EventletWsgiFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _EventletWsgiFinder())


install()
