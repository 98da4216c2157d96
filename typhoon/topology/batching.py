"""How a worker batches what it sends: ``batch_size`` and ``max_delay_ms``, declared once.

A topology's ``config`` may set them; the command line (``typhoon run --batch-size``) goes
over the file, and the runners (tcp, the emulation, the benchmarks' testbed) fill in what
both leave out; the worker's spec carries the result.  Every default, the older key
``max_delay``, the schema of the keys and the command line's help are derived from
:class:`Batching` here, so no copy can drift (``tests/unit/test_batching.py`` scans the
code for one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

# older key -> the key it stands for; only read when the new key is absent
LEGACY_KEYS = {"max_delay": "max_delay_ms"}


@dataclass(frozen=True)
class Batching:
    """A worker's batching: a batch goes out when it is full or its oldest tuple is old."""

    batch_size: int = field(default=100, metadata={"doc": "tuples per batch"})
    max_delay_ms: float = field(default=2.0, metadata={"doc": "ms a batch may wait"})

    def __post_init__(self) -> None:
        size, delay = self.batch_size, self.max_delay_ms
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"batch_size must be an integer of at least 1, not {size!r}")
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
            raise ValueError(f"max_delay_ms must be a number of at least 0, not {delay!r}")
        object.__setattr__(self, "max_delay_ms", float(delay))

    @classmethod
    def of(cls, config: Mapping[str, Any] | None, fallback: Batching | None = None) -> Batching:
        """What ``config`` says, ``fallback`` (the defaults if None) where it is silent; the
        older ``max_delay`` counts when ``max_delay_ms`` is absent.  ValueError if bad."""
        config = config or {}
        base = fallback or DEFAULTS
        given: dict[str, Any] = {}
        for key in FIELDS:
            if key in config:
                given[key] = config[key]
        for old, new in LEGACY_KEYS.items():
            if new not in given and old in config:
                given[new] = config[old]
        if isinstance(given.get("batch_size"), float) and given["batch_size"].is_integer():
            given["batch_size"] = int(given["batch_size"])  # 100.0 from a JSON round trip
        return dataclasses.replace(base, **given)

    def write(self, config: MutableMapping[str, Any]) -> None:
        """Put both settings into ``config`` under their current names (older ones go)."""
        for old in LEGACY_KEYS:
            config.pop(old, None)
        config.update(dataclasses.asdict(self))


FIELDS = tuple(f.name for f in dataclasses.fields(Batching))
DEFAULTS = Batching()


def override(
    config: MutableMapping[str, Any], batch_size: int | None, max_delay_ms: float | None
) -> None:
    """The command line over the file: the settings given (not None) replace the file's,
    the others stay as the file has them (or absent).  ValueError if one is bad."""
    given = {"batch_size": batch_size, "max_delay_ms": max_delay_ms}
    given = {k: v for k, v in given.items() if v is not None}
    dataclasses.replace(DEFAULTS, **given)  # checks the values
    for old, new in LEGACY_KEYS.items():
        if new in given:
            config.pop(old, None)
    config.update(given)


def help_text(name: str) -> str:
    """The command line's help for ``--batch-size``/``--max-delay-ms``, default included."""
    f = {f.name: f for f in dataclasses.fields(Batching)}[name]
    return f"{f.metadata['doc']} (over the file's config; default {getattr(DEFAULTS, name):g})"


# the schema of the keys in a topology file's `config` (typhoon/topology/schema.py)
_SCHEMA = {
    "batch_size": {"type": "integer", "minimum": 1},
    "max_delay_ms": {"type": "number", "minimum": 0},
}
SCHEMA: dict[str, dict[str, Any]] = {
    **_SCHEMA,
    **{old: _SCHEMA[new] for old, new in LEGACY_KEYS.items()},
}
