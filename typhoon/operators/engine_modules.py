"""Which module implements each engine other than ``python``, imported by name only.

The core never imports an engine statically (layering rule): a node with ``engine:
spark`` gets its bolt from the module named here (:func:`typhoon.operators.resolve_operator`)
and its services from the same module (``typhoon/engines.py``).  Here, below the topology
loader that resolves operators, so that looking an engine up imports nothing above it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

ENGINE_MODULES: dict[str, str] = {"spark": "pyspark_bridge"}


def engine_module(engine: str) -> ModuleType:
    """The module implementing ``engine`` (ValueError for python or an unknown engine)."""
    name = ENGINE_MODULES.get(engine)
    if name is None:
        raise ValueError(f"no engine module for engine '{engine}'")
    return importlib.import_module(name)
