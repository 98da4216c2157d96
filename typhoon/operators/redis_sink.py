"""``redis_stream_sink``: tuples appended to a Redis stream (XADD), one entry each.

Under ``exactly_once`` it is a transactional sink (typhoon.operators.connectors):
the rows of the epochs a global checkpoint completed are added in one MULTI/EXEC
transaction that also sets this worker's record of the newest epoch (the key
``typhoon_sink_epochs:<topology>/<node>/<stream>/<index>``), so Redis applies the
entries and the record together or not at all, and a replayed epoch the record
covers is never added again.  The record is WATCHed while the commit is built: a
commit retried after its answer was lost finds the epoch recorded and adds nothing.
Without it rows go in batches, each one MULTI/EXEC (a batch is in whole or not at
all; one retried after a lost answer may be added twice: at least once).
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

from typhoon.operators.base import Context, Emit
from typhoon.operators.connectors import ConnectorError, TransactionalSink, retry
from typhoon.operators.redis_source import redis_client

EPOCHS_PREFIX = "typhoon_sink_epochs:"


def _transient() -> tuple[type[BaseException], ...]:
    import redis

    # WatchError: the record changed between WATCH and EXEC (EXEC applied nothing)
    return (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, redis.WatchError)


def encode_value(v: Any) -> bytes | None:
    """A tuple value as a stream field value, or None if a stream cannot carry it.

    Text is UTF-8, numbers their decimal text (floats ``repr``, finite only), bytes as
    they are; anything else (None, booleans, lists, NaN) has no one reading back."""
    t = type(v)
    if t is str:
        try:
            return v.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates
            return None
    if t is bytes:
        return v
    if t is int:
        return str(v).encode()
    if t is float and math.isfinite(v):
        return repr(v).encode()
    return None


def encode_row(fields: list[str], row: list) -> tuple[dict[str, bytes] | None, str]:
    """The entry of one tuple, or ``(None, reason)``: ``wrong_fields``, ``wrong_type``."""
    if len(row) != len(fields):
        return None, "wrong_fields"
    entry = {}
    for f, v in zip(fields, row, strict=True):
        b = encode_value(v)
        if b is None:
            return None, "wrong_type"
        entry[f] = b
    return entry, ""


def json_row(row: list) -> str:
    """A bad tuple as JSON for its dead letter: a value JSON cannot carry (bytes, NaN)
    becomes its ``repr``, and a row still refused becomes the repr of all of it."""
    fixed = [repr(v) if isinstance(v, float) and not math.isfinite(v) else v for v in row]
    try:
        return json.dumps(fixed, default=repr, allow_nan=False, ensure_ascii=False)
    except ValueError:  # NaN deeper inside
        return json.dumps(repr(row))


class RedisStreamSink(TransactionalSink):
    """Adds each tuple to ``stream`` as an entry whose fields are ``fields`` (default: the
    input fields) in tuple order.

    Args: ``url`` (``redis://host:port/db``); ``stream``; ``fields``; ``maxlen``: trim the
    stream to about that many entries (``XADD MAXLEN ~``; default: never trim);
    ``dead_letter``: a stream for bad tuples (``{_reason, _row}``, the row as JSON).  A
    tuple of another length (``wrong_fields``) or with a value a stream field cannot
    carry (``wrong_type``: None, booleans, lists, NaN) is counted and left out.
    """

    CHUNK: ClassVar[int] = 1000  # entries per MULTI/EXEC without a guarantee

    def __init__(
        self,
        url: str,
        stream: str,
        fields: list[str] | None = None,
        maxlen: int | None = None,
        dead_letter: str | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("url must be a redis:// URL")
        if not isinstance(stream, str) or not stream:
            raise ValueError("stream must be a stream name")
        if fields is not None and (
            not isinstance(fields, list)
            or not fields
            or not all(isinstance(f, str) and f for f in fields)
            or len(set(fields)) != len(fields)
        ):
            raise ValueError("fields must be a list of distinct entry field names")
        if maxlen is not None and (
            isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1
        ):
            raise ValueError("maxlen must be a positive number of entries")
        if dead_letter is not None and (not isinstance(dead_letter, str) or not dead_letter):
            raise ValueError("dead_letter must be a stream name")
        super().__init__(
            url=url, stream=stream, fields=fields, maxlen=maxlen, dead_letter=dead_letter
        )
        self.url, self.stream, self.maxlen, self.dead_letter = url, stream, maxlen, dead_letter
        self.entry_fields = list(fields or [])
        self.redis: Any = None
        self.record = ""

    @classmethod
    def preflight(cls, args: dict[str, Any]) -> None:
        """Submit time: the server answers and ``stream`` is a stream or not there yet."""
        url, stream = str(args.get("url", "")), args.get("stream", "")
        client = None
        try:
            client = redis_client(url)
            kind = client.type(stream)
        except Exception as e:
            raise ConnectorError(
                f"redis_stream_sink: the Redis server at {url} does not answer ({e})"
            ) from None
        finally:
            if client is not None:
                client.close()
        if kind not in (b"stream", b"none"):
            raise ConnectorError(
                f"redis_stream_sink: the key '{stream}' at {url} is a {kind.decode()}, not a stream"
            )

    def open(self, context: Context) -> None:
        super().open(context)
        if not self.entry_fields:
            self.entry_fields = list(context.input_fields)
        self.record = f"{EPOCHS_PREFIX}{context.topology}/{context.node}/{self.stream}/"
        self.record += str(context.index)
        self.redis = redis_client(self.url)
        try:
            self.redis.ping()
        except _transient() as e:
            self.redis.close()
            raise ConnectorError(
                f"redis_stream_sink: the Redis server at {self.url} does not answer ({e})"
            ) from None

    # ----- rows in, bad rows out -------------------------------------------------------

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        super().process_batch(self._good(rows), emit)

    def _good(self, rows: list[list]) -> list[list]:
        good = []
        for r in rows:
            entry, reason = encode_row(self.entry_fields, r)
            if entry is None:
                self._bad(reason, r)
            else:
                good.append(r)
        return good

    def _bad(self, reason: str, row: list) -> None:
        self.drops.add(reason)
        if self.dead_letter:
            letter = {"_reason": reason, "_row": json_row(row)}
            retry(
                f"XADD {self.dead_letter} on {self.url}",
                lambda: self.redis.xadd(self.dead_letter, letter),
                _transient(),
                attempts=10,
            )

    def _add(self, pipe: Any, rows: list[list]) -> None:
        for r in rows:
            entry, _ = encode_row(self.entry_fields, r)
            pipe.xadd(self.stream, entry, maxlen=self.maxlen, approximate=True)

    # ----- the hooks of TransactionalSink ----------------------------------------------

    def write(self, rows: list[list]) -> int:
        for i in range(0, len(rows), self.CHUNK):
            chunk = rows[i : i + self.CHUNK]

            def attempt(chunk: list[list] = chunk) -> None:
                with self.redis.pipeline(transaction=True) as pipe:
                    self._add(pipe, chunk)
                    pipe.execute()

            retry(f"XADD to {self.stream} on {self.url}", attempt, _transient(), attempts=10)
        return len(rows)

    def commit(self, epochs: dict[int, list[list]]) -> int:
        last = max(epochs)

        def attempt() -> int:
            with self.redis.pipeline(transaction=True) as pipe:
                pipe.watch(self.record)  # EXEC applies nothing if the record moved meanwhile
                raw = pipe.get(self.record)
                done = None if raw is None else int(raw)
                if done is not None and done >= last:
                    return 0  # a retry after the commit went through but its answer was lost
                rows = [r for e in sorted(epochs) if done is None or e > done for r in epochs[e]]
                pipe.multi()
                self._add(pipe, rows)
                pipe.set(self.record, last)
                pipe.execute()
                return len(rows)

        return retry(f"committing epoch {last} on {self.url}", attempt, _transient(), attempts=10)

    def committed_epoch(self) -> int | None:
        raw = retry(
            f"reading the committed epoch on {self.url}",
            lambda: self.redis.get(self.record),
            _transient(),
            attempts=10,
        )
        return None if raw is None else int(raw)

    def reset(self) -> None:
        retry(
            f"clearing the committed epoch on {self.url}",
            lambda: self.redis.delete(self.record),
            _transient(),
            attempts=10,
        )

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.redis is not None:
                self.redis.close()
                self.redis = None
