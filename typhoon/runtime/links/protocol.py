"""The link protocol's vocabulary: credit frame kinds, windows and timers, and the
arithmetic of 32-bit sequence numbers (overview in :mod:`typhoon.runtime.links`)."""

from __future__ import annotations

from typhoon.topology.config import SDN_DEFAULTS

U32 = 1 << 32
MASK = U32 - 1

# credit frame kinds (the ``stream`` field of a CREDIT frame); entries are u32 values
GRANT = 0  # receiver -> sender [link, consumed, received]
SYNC = 1  # sender -> receiver [link, next] or [link, next, base]
LB_GRANT = 2  # load-balanced streams, typhoon.runtime.lb_credits
LB_SYNC = 3
NACK = 4  # receiver -> sender [link, from, to): send these frames again
RESYNC = 5  # receiver -> sender [link]: I hold no state for this link, send me its base

# frames per link beyond a receiver's consumed count; the byte budget binds first for
# large frames.  32 stalled forward.yaml's source on every ~32nd frame of 9,000 bytes (496
# waits for credit in 16,133 frames); 128 cut that to 55-90, but then a slow operator
# (300 us per tuple) held the controller's METRIC_REQ behind tens of seconds of queued data.
# With 64 KB frames 32 ran forward.yaml about as fast.  128 again since urgent control
# tuples overtake queued data (docs/flow_control.md, "The 128-frame window again"); a
# topology may ask for another with config: {sdn: {window: N}}.  Receivers' TAP queues hold
# DEFAULT_TXQUEUELEN frames (runtime/tap.py).
DEFAULT_WINDOW = SDN_DEFAULTS.window  # declared in typhoon/topology/config.py
# Bytes of frames (their length on the wire) in flight per link beyond a receiver's
# consumed count, besides the frame window: a slow receiver then queues no more
# *tuples* when its sender's frames are full (64 KB, ~830 tuples of 77 bytes) than
# before (~270 of them).  512 KiB is 8 full frames, ~6,700 such tuples; the 128 frames
# of the frame window held ~35,000 before full frames.  2 MiB let the load balancer
# test's shuffle baseline outrun its slow worker (docs/flow_control.md, "Windows in
# bytes").  0: frames only.  It is a balanced stream's window and the least of a link's.
DEFAULT_WINDOW_BYTES = SDN_DEFAULTS.window_bytes
# A link's byte window follows its receiver: what that receiver consumed in the last
# PACE_S (its rate x PACE_S, bandwidth x delay), measured over RATE_S or more, between
# DEFAULT_WINDOW_BYTES and this.  3 MiB is no more than the 128 frames of the frame window
# held before full frames (~250 tuples of ~110 bytes each, 3.4 MB, ~32,000 tuples): a
# fast receiver queues no more than it could then, a slow one 512 KiB (docs/flow_control.md,
# "Windows that follow the receiver").  0: every link's window is DEFAULT_WINDOW_BYTES.
DEFAULT_WINDOW_BYTES_MAX = SDN_DEFAULTS.window_bytes_max
PACE_S = 0.05  # a link's byte window: its receiver's work for this long ...
RATE_S = 0.1  # ... at the rate it consumed over at least this long
MAX_WINDOW = 1 << 20  # frames kept for retransmission per link, far below 2**31
PROBE_S = 0.02  # unconfirmed frames this old make the sender probe with a SYNC
REFRESH_S = 0.1  # a receiver refreshes its grant this often while a link is in use
LINGER_S = 1.0  # ... and for this long after its last frame
NACK_S = 0.01  # a gap still open after this long is NACKed again
RETX_GUARD_S = 0.002  # the same frames are not sent again within this
ACK_SHARE = 4  # the sender asks for a grant every window // ACK_SHARE frames


def diff32(a: int, b: int) -> int:
    """``a - b`` for counters modulo 2**32, as a signed value in [-2**31, 2**31)."""
    d = (a - b) & MASK
    return d - U32 if d >= 1 << 31 else d


def check_window(window: int) -> int:
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"window must be an int in 1..{MAX_WINDOW}, got {window!r}")
    return window


def check_window_bytes(window_bytes: int | None) -> int | None:
    """A byte window as given (None or 0: none, frames only)."""
    if window_bytes is None or window_bytes == 0:
        return None
    if not isinstance(window_bytes, int) or isinstance(window_bytes, bool) or window_bytes < 0:
        raise ValueError(f"window_bytes must be an int >= 0, got {window_bytes!r}")
    return window_bytes


def window_fits(outstanding: int, size: int, window_bytes: int | None) -> bool:
    """Room for a frame of ``size`` bytes when ``outstanding`` bytes are not consumed yet.

    A frame larger than the whole window still goes once nothing is outstanding (the
    window is fully open): a window can delay a frame, never stop it for good.
    """
    return window_bytes is None or outstanding <= 0 or outstanding + size <= window_bytes


def paced_window(rate: float, least: int, most: int) -> int:
    """A link's byte window for a receiver that consumes ``rate`` bytes/s: its work for
    ``PACE_S``, no less than ``least`` and no more than ``most``."""
    return max(least, min(most, int(rate * PACE_S)))


def unwrap(value: int, ref: int) -> int:
    """The integer ``<= ref`` nearest to ``ref`` that equals ``value`` modulo 2**32."""
    return ref - ((ref - value) & MASK)
