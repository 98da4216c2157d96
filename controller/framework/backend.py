"""Which OpenFlow framework the controller runs on: Ryu or os-ken.

Ryu 4.34 is the design's choice but runs on Python 3.11 at most; os-ken is its
maintained fork (same API under ``os_ken``) and runs on 3.12+.  Both may be
installed: the operator picks one with ``TYPHOON_CONTROLLER_BACKEND`` (or
``typhoon-controller --backend``), else Ryu wins when present (it is what
scripts/setup.sh installs), else os-ken (what a plain ``pip install`` brings).
Pure logic, no import of either framework: controller/framework/ryu_compat.py imports
the chosen one.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

ENV = "TYPHOON_CONTROLLER_BACKEND"
RYU = "ryu"
OS_KEN = "os_ken"
PREFERENCE = (RYU, OS_KEN)  # when nothing is requested
_ALIASES = {"ryu": RYU, "os_ken": OS_KEN, "os-ken": OS_KEN, "osken": OS_KEN}
_INSTALL_HINT = {
    RYU: "pip install 'typhoon-sdn[ryu]' with PIP_CONSTRAINT=deploy/build-constraints.txt "
    "(Python 3.11 only)",
    OS_KEN: "pip install os-ken",
}


class BackendError(RuntimeError):
    """No usable controller framework; the message says what to install or set."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    return importlib.util.find_spec(module) is not None


def normalise(name: str) -> str:
    try:
        return _ALIASES[name.strip().lower()]
    except KeyError:
        raise BackendError(f"unknown controller backend {name!r} (choose ryu or os-ken)") from None


def choose(requested: str | None, is_installed: Callable[[str], bool] = installed) -> str:
    """The backend to run on: the requested one (which must be installed) or the first present."""
    if requested:
        name = normalise(requested)
        if not is_installed(name):
            raise BackendError(
                f"controller backend {name} requested but not installed: {_INSTALL_HINT[name]}"
            )
        return name
    for name in PREFERENCE:
        if is_installed(name):
            return name
    raise BackendError(
        f"neither Ryu nor os-ken is installed: {_INSTALL_HINT[OS_KEN]}, or {_INSTALL_HINT[RYU]}"
    )


def selected() -> str:
    """The backend for this process: ``$TYPHOON_CONTROLLER_BACKEND`` or the first installed."""
    return choose(os.environ.get(ENV) or None)
