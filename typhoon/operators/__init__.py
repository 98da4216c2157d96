"""Operator registry: built-in names and ``module:Class`` references.

Topology files name operators; this module turns a name into a class.  A
``module:Class`` reference imports user code: only load topology files you
trust, as with any program you run.
"""

from __future__ import annotations

import importlib

from typhoon.operators.base import Bolt, Context, Emit, Operator, Spout
from typhoon.operators.sinks import Collect, CountByKey, SequenceCheck
from typhoon.operators.sources import SentenceSource, SequenceSource
from typhoon.operators.transforms import Filter, Identity, SplitWords

__all__ = [
    "BUILTINS",
    "Bolt",
    "Context",
    "Emit",
    "Operator",
    "OperatorError",
    "Spout",
    "resolve_operator",
]


class OperatorError(Exception):
    """An operator name that cannot be resolved; the message is one plain sentence."""


BUILTINS: dict[str, type[Operator]] = {
    "sequence_source": SequenceSource,
    "sentence_source": SentenceSource,
    "split_words": SplitWords,
    "count_by_key": CountByKey,
    "filter": Filter,
    "identity": Identity,
    "sequence_check": SequenceCheck,
    "collect": Collect,
}


def resolve_operator(name: str) -> type[Operator]:
    """Built-in name or ``package.module:Class`` -> operator class."""
    if not isinstance(name, str) or not name:
        raise OperatorError("operator must be a non-empty name")
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
    if not isinstance(cls, type) or not issubclass(cls, Operator):
        raise OperatorError(f"operator '{name}' is not a Spout or Bolt class")
    return cls
