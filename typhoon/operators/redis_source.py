"""``redis_stream_source``: entries of Redis streams as tuples, replayable by entry ID.

One split per stream (``stream`` names one or more); a worker's offset is the
ID of the last entry it consumed in each of its streams, so a recovery reads
on right after it (XRANGE with an exclusive start).  Entries are read as bytes:
one whose fields are not exactly ``fields``, or whose values are not UTF-8, is
counted and, with ``dead_letter``, copied to that stream with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

from typhoon.operators.base import Context
from typhoon.operators.connectors import ConnectorError, Entry, RangeSplitSource, retry

START = "0-0"


def parse_id(entry_id: str) -> tuple[int, int]:
    """``"ms-seq"`` -> ``(ms, seq)``; ValueError for anything else."""
    ms, sep, seq = entry_id.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        raise ValueError(f"'{entry_id}' is not a Redis stream entry ID (like 1700000000000-0)")
    return int(ms), int(seq)


TYPES: dict[str, Callable[[str], Any]] = {"str": str, "int": int, "float": float}


def decode_entry(
    fields: list[str], values: dict[bytes, bytes], types: dict[str, str] | None = None
) -> tuple[list | None, str]:
    """The tuple of one entry, its ``fields`` in order, each text unless ``types`` names
    ``int`` or ``float`` for it; ``(None, reason)`` if it is bad: ``not_utf8``,
    ``wrong_fields``, ``bad_value`` (not a number of that type, or not finite)."""
    try:
        text = {k.decode("utf-8"): v.decode("utf-8") for k, v in values.items()}
    except UnicodeDecodeError:
        return None, "not_utf8"
    if len(text) != len(fields) or any(f not in text for f in fields):
        return None, "wrong_fields"
    row: list = [text[f] for f in fields]
    for i, f in enumerate(fields):
        kind = (types or {}).get(f, "str")
        if kind != "str":
            try:
                row[i] = TYPES[kind](row[i])
            except ValueError:
                return None, "bad_value"
            if not math.isfinite(row[i]):
                return None, "bad_value"
    return row, ""


def redis_client(url: str) -> Any:
    import redis  # imported late: only jobs that use Redis need the client

    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=3)


def _transient() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


class RedisStreamSource(RangeSplitSource):
    """Tuples of ``fields`` from the entries of ``stream`` (one name or a list).

    Args: ``url`` (``redis://host:port/db``); ``from``: ``start`` (default), ``end``
    (entries added after the job starts) or an entry ID (entries after it); ``until:
    end`` stops at the last entry present at start (bounded runs); ``rate`` tuples/s
    (0 = unlimited); ``dead_letter`` a stream for bad entries; ``types``: ``{field: int |
    float}`` for fields emitted as numbers (e.g. an event time), text otherwise.
    """

    READ: ClassVar[int] = 500  # entries per XRANGE
    FIRST: ClassVar[str] = START

    def __init__(
        self,
        url: str,
        stream: str | list[str],
        fields: list[str],
        rate: float = 0.0,
        until: str | None = None,
        dead_letter: str | None = None,
        types: dict[str, str] | None = None,
        **more: Any,
    ) -> None:
        start = self.take_from("redis_stream_source", more)
        streams = [stream] if isinstance(stream, str) else stream
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("url must be a redis:// URL")
        if (
            not isinstance(streams, list)
            or not streams
            or not all(isinstance(s, str) and s for s in streams)
        ):
            raise ValueError("stream must be a stream name or a list of them")
        if (
            not isinstance(fields, list)
            or not fields
            or not all(isinstance(f, str) and f for f in fields)
        ):
            raise ValueError("fields must be a list of entry field names")
        if len(set(fields)) != len(fields):
            raise ValueError("fields must not repeat a name")
        if start not in ("start", "end"):
            parse_id(str(start))
        if types is not None and (
            not isinstance(types, dict)
            or any(f not in fields for f in types)
            or any(t not in TYPES for t in types.values())
        ):
            raise ValueError("types must map some of the fields to str, int or float")
        super().__init__(
            str(start), url=url, stream=streams, fields=fields, rate=rate, until=until,
            types=types,
        )  # fmt: skip
        self.url, self.streams, self.entry_fields = url, streams, list(fields)
        self.dead_letter = dead_letter
        self.types = dict(types or {})
        self.redis: Any = None

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        return list(args.get("fields") or [])

    @classmethod
    def preflight(cls, args: dict[str, Any]) -> None:
        """Submit time: the server answers (ConnectorError naming it otherwise)."""
        url = args.get("url", "")
        try:
            redis_client(url).ping()
        except Exception as e:
            raise ConnectorError(
                f"redis_stream_source: the Redis server at {url} does not answer ({e})"
            ) from None

    def open(self, context: Context) -> None:
        self.redis = redis_client(self.url)
        try:
            self.ends = {s: self._last_id(s) for s in self.streams}
        except _transient() as e:
            raise ConnectorError(
                f"redis_stream_source: the Redis server at {self.url} does not answer ({e})"
            ) from None
        super().open(context)

    def close(self) -> None:
        if self.redis is not None:
            self.redis.close()

    def _last_id(self, stream: str) -> str:
        last = self.redis.xrevrange(stream, count=1)
        return last[0][0].decode() if last else START

    def list_splits(self) -> list[str]:
        return list(self.streams)

    def order(self, position: Any) -> tuple[int, int]:
        return parse_id(position)

    def fetch(self, split: str, position: Any, max_count: int) -> list[Entry]:
        n = min(max_count, self.READ)
        got = retry(
            f"XRANGE {split} on {self.url}",
            lambda: self.redis.xrange(split, min=f"({position}", count=n),
            _transient(),
            attempts=10,
        )
        out: list[Entry] = []
        for raw_id, values in got:
            entry_id = raw_id.decode()
            if self.past_end(split, entry_id):
                break
            row, reason = decode_entry(self.entry_fields, values, self.types)
            if row is None and self.dead_letter:
                self._dead(split, entry_id, reason, values)
            out.append((entry_id, row, reason))
        return out

    def _dead(self, split: str, entry_id: str, reason: str, values: dict[bytes, bytes]) -> None:
        letter = {b"_stream": split.encode(), b"_id": entry_id.encode(), b"_reason": reason}
        letter.update({b"f:" + k: v for k, v in values.items()})
        self.redis.xadd(self.dead_letter, letter)
