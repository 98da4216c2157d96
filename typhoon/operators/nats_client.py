"""A NATS connection for synchronous operators: nats-py on a private event loop.

nats-py is asyncio-only and the worker calls operators synchronously, so each
connector owns one event loop running in a daemon thread of its own; a call hands
a coroutine to that loop and waits for its answer with a deadline.  ``close()``
closes the client, stops the loop, cancels what is left on it and joins the
thread: nothing outlives the operator.  The client reconnects by itself after a
lost connection (a restarted server); calls in the meantime time out and the
connector's ``retry`` waits.
"""

from __future__ import annotations

import concurrent.futures  # asyncio: imported where used (~35 ms at every worker start)
import json
import logging
import threading
from typing import Any, ClassVar

from typhoon.operators.connectors import ConnectorError

log = logging.getLogger(__name__)

CONNECT_S = 3.0  # the first connection: the server must answer within this
CALL_S = 10.0  # any other call


def transient() -> tuple[type[BaseException], ...]:
    """Errors of a server that is away for now (restarting, JetStream not ready yet)."""
    import asyncio

    import nats.errors
    import nats.js.errors

    return (
        TimeoutError,
        asyncio.TimeoutError,
        concurrent.futures.TimeoutError,
        nats.errors.TimeoutError,
        nats.errors.ConnectionClosedError,
        nats.errors.NoRespondersError,
        nats.errors.OutboundBufferLimitError,
        nats.errors.StaleConnectionError,
        nats.js.errors.ServiceUnavailableError,
        nats.js.errors.NoStreamResponseError,
    )


def check_url(url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(("nats://", "tls://")):
        raise ValueError("url must be a nats:// URL")
    return url


class NatsConnection:
    """One client connection, used from the operator's (synchronous) thread."""

    THREADS: ClassVar[int] = 0  # alive now, over all instances (tests check for leaks)

    def __init__(self, url: str, who: str) -> None:
        import asyncio

        self.url, self.who = url, who
        self.loop = asyncio.new_event_loop()
        self.errors: list[BaseException] = []
        self.connected = False  # before: a failed attempt is in the refusal's sentence only
        self.nc: Any = None
        self.js: Any = None
        self.thread = threading.Thread(target=self._run, name=f"nats {url}", daemon=True)
        self.thread.start()
        NatsConnection.THREADS += 1
        try:
            self.nc = self.call(self._connect(), CONNECT_S + 2)
        except Exception as e:
            self.close()
            last = self.errors[-1] if self.errors else e
            reason = str(last).strip() or type(last).__name__
            raise ConnectorError(
                f"{who}: the NATS server at {url} does not answer ({reason})"
            ) from None
        self.connected = True
        self.js = self.nc.jetstream(timeout=CALL_S / 2)

    def _run(self) -> None:
        import asyncio

        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:  # cancel what the client left, then close the loop in its own thread
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def _connect(self) -> Any:
        import asyncio

        import nats

        async def error(e: Exception) -> None:
            self.errors.append(e)
            del self.errors[:-5]
            # the first connection's attempts: the refusal names the last one, once
            level = logging.WARNING if self.connected else logging.DEBUG
            log.log(level, "%s: NATS at %s: %s", self.who, self.url, e)

        async def disconnected() -> None:
            log.warning("%s: lost the connection to NATS at %s", self.who, self.url)

        async def reconnected() -> None:
            log.warning("%s: connected to NATS at %s again", self.who, self.url)

        return await asyncio.wait_for(
            nats.connect(
                self.url,
                connect_timeout=2,
                reconnect_time_wait=0.5,
                max_reconnect_attempts=-1,  # a restart mid-run: wait for it (retry bounds it)
                error_cb=error,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                name=self.who,
            ),
            CONNECT_S,
        )

    def call(self, coro: Any, timeout: float = CALL_S) -> Any:
        """Run ``coro`` on the loop; its result, or its error, or TimeoutError."""
        import asyncio

        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(
                f"no answer from NATS at {self.url} within {timeout:.0f} s"
            ) from None

    def close(self) -> None:
        if self.thread is None:
            return
        if self.nc is not None:
            try:
                self.call(self.nc.close(), 5)
            except Exception as e:  # the loop is stopped below either way
                log.warning("%s: closing the NATS connection: %s", self.who, e)
            self.nc = None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            NatsConnection.THREADS -= 1
        self.thread = None

    # ----- JetStream calls the connectors share -------------------------------------------

    def publish_all(
        self, subject: str, payloads: list[bytes], ids: list[str] | None
    ) -> tuple[int, int]:
        """Publish every payload to JetStream and wait for each ack; ``ids`` are
        ``Nats-Msg-Id`` headers (the stream drops a repeated id within its duplicate
        window).  Returns (stored, duplicates)."""
        import asyncio

        async def send() -> tuple[int, int]:
            futures = []
            for i, payload in enumerate(payloads):
                headers = {"Nats-Msg-Id": ids[i]} if ids else None
                futures.append(await self.js.publish_async(subject, payload, headers=headers))
            acks = await asyncio.wait_for(asyncio.gather(*futures), CALL_S)
            dup = sum(1 for a in acks if a.duplicate)
            return len(acks) - dup, dup

        return self.call(send(), CALL_S + 2)

    def publish_core(self, subject: str, payload: bytes, headers: dict[str, str]) -> None:
        """A plain NATS message (a dead letter): stored if a stream captures ``subject``."""

        async def send() -> None:
            await self.nc.publish(subject, payload, headers=headers)
            await self.nc.flush(timeout=5)

        self.call(send())


def dead_letter_payload(reason: str, row: list) -> bytes:
    return json.dumps({"reason": reason, "row": row}, default=repr).encode()
