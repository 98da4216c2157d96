"""Consistent checkpoints for guaranteed processing (#12): the store and the topology settings."""

from .settings import GUARANTEES, CheckpointSettings, checkpoint_settings, guarantee_of
from .store import (
    DEFAULT_STORE,
    CheckpointError,
    CheckpointStore,
    CorruptCheckpoint,
    open_store,
)

__all__ = [
    "DEFAULT_STORE",
    "GUARANTEES",
    "CheckpointError",
    "CheckpointSettings",
    "CheckpointStore",
    "CorruptCheckpoint",
    "checkpoint_settings",
    "guarantee_of",
    "open_store",
]
