"""What a topology asks for: its processing guarantee and how it checkpoints.

Read from the topology's ``config`` (``guarantee``, ``checkpoint_interval_ms``,
``checkpoint_store``), with the defaults of ``typhoon/topology/config.py``, so the runtime and the
controller agree on them.  The loader has checked the values of a topology
file already; a topology built in code is checked again here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typhoon.topology.config import DEFAULTS, GUARANTEES

from .store import DEFAULT_STORE

# declared with every other config key in typhoon/topology/config.py
DEFAULT_GUARANTEE = DEFAULTS.guarantee
DEFAULT_INTERVAL_MS = DEFAULTS.checkpoint_interval_ms


@dataclass(frozen=True)
class CheckpointSettings:
    """A topology's guarantee, checkpoint interval and store URL (defaults filled in)."""

    guarantee: str = DEFAULT_GUARANTEE
    interval_ms: float = DEFAULT_INTERVAL_MS
    store_url: str = DEFAULT_STORE

    @property
    def enabled(self) -> bool:
        """Checkpoints are taken only when a guarantee is asked for."""
        return self.guarantee != "none"


def _config(topology: Any) -> dict[str, Any]:
    config = topology if isinstance(topology, dict) else getattr(topology, "config", None)
    return config or {}


def guarantee_of(topology: Any) -> str:
    """``none``, ``at_least_once`` or ``exactly_once`` (a Topology or its config dict)."""
    value = _config(topology).get("guarantee", DEFAULT_GUARANTEE)
    if value not in GUARANTEES:
        raise ValueError(f"guarantee must be one of {', '.join(GUARANTEES)}, not {value!r}")
    return value


def partial_enabled(topology: Any) -> bool:
    """The topology asks for partial rollback (``partial_rollback: true``,
    docs/guarantees.md "Partial rollback")."""
    return _config(topology).get("partial_rollback") is True


def checkpoint_settings(topology: Any) -> CheckpointSettings:
    """The checkpoint settings of a Topology (or of its config dict), defaults filled in."""
    config = _config(topology)
    interval = config.get("checkpoint_interval_ms", DEFAULT_INTERVAL_MS)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise ValueError(f"checkpoint_interval_ms must be a number > 0, not {interval!r}")
    store = config.get("checkpoint_store") or DEFAULT_STORE
    if not isinstance(store, str):
        raise ValueError(f"checkpoint_store must be a URL string, not {store!r}")
    return CheckpointSettings(guarantee_of(config), float(interval), store)
