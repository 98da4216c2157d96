"""Reliable, credit-paced links between workers over the switch (docs/flow_control.md).

A *link* carries data frames from one sender to one destination address: a
receiver's worker address (a unicast link, id 0) or the one-to-many address of a
stream (a multicast link, id = that stream: the switch copies every frame to each
*member*).  Every frame of a link has a sequence number, +1 per frame, modulo
2**32; the frames of one link follow one OpenFlow rule per bridge, so the switch
keeps them in order, and a gap means a frame was dropped.

Reliability (selective repeat).  The sender keeps every frame it sent until each
member has *consumed* it.  A receiver delivers a link's frames in sequence order
only: a frame after a gap waits (at most a window of them), and the receiver asks
for what is missing with a NACK ``[link, from, to)`` at once; the sender writes
those frames again (to the link's own address: on a multicast link the other
members drop the copies as duplicates).  A lost tail has no later frame to reveal
it: a sender whose frames stay unconfirmed for ``probe_s`` sends a SYNC carrying
its next sequence number on the link's own path (for a multicast link, to the
group address: the same rule as the data, so it cannot overtake it), and each
member answers with a NACK for what it lacks, or a GRANT.

Flow control.  A GRANT ``[link, consumed, received]`` carries a receiver's
cumulative counts; the sender may have at most ``window`` frames of a link beyond
any member's *consumed* count, and at most that member's byte window of frames (the
sender knows each frame's length, so the counts map to bytes without a wire change;
a frame larger than that goes once the member consumed everything): what the member
consumed in the last ``PACE_S``, between ``window_bytes`` and ``window_bytes_max``
(a slow receiver queues little, a fast one is not starved); and at most
``budget`` bytes (kernel truesize, see
:mod:`typhoon.runtime.truesize`) over all its links together -- the share of the
switch's socket buffers this worker may fill (:mod:`typhoon.port_budgets`).
Receivers grant when the sender asks: a data frame flagged ACK_REQ (the sender sets
it every quarter window, every quarter of the byte window, or every quarter of
its byte share on the link), a SYNC,
a duplicate, or a periodic refresh that repairs a lost grant.

Joining and restarts.  Before its first frame to a member, the sender sends that
member a SYNC with a *base*: where its part of the link starts.  A receiver
without state for a link takes the base of such a SYNC, or starts at frame 0;
frames of a link it knows nothing about are dropped and answered with a RESYNC,
which makes the sender send the base again (and repeat what followed).  A SYNC
base outside what the receiver holds (the sender restarted under the same id)
resets the receiver's state.

Everything here is pure bookkeeping: frames are opaque bytes, time is passed in.
The parts: ``protocol`` (frame kinds, windows, timers, sequence arithmetic),
``sender`` and ``receiver`` (each side's state).
"""

from typhoon.runtime.links.protocol import (
    ACK_SHARE,
    DEFAULT_WINDOW,
    DEFAULT_WINDOW_BYTES,
    DEFAULT_WINDOW_BYTES_MAX,
    GRANT,
    LB_GRANT,
    LB_SYNC,
    LINGER_S,
    MASK,
    MAX_WINDOW,
    NACK,
    NACK_S,
    PACE_S,
    PROBE_S,
    RATE_S,
    REFRESH_S,
    RESYNC,
    RETX_GUARD_S,
    SYNC,
    U32,
    check_window,
    check_window_bytes,
    diff32,
    paced_window,
    unwrap,
    window_fits,
)
from typhoon.runtime.links.receiver import InLink, Receiver
from typhoon.runtime.links.sender import MULTICAST_KEY, Member, OutLink, Sender

__all__ = [
    "ACK_SHARE",
    "DEFAULT_WINDOW",
    "DEFAULT_WINDOW_BYTES",
    "DEFAULT_WINDOW_BYTES_MAX",
    "GRANT",
    "LB_GRANT",
    "LB_SYNC",
    "LINGER_S",
    "MASK",
    "MAX_WINDOW",
    "MULTICAST_KEY",
    "NACK",
    "PACE_S",
    "NACK_S",
    "PROBE_S",
    "RATE_S",
    "REFRESH_S",
    "RESYNC",
    "RETX_GUARD_S",
    "SYNC",
    "U32",
    "InLink",
    "Member",
    "OutLink",
    "Receiver",
    "Sender",
    "check_window",
    "check_window_bytes",
    "diff32",
    "paced_window",
    "unwrap",
    "window_fits",
]
