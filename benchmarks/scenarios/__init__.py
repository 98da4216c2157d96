"""The paper's experiments, one module each (see ``benchmarks.scenario``).

Every module here is imported by :func:`discover`; a module registers its
scenario with ``@register``.  To add an experiment, add a module: nothing
else needs to name it.
"""

from __future__ import annotations

import importlib
import pkgutil


def discover() -> None:
    """Import every scenario module of this package (each registers itself)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
