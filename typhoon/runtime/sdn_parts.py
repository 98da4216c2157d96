"""The ``sdn`` transport as its parts see it: the state and the methods they share.

:class:`typhoon.runtime.sdn.SdnTransport` is one class of four mixins, each in its own
module: receiving (``sdn_receive.py``), credit frames (``sdn_credit.py``), sending
(``sdn_send.py``) and load-balanced sending (``sdn_balanced.py``).  Each reads state the
transport sets and calls methods of the others; :class:`SdnParts` declares all of it,
and each mixin has it as its base for a type checker only (at run time the base is
``object``: the stubs here must never shadow a sibling's method).
``tests/unit/test_mixin_needs.py`` checks the declaration against the code.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import select

    from typhoon import wire
    from typhoon.runtime import lb_credits as lb
    from typhoon.runtime import links as lk
    from typhoon.runtime.transport import IOStats
    from typhoon.wire import ControlTuple, Frame

    # a frame waiting for the framework: (frame, sender, size, its link, (sender, link));
    # the last two are None for a control frame or a load-balanced one
    Pending = tuple[Frame, int, int, lk.InLink | None, tuple[int, int] | None]


class Device(Protocol):
    """What the transport needs of its port (a :class:`Tap`; tests may fake it)."""

    def fileno(self) -> int: ...
    def read(self, size: int | None = None) -> bytes | None: ...
    def write(self, frame: bytes) -> int: ...
    def close(self) -> None: ...


class SdnParts(Protocol):
    """What the sdn transport's mixins use of it and of each other."""

    # the port and this worker's addresses (sdn.py)
    dev: Device
    name: str
    app_id: int
    worker_id: int
    mac: bytes
    controller: bytes
    mtu: int
    ethertype: int
    clock: Callable[[], float]
    stats: IOStats
    # reading (sdn.py sets, sdn_receive.py uses)
    fd: int  # the TAP's descriptor (a chain's process waits on it, runtime/chain.py)
    _poller: select.poll
    _read_size: int
    reassembler: wire.Reassembler
    pending: deque[Pending]
    control_priority: bool
    urgent: deque[ControlTuple]
    on_urgent: Callable[[ControlTuple], None] | None
    on_wait: Callable[[], None] | None
    _resync_at: dict[tuple[int, int], float]
    # the links, their credit and when a receiver counts as dead
    window: int
    window_bytes: int | None
    tx: lk.Sender
    rx: lk.Receiver[Pending]
    lb_tx: dict[int, lb.BalancedSender]
    lb_rx: lb.BalancedReceiver
    lb_seq: dict[int, int]
    credit_timeout_s: float
    reroute_silence_s: float
    routing_ahead: dict[int, frozenset[int]]
    streams_of: dict[int, set[int]]
    # counters (sdn.py starts them at 0; the parts count)
    pending_bytes: int
    ctrl_pending: int
    lb_bytes: int
    credit_frames_in: int
    credit_frames_out: int

    # addresses (sdn.py)
    def _worker_mac(self, wid: int) -> bytes: ...
    def _worker_id(self, mac: bytes) -> int: ...
    def _link_of(self, dst: bytes) -> int: ...
    # reading (sdn_receive.py)
    def _readable(self, timeout: float) -> bool: ...
    def _read_batch(self, limit: int = ...) -> int: ...
    def _serve_urgent(self) -> None: ...
    def _resync(self, key: tuple[int, int], now: float) -> None: ...
    # credit frames (sdn_credit.py)
    def _credit_frame(self, f: Frame, now: float) -> None: ...
    def _credit_entries(self, wid: int, kind: int, values: list[int], dst: bytes = b"") -> None: ...
    def _probe(self, ol: lk.OutLink, now: float) -> None: ...
    def _lb_probe(self, stream: int, group: lb.BalancedSender, now: float) -> None: ...
    def _send_bases(self, ol: lk.OutLink) -> None: ...
    def _housekeeping(self, now: float) -> None: ...
    # sending (sdn_send.py)
    def _write(self, frame: bytes) -> bool: ...
    def _retransmit(self, ol: lk.OutLink, seqs: range) -> None: ...
