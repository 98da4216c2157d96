"""The built-in operator names, each imported only when it is first used.

A worker runs one operator, but importing every built-in module (connectors,
joins, Nexmark, JSON parsing...) was a third of its start-up.  ``Builtins`` is
a mapping from name to class that imports a module the first time one of its
names is looked up; ``in``, ``len`` and iterating the names import nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping

from typhoon.operators.base import Operator

# name -> "module:Class", the module under typhoon.operators
PATHS: dict[str, str] = {
    "sequence_source": "sources:SequenceSource",
    "sequence_columns": "sources:SequenceColumns",
    "sentence_source": "sources:SentenceSource",
    "split_words": "transforms:SplitWords",
    "count_by_key": "sinks:CountByKey",
    "filter": "transforms:Filter",
    "map": "transforms:Map",
    "identity": "transforms:Identity",
    "busy": "transforms:Busy",
    "sequence_check": "sinks:SequenceCheck",
    "collect": "sinks:Collect",
    "key_origins": "sinks:KeyOrigins",
    "ad_event_source": "ads:AdEventSource",
    "parse_json": "ads:ParseJson",
    "project": "ads:Project",
    "lookup": "lookup:Lookup",
    "keyed_source": "keyed:KeyedSource",
    "split_streams": "keyed:SplitStreams",
    "digest": "keyed:Digest",
    "file_source": "files:FileSource",
    "pair_source": "pairs:PairSource",
    "count_forward": "pairs:CountForward",
    "running_count": "running:RunningCount",
    "max_by_key": "running:MaxByKey",
    "running_max": "running:RunningMax",
    "max_and_prev": "running:MaxAndPrev",
    "keyed_columns": "keyed_columns:KeyedColumns",
    "window_aggregate": "windows:WindowAggregate",
    "event_source": "events:EventSource",
    "window_join": "joins:WindowJoin",
    "stream_join": "joins:StreamJoin",
    "interval_join": "interval_join:IntervalJoin",
    "redis_stream_source": "redis_source:RedisStreamSource",
    "redis_stream_sink": "redis_sink:RedisStreamSink",
    "postgres_sink": "postgres_sink:PostgresSink",
    "nexmark_source": "nexmark:NexmarkSource",
    "file_sink": "file_sink:FileSink",
    "nats_source": "nats_source:NatsSource",
    "nats_sink": "nats_sink:NatsSink",
}


def load_builtin(path: str) -> type[Operator]:
    """``"module:Class"`` under typhoon.operators -> the class (imports the module)."""
    module_name, _, attr = path.partition(":")
    cls = getattr(importlib.import_module(f"typhoon.operators.{module_name}"), attr)
    if not (isinstance(cls, type) and issubclass(cls, Operator)):
        raise TypeError(f"built-in {path} is not an operator class")
    return cls


class Builtins(MutableMapping[str, type[Operator]]):
    """Built-in name -> operator class, imported on first lookup.

    Mutable like the dict it replaces: tests and embedders add their own names
    (``BUILTINS["mine"] = Mine``) and remove them again.
    """

    def __init__(self, paths: dict[str, str] | None = None) -> None:
        self._entries: dict[str, str | type[Operator]] = dict(PATHS if paths is None else paths)

    def __getitem__(self, name: str) -> type[Operator]:
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = self._entries[name] = load_builtin(entry)
        return entry

    def __setitem__(self, name: str, cls: type[Operator]) -> None:
        self._entries[name] = cls

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
