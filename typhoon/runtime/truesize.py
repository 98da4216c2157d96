"""What a frame costs in the kernel memory of the switch's port sockets.

Userspace Open vSwitch reads every port -- a worker's TAP device, a fabric link's
veth or NIC -- through a packet socket whose receive buffer (``net.core.rmem_default``
when the port was added: OVS does not set it) is charged the *truesize* of every
queued frame, not its length.  A frame that does not fit is dropped by the kernel,
silently for OVS.  Flow control therefore counts bytes of truesize
(docs/flow_control.md).

Measured on Linux 6.x by stopping ``ovs-vswitchd`` and reading ``ss -0 -m`` after
each frame, for every frame length from 60 to 9014 bytes in steps of 4:

* written to a TAP device by its worker: ``640 + ceil64(length)`` up to 3396
  bytes, then 4352 (to 3712), 8448 (to 7808), 12544 (to 9014);
* arriving from a veth (what one bridge sends another on the emulated fabric):
  832 (to 240), 1280 (to 688), 2304 (to 1712), 4352 (to 3760), 8448 (to 4108),
  9024 (to 8204), 13120 (to 9014).

:func:`truesize` is an upper bound for both, with the veth steps taken 64 bytes
early (the sender's headroom differs a little between the two paths).
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_RMEM = 212992  # Linux net.core.rmem_default

# (longest frame, truesize) steps of a frame queued on a veth's packet socket
_VETH_STEPS = ((176, 832), (624, 1280), (1648, 2304), (3696, 4352), (4044, 8448), (8140, 9024))
_VETH_MAX = 13952
# largest truesize any frame of up to 9014 bytes takes (a full jumbo frame on a veth)
MAX_TRUESIZE = _VETH_MAX
CREDIT_TRUESIZE = 832  # a credit frame (32-48 bytes) on either kind of socket


def _tap(length: int) -> int:
    if length <= 3396:
        return 640 + ((length + 63) & ~63)
    if length <= 3712:
        return 4352
    if length <= 7808:
        return 8448
    return 12544 + 4096 * max(0, (length - 9014 + 4095) // 4096)


def _veth(length: int) -> int:
    for longest, size in _VETH_STEPS:
        if length <= longest:
            return size
    return _VETH_MAX + 4096 * max(0, (length - 9014 + 4095) // 4096)


def truesize(length: int) -> int:
    """Kernel memory one frame of ``length`` bytes takes in any port socket (upper bound)."""
    if length <= 176:
        return 832
    t, v = _tap(length), _veth(length)
    return t if t > v else v


def default_rmem() -> int:
    """The receive buffer the switch's packet sockets get: ``net.core.rmem_default``."""
    try:
        return int(Path("/proc/sys/net/core/rmem_default").read_text())
    except (OSError, ValueError):
        return DEFAULT_RMEM


def default_budget() -> int:
    """A worker's byte budget when nobody computed its share: its own port's buffer,
    less room for the credit and control frames that share it."""
    rmem = default_rmem()
    return max(MAX_TRUESIZE, rmem - rmem // 8)
