"""``nats_sink``: tuples published to a NATS JetStream subject, one message each.

Every message carries a ``Nats-Msg-Id`` made of the sink worker, its run, the
epoch (or batch) and the row's place in it, so the stream drops a message sent
again within its duplicate window (two minutes by default).  Under
``exactly_once`` it is a transactional sink (typhoon.operators.connectors): the
rows of the epochs a global checkpoint completed are published, acknowledged,
and then the newest epoch is recorded in the key-value bucket
``typhoon_sink_epochs``; a replayed epoch older than the record is not sent
again, and a commit cut short between its messages and its record is sent again
with the same ids, which the stream drops.  Without it rows go in acknowledged
batches, retried with backoff (at least once).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from typhoon.operators.base import Context, Emit
from typhoon.operators.connectors import ConnectorError, RunIdSink, new_run_id, retry
from typhoon.operators.nats_client import (
    NatsConnection,
    check_url,
    dead_letter_payload,
    transient,
)

EPOCHS_BUCKET = "typhoon_sink_epochs"


class NatsSink(RunIdSink):
    """Publishes each tuple to ``subject`` (a stream must capture it).

    Args: ``url``; ``subject``; ``format``: ``json`` (the tuple as a JSON array,
    default) or ``text`` (a one-field tuple's value as UTF-8 text); ``dead_letter``
    a subject for bad tuples (``{"reason", "row"}``).  A tuple JSON cannot carry
    (``not_json``), or not of one field under ``text`` (``wrong_fields``), is counted
    and left out.
    """

    CHUNK: ClassVar[int] = 1000  # messages whose acks are awaited together

    def __init__(
        self,
        url: str,
        subject: str,
        format: str = "json",  # noqa: A002  (the topology file's word)
        dead_letter: str | None = None,
    ) -> None:
        check_url(url)
        if not isinstance(subject, str) or not subject or "*" in subject or ">" in subject:
            raise ValueError("subject must be a literal NATS subject")
        if format not in ("json", "text"):
            raise ValueError("format must be json or text")
        super().__init__(url=url, subject=subject, format=format, dead_letter=dead_letter)
        self.url, self.subject, self.fmt, self.dead_letter = url, subject, format, dead_letter
        self.conn: NatsConnection | None = None
        self.kv: Any = None
        self.key = ""
        self.run = new_run_id()
        self.batches = 0
        self.duplicates = 0  # messages the stream dropped as sent before

    @classmethod
    def preflight(cls, args: dict[str, Any]) -> None:
        """Submit time: the server answers and a stream captures the subject."""
        conn = NatsConnection(str(args.get("url", "")), "nats_sink")
        try:
            _stream_of(conn, str(args.get("subject", "")))
        finally:
            conn.close()

    def open(self, context: Context) -> None:
        super().open(context)
        self.key = f"{context.topology}.{context.node}.{context.index}"
        self.conn = NatsConnection(self.url, "nats_sink")
        try:
            _stream_of(self.conn, self.subject)
            if self.two_phase:
                self.kv = self._bucket()
        except BaseException:
            self.conn.close()
            raise

    def _bucket(self) -> Any:
        import nats.js.errors

        assert self.conn is not None
        js = self.conn.js
        try:
            return self.conn.call(js.key_value(EPOCHS_BUCKET))
        except nats.js.errors.BucketNotFoundError:
            return self.conn.call(js.create_key_value(bucket=EPOCHS_BUCKET, history=1))

    # ----- rows in, bad rows out -------------------------------------------------------

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        super().process_batch(self._good(rows), emit)

    def _good(self, rows: list[list]) -> list[list]:
        if self.fmt == "json" and _json_ok(rows):
            return rows
        good = []
        for r in rows:
            if self.fmt == "text" and len(r) != 1:
                self._bad("wrong_fields", r)
            elif self.fmt == "json" and not _json_ok(r):
                self._bad("not_json", r)
            else:
                good.append(r)
        return good

    def _bad(self, reason: str, row: list) -> None:
        self.drops.add(reason)
        if self.dead_letter and self.conn is not None:
            self.conn.publish_core(self.dead_letter, dead_letter_payload(reason, row), {})

    def _payload(self, row: list) -> bytes:
        if self.fmt == "text":
            return str(row[0]).encode()
        return json.dumps(row, ensure_ascii=False).encode()

    def _publish(self, rows: list[list], ids: list[str], what: str) -> int:
        assert self.conn is not None
        conn = self.conn
        payloads = [self._payload(r) for r in rows]
        stored = 0
        for i in range(0, len(payloads), self.CHUNK):  # each chunk's acks within one call
            chunk, chunk_ids = payloads[i : i + self.CHUNK], ids[i : i + self.CHUNK]
            n, dup = retry(
                f"{what} on {self.url}",
                lambda c=chunk, d=chunk_ids: conn.publish_all(self.subject, c, d),
                transient(),
                attempts=10,
            )
            stored += n
            self.duplicates += dup
        return stored

    # ----- the hooks of TransactionalSink ----------------------------------------------

    def write(self, rows: list[list]) -> int:
        self.batches += 1
        base = f"{self.key}.{self.run}.b{self.batches}"
        return self._publish(rows, [f"{base}.{i}" for i in range(len(rows))], "publishing")

    def commit(self, epochs: dict[int, list[list]]) -> int:
        last = max(epochs)
        done = self.committed_epoch()
        if done is not None and done >= last:
            return 0
        ids: list[str] = []
        rows: list[list] = []
        for e in sorted(epochs):
            if done is None or e > done:
                ids += [f"{self.key}.{self.run}.e{e}.{i}" for i in range(len(epochs[e]))]
                rows += epochs[e]
        stored = self._publish(rows, ids, f"committing epoch {last}") if rows else 0
        assert self.conn is not None
        conn = self.conn
        retry(
            f"recording epoch {last} on {self.url}",
            lambda: conn.call(self.kv.put(self._record(), str(last).encode())),
            transient(),
            attempts=10,
        )
        return stored

    def _record(self) -> str:
        return f"{self.key}.{self.run}"

    def committed_epoch(self) -> int | None:
        import nats.js.errors

        assert self.conn is not None
        conn = self.conn

        def read() -> int | None:
            try:
                entry = conn.call(self.kv.get(self._record()))
            except nats.js.errors.KeyNotFoundError:
                return None
            return int(entry.value.decode())

        return retry(f"reading the committed epoch on {self.url}", read, transient())

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.conn is not None:
                self.conn.close()
                self.conn = None

    def result(self) -> dict[str, Any]:
        return {**super().result(), "duplicates": self.duplicates}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        merged = super().merge_results(results)
        return {**merged, "duplicates": sum(r.get("duplicates", 0) for r in results)}


def _json_ok(rows: Any) -> bool:
    try:
        json.dumps(rows, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _stream_of(conn: NatsConnection, subject: str) -> str:
    import nats.js.errors

    try:
        return conn.call(conn.js.find_stream_name_by_subject(subject))
    except nats.js.errors.NotFoundError:
        raise ConnectorError(
            f"nats_sink: no JetStream stream at {conn.url} captures the subject '{subject}'"
        ) from None
