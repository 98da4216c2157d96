"""``nats_source``: messages of a NATS JetStream stream as tuples, replayable by sequence.

One split per subject (``subject`` names one or more literal subjects of the
stream), or the whole stream as one split.  A worker's offset is the stream
sequence of the last message it consumed in each split.  Reads go through an
ephemeral pull consumer per split (no acks, in memory, removed by the server once
idle) that starts right after that position; a ``no_wait`` pull takes what is
there now.  After any error, or a seek, the consumer is made again at the
position, so what the client holds never decides what comes next.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, ClassVar

from typhoon.operators.base import Context
from typhoon.operators.connectors import ConnectorError, Entry, RangeSplitSource, retry
from typhoon.operators.nats_client import NatsConnection, check_url, transient

WHOLE = ">"  # the split name of the whole stream (no subject given)


def decode_message(fmt: str, fields: list[str], data: bytes) -> tuple[list | None, str]:
    """The tuple of one message; ``(None, reason)`` if it is bad."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not_utf8"
    if fmt == "text":
        return [text], ""
    try:
        row = json.loads(text)
    except ValueError:
        return None, "not_json"
    if not isinstance(row, list) or len(row) != len(fields):
        return None, "wrong_fields"
    return row, ""


class NatsSource(RangeSplitSource):
    """Tuples of ``fields`` from the messages of JetStream stream ``stream``.

    Args: ``url`` (``nats://host:port``); ``subject``: one literal subject or a list
    (each a split; left out: the whole stream is one split); ``fields`` (default
    ``[data]``); ``format``: ``text`` (the payload, UTF-8, is the one field) or
    ``json`` (the payload is a JSON array of ``len(fields)`` values); ``from``:
    ``start`` (default), ``end`` or a stream sequence (the messages after it);
    ``until: end`` stops at the last message present at start; ``rate`` tuples/s;
    ``dead_letter`` a subject that gets each bad message (headers say why).
    """

    READ: ClassVar[int] = 500  # messages per pull
    PULL_S: ClassVar[float] = 5.0  # a pull's messages must all come within this

    def __init__(
        self,
        url: str,
        stream: str,
        subject: str | list[str] | None = None,
        fields: list[str] | None = None,
        format: str = "text",  # noqa: A002  (the topology file's word)
        rate: float = 0.0,
        until: str | None = None,
        dead_letter: str | None = None,
        **more: Any,
    ) -> None:
        start = self.take_from("nats_source", more)
        check_url(url)
        if not isinstance(stream, str) or not stream or any(c in stream for c in " .*>"):
            raise ValueError("stream must be a JetStream stream name")
        subjects = [] if subject is None else [subject] if isinstance(subject, str) else subject
        if not isinstance(subjects, list) or not all(
            isinstance(s, str) and s and "*" not in s.split(".") and ">" not in s.split(".")
            for s in subjects
        ):
            raise ValueError("subject must be a literal subject (no wildcards) or a list of them")
        fields = ["data"] if fields is None else fields
        if (
            not isinstance(fields, list)
            or not fields
            or not all(isinstance(f, str) for f in fields)
        ):
            raise ValueError("fields must be a list of field names")
        if format not in ("text", "json"):
            raise ValueError("format must be text or json")
        if format == "text" and len(fields) != 1:
            raise ValueError("format text gives one field: name one in fields")
        if start not in ("start", "end") and (
            isinstance(start, bool) or not isinstance(start, int) or start < 0
        ):
            raise ValueError("from must be start, end or a stream sequence number")
        super().__init__(start, url=url, stream=stream, subject=subjects, fields=fields,
                         format=format, rate=rate, until=until)  # fmt: skip
        self.url, self.stream, self.subjects = url, stream, subjects
        self.entry_fields, self.fmt = list(fields), format
        self.dead_letter = dead_letter
        self.conn: NatsConnection | None = None
        self.consumers: dict[str, tuple[str, int, Any]] = {}  # split -> (name, next seq, sub)

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        return list(args.get("fields") or ["data"])

    @classmethod
    def preflight(cls, args: dict[str, Any]) -> None:
        """Submit time: the server answers and has the stream (ConnectorError otherwise)."""
        conn = NatsConnection(str(args.get("url", "")), "nats_source")
        try:
            _stream_last(conn, str(args.get("stream", "")), "nats_source")
        finally:
            conn.close()

    def open(self, context: Context) -> None:
        self.conn = NatsConnection(self.url, "nats_source")
        try:
            last = _stream_last(self.conn, self.stream, "nats_source")
            self.ends = {s: self._last_of(s, last) for s in self.list_splits()}
        except transient() as e:
            self.close()
            raise ConnectorError(
                f"nats_source: the NATS server at {self.url} does not answer ({e})"
            ) from None
        except BaseException:
            self.close()
            raise
        super().open(context)

    def _last_of(self, split: str, stream_last: int) -> int:
        if split == WHOLE:
            return stream_last
        import nats.js.errors

        assert self.conn is not None
        try:
            return int(self.conn.call(self.conn.js.get_last_msg(self.stream, split)).seq)
        except nats.js.errors.NotFoundError:
            return 0

    def close(self) -> None:
        if self.conn is not None:
            for split in list(self.consumers):
                self._drop(split)
            self.conn.close()
            self.conn = None

    def list_splits(self) -> list[str]:
        return list(self.subjects) or [WHOLE]

    # ----- reading ---------------------------------------------------------------------

    def _consumer(self, split: str, position: int) -> tuple[str, Any]:
        """The split's consumer, made again unless it delivers right after ``position``."""
        have = self.consumers.get(split)
        if have is not None and have[1] == position + 1:
            return have[0], have[2]
        if have is not None:
            self._drop(split)
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        assert self.conn is not None
        conn = self.conn
        name = f"typhoon-{secrets.token_hex(6)}"
        config = ConsumerConfig(
            name=name,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=position + 1,
            ack_policy=AckPolicy.NONE,
            filter_subject=None if split == WHOLE else split,
            inactive_threshold=60.0,  # a SIGKILLed worker's consumers go by themselves
            mem_storage=True,
        )

        async def make() -> Any:
            await conn.js.add_consumer(self.stream, config)
            return await conn.nc.subscribe(conn.nc.new_inbox())

        sub = conn.call(make())
        self.consumers[split] = (name, position + 1, sub)
        return name, sub

    def _drop(self, split: str) -> None:
        name, _, sub = self.consumers.pop(split)
        conn = self.conn
        assert conn is not None

        async def drop() -> None:
            await sub.unsubscribe()
            await conn.js.delete_consumer(self.stream, name)

        try:
            conn.call(drop(), 3)
        except Exception:  # gone with the server: it removes idle consumers itself
            pass

    def _pull(self, split: str, position: int, n: int) -> list[tuple[int, bytes, str]]:
        name, sub = self._consumer(split, position)
        conn = self.conn
        assert conn is not None
        request = json.dumps({"batch": n, "no_wait": True}).encode()

        async def pull() -> list[tuple[int, bytes, str]]:
            await conn.nc.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{name}", request, reply=sub.subject
            )
            got: list[tuple[int, bytes, str]] = []
            while len(got) < n:
                msg = await sub.next_msg(timeout=self.PULL_S)
                if msg.headers and msg.headers.get("Status"):
                    break  # 404 no messages / 408: the pull is over
                got.append((msg.metadata.sequence.stream, msg.data, msg.subject))
            return got

        try:
            got = conn.call(pull(), self.PULL_S + 2)
        except BaseException:
            self._drop(split)  # what the consumer handed out is unknown: make it again
            raise
        if got:
            self.consumers[split] = (name, got[-1][0] + 1, sub)
        return got

    def fetch(self, split: str, position: Any, max_count: int) -> list[Entry]:
        n = min(max_count, self.READ)
        got = retry(
            f"pulling {self.stream}/{split} from {self.url}",
            lambda: self._pull(split, position, n),
            transient(),
            attempts=10,
        )
        out: list[Entry] = []
        for seq, data, subject in got:
            if seq <= position:
                continue
            if self.past_end(split, seq):
                break
            row, reason = decode_message(self.fmt, self.entry_fields, data)
            if row is None and self.dead_letter:
                self._dead(subject, seq, reason, data)
            out.append((seq, row, reason))
            position = seq
        return out

    def _dead(self, subject: str, seq: int, reason: str, data: bytes) -> None:
        assert self.conn is not None
        headers = {"Typhoon-Reason": reason, "Typhoon-Subject": subject,
                   "Typhoon-Stream": self.stream, "Typhoon-Seq": str(seq)}  # fmt: skip
        self.conn.publish_core(self.dead_letter or "", data, headers)


def _stream_last(conn: NatsConnection, stream: str, who: str) -> int:
    """The stream's last sequence; ConnectorError if there is no such stream."""
    import nats.js.errors

    try:
        info = conn.call(conn.js.stream_info(stream))
    except nats.js.errors.NotFoundError:
        raise ConnectorError(f"{who}: there is no stream '{stream}' at {conn.url}") from None
    return int(info.state.last_seq)
