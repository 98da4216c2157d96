"""The boundary between the framework layer and the I/O layer (paper Fig. 4).

The framework layer hands the I/O layer batches of serialized tuples per
(receiver, stream), as row-batch entries, and gets back what arrived.  Only
the I/O layer differs between the ``tcp`` transport (one connection per next
hop, Storm-like) and the ``sdn`` transport (frames on a TAP port of an Open
vSwitch bridge).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from typhoon.wire import DEFAULT_MTU, ControlTuple, block_rows, is_block

EOS_STREAM = 0  # reserved stream ID: end-of-stream punctuation on a link


def rows_in(entry: bytes) -> int:
    """Rows of a row-batch entry or a column block, without decoding them (0 if it is
    neither)."""
    if is_block(entry):
        return block_rows(entry)
    try:
        head = msgpack.Unpacker()
        head.feed(entry[:5])
        rows: int = head.read_array_header()
        return rows
    except Exception:
        return 0


@dataclass
class Inbound:
    """Tuples that arrived from one sender on one stream (decoded frames, reassembled)."""

    src: int  # sender worker ID
    stream: int
    payloads: list[bytes]  # row-batch entries (typhoon.wire.encode_rows)
    # rows handed over by function call from a worker of the same chain (no bytes)
    rows: list[list[Any]] | None = None

    def count(self) -> int:
        """Tuples it carries."""
        if self.rows is not None:
            return len(self.rows)
        return sum(map(rows_in, self.payloads))


@dataclass
class IOStats:
    """I/O-layer counters reported in METRIC_RESP."""

    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seq_gaps: int = 0  # frames found missing on a link (each asked for again)
    retransmitted: int = 0  # frames sent again because a receiver missed them
    credit_stalls: int = 0
    drops: dict[str, int] = field(default_factory=dict)  # reason -> count

    def drop(self, reason: str, n: int = 1) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + n


class Transport(ABC):
    """I/O layer of one worker."""

    #: True when one serialized copy can reach a whole group (switch-side multicast)
    multicast: bool = False
    #: True when the ``sdn`` policy can hand receiver choice to the switch
    switch_balancing: bool = False
    #: largest frame payload (bytes after the Ethernet header): sizes the row batches
    mtu: int = DEFAULT_MTU
    #: the framework's handler for urgent control tuples a transport reads while it
    #: waits (for credit) inside a send
    on_urgent: Callable[[ControlTuple], None] | None = None
    #: a chain's process (typhoon.runtime.chain): lets the other workers of the process
    #: read and process their input while a send or settle of this one waits, so a
    #: receiver of a live-unchained edge in the same process returns credit
    on_wait: Callable[[], None] | None = None

    def __init__(self) -> None:
        self.stats = IOStats()

    @abstractmethod
    def poll(self, timeout: float) -> list[Inbound | ControlTuple]:
        """Wait up to ``timeout`` seconds; return what arrived (data and control)."""

    @abstractmethod
    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        """Send serialized tuples to one receiver (batched into frames)."""

    def waitable(self) -> int | None:
        """A descriptor that is readable when :meth:`poll` has something new, or None
        when something is queued already (a chain's process waits on several)."""
        return None

    def urgent_controls(self) -> list[ControlTuple]:
        """Control tuples of the urgent kinds (``typhoon.wire.URGENT_CONTROL``) that arrived
        since the last poll, taken out of the arrival order: the framework asks between
        slices of its work on queued data.  A transport whose control comes in order with
        the data it does not queue (tcp: a connection of its own) has none to give."""
        return []

    def send_group(
        self, group: int, dsts: list[int], payloads: list[bytes], stream: int | None = None
    ) -> None:
        """Send one copy that the network delivers to every worker in ``dsts``.

        ``group`` is the stream whose one-to-many address the frames carry;
        ``stream`` the stream ID in their header (default: the same), so that
        end-of-stream punctuation can follow the data's path."""
        raise NotImplementedError(f"{type(self).__name__} has no multicast")

    def send_balanced(self, stream: int, lb_node: int, slot: int, payloads: list[bytes]) -> None:
        """Send to a load-balancer virtual address; the switch picks the worker."""
        raise NotImplementedError(f"{type(self).__name__} has no switch-side balancing")

    def routed_to(self, receivers: set[int]) -> None:  # noqa: B027 - a no-op by default
        """Every receiver the worker's routes include since the last ROUTING: one left out
        that stays silent was routed around by the controller (sdn stops probing it)."""

    def set_balanced(self, stream: int, members: list[int]) -> None:  # noqa: B027
        """The workers behind ``stream``'s load-balancer address (flow control needs them)."""

    def drain_balanced(self) -> None:  # noqa: B027
        """Wait until every load-balanced frame sent so far was consumed by its receiver.

        Called before end of stream, which goes to each receiver directly: it must
        not overtake data frames that took the switch's load-balancer path.
        """

    def balanced_stats(self) -> dict[str, dict[str, int]]:
        """Per balanced stream: frames sent, in flight and known lost (METRIC_RESP)."""
        return {}

    @abstractmethod
    def reply(self, ct: ControlTuple) -> None:
        """Send a control tuple (METRIC_RESP) back to the controller."""

    def settle(self, dsts: list[int]) -> list[int]:
        """Wait until each receiver of ``dsts`` holds every tuple sent to it so far (an
        end of stream may follow); returns those that never confirmed.  A transport
        with one ordered channel per receiver has nothing to wait for."""
        return []

    def frames_sent(self, dst: int) -> int | None:
        """Frames sent to ``dst`` on its unicast link so far (mod 2**32), or None when this
        transport cannot say.  Re-chaining a live-unchained edge (typhoon.runtime.chain)
        waits until the receiver's :meth:`frames_delivered` reaches it."""
        return None

    def frames_delivered(self, src: int) -> int | None:
        """Frames of ``src``'s unicast link handed to the framework so far (mod 2**32)."""
        return None

    def frames_confirmed(self, dst: int) -> int | None:
        """Frames of the unicast link to ``dst`` its receiver confirmed having (mod 2**32):
        once it equals :meth:`frames_sent`, the link's rules may go."""
        return None

    def await_generation(self, generation: int) -> None:  # noqa: B027 - a no-op by default
        """Under a guarantee, before this worker sends anything of run ``generation`` (its
        mark, a replay): wait until it knows where the workers relaunched for that
        generation listen.  A transport that reaches receivers by worker address (sdn:
        the switch) has nothing to wait for; tcp reads its coordinator's peers."""

    def set_budget(self, budget: int) -> None:  # noqa: B027 - a no-op by default
        """Bytes this worker may have in flight (FLOW_CONTROL; only the sdn transport)."""

    def link_stats(self) -> dict[str, Any]:
        """What the transport's links did (frames sent again, lost, gaps): run report."""
        return {}

    def queue_bytes(self) -> int:
        """Bytes received by the host but not yet read by the worker."""
        return 0

    def linger(self, timeout: float = 2.0) -> None:  # noqa: B027 - no-op by default
        """Before closing: wait (bounded) until receivers have what was sent."""

    def close(self) -> None:  # noqa: B027 - a no-op by default, not abstract
        """Release sockets and devices."""
