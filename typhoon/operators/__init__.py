"""Operator registry: built-in names and ``module:Class`` references.

Topology files name operators; this module turns a name into a class.  A
``module:Class`` reference imports user code: only load topology files you
trust, as with any program you run.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from typhoon.operators.base import Bolt, Context, Emit, Operator, Spout, replayable
from typhoon.operators.builtins import Builtins

if TYPE_CHECKING:
    from typhoon.operators.connectors import ConnectorError

__all__ = [
    "BUILTINS",
    "Bolt",
    "ConnectorError",
    "Context",
    "Emit",
    "Operator",
    "OperatorError",
    "Spout",
    "import_refusal",
    "preflight",
    "replayable",
    "resolve_operator",
]


class OperatorError(Exception):
    """An operator name that cannot be resolved; the message is one plain sentence."""


# every built-in name -> its class, each module imported the first time a topology
# uses one of its operators (a worker imports only its own: typhoon.operators.builtins)
BUILTINS = Builtins()


def __getattr__(name: str) -> Any:
    """``ConnectorError`` on first use: its module (json, secrets) is not a worker's cost."""
    if name == "ConnectorError":
        from typhoon.operators.connectors import ConnectorError

        return ConnectorError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def import_refusal(
    name: str, trusted: Collection[str] = (), allow_imports: bool = False
) -> str | None:
    """Why ``name`` may not be resolved here, or None.

    The one gate on user code: a ``module:Class`` name imports code, which only
    a local file (``allow_imports``) may ask for, or which the running topology
    already imported (``trusted``: its own operators).  Names from REST pass
    through here: the topology loader, reconfigurations and the live debugger.
    """
    if ":" in name and not allow_imports and name not in trusted:
        return f"operator '{name}' would import code; only built-in operators are allowed here"
    return None


def resolve_operator(name: str, engine: str | None = None) -> type[Operator]:
    """Built-in name or ``package.module:Class`` -> operator class.

    Nodes on another engine (``engine: spark``) name a function that engine
    runs; their workers run the bolt the engine module gives for it (see
    ``typhoon.operators.engine_modules``).  Without ``engine`` a ``module:function`` is taken as
    such a function, so callers that only know the name still get a class.
    """
    if not isinstance(name, str) or not name:
        raise OperatorError("operator must be a non-empty name")
    if engine not in (None, "python"):
        return _engine_bolt(name, engine)
    if name in BUILTINS:
        return BUILTINS[name]
    if ":" not in name:
        known = ", ".join(sorted(BUILTINS))
        raise OperatorError(f"unknown operator '{name}' (built-ins: {known}; or use module:Class)")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise OperatorError(f"operator '{name}': cannot import module '{module_name}' ({e})") from e
    cls = getattr(module, attr, None)
    if isinstance(cls, type) and issubclass(cls, Operator):
        return cls
    if engine is None and callable(cls) and not isinstance(cls, type):
        return _engine_bolt(name, "spark")  # the one engine that runs functions today
    if callable(cls) and not isinstance(cls, type):
        raise OperatorError(f"operator '{name}' is a function: functions run on 'engine: spark'")
    raise OperatorError(f"operator '{name}' is not a Spout or Bolt class")


def _engine_bolt(name: str, engine: str) -> type[Operator]:
    from typhoon.operators.engine_modules import engine_module

    try:
        module = engine_module(engine)
    except ImportError as e:
        raise OperatorError(f"operator '{name}': engine '{engine}' is not installed ({e})") from e
    except ValueError as e:
        raise OperatorError(f"operator '{name}': {e}") from e
    try:
        return module.bolt_for(name)
    except ValueError as e:
        raise OperatorError(f"operator '{name}': {e}") from e


def preflight(nodes: list[tuple[str, str, dict]]) -> None:
    """Submit time: each ``(node, operator, args)`` whose class can check its outside
    server (``preflight(args)``, connectors) does; ConnectorError names the first that
    cannot be used."""
    from typhoon.operators.connectors import ConnectorError

    for node, operator, args in nodes:
        try:
            cls = resolve_operator(operator)
        except OperatorError:
            continue  # the loader has said so already
        check = getattr(cls, "preflight", None)
        if check is not None:
            try:
                check(args)
            except ConnectorError as e:
                raise ConnectorError(f"node '{node}': {e}") from None
