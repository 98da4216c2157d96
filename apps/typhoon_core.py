"""Entry point of the Typhoon controller: `ryu-manager apps/typhoon_core.py [apps/<app>.py …]`.

ryu-manager only instantiates a RyuApp class *defined* in the file it is given
(it compares the class's `__module__` with the module it loaded), so importing
`TyphoonController` here would not start it. Instead this module asks Ryu to
load `controller.core` by its module name, the way other apps in apps/ depend
on it too, so one TyphoonController runs however many apps require it.

Why not `apps/typhoon.py`: ryu-manager imports a file given by path as a
top-level module named after the file, so `apps/typhoon.py` would become
`sys.modules["typhoon"]` and hide the project package `typhoon`, which the
controller imports. No file in apps/ may be named like a top-level package.
"""

from controller.framework.ryu_compat import RyuApp, require_app

require_app("controller.core")


class TyphoonEntryPoint(RyuApp):
    """Does nothing itself: it exists so that ryu-manager reads `require_app` above."""
