"""A worker's TAP port: a non-persistent TAP device created by the worker itself.

The worker opens ``/dev/net/tun`` and attaches a TAP device (``IFF_TAP |
IFF_NO_PI``: whole Ethernet frames, no packet-information prefix).  The device is
*not* persistent: it lives exactly as long as this process holds the file
descriptor, so when the worker dies the kernel unregisters the device and the
switch reports its port down -- the fault detector's signal (docs/design.md §3).

The worker's agent adds the device to the host bridge as an ordinary (system)
port; Open vSwitch reads it through a packet socket, so what the worker
``write()``s is what the switch receives on that port and what the switch outputs
to the port is what the worker ``read()``s, one frame per call.

Measured with OVS 3.1 (``datapath_type=netdev``): the bridge takes a device created
by another process as a plain system port; after the worker is killed the port
reports ``LINK_DOWN`` within ~10 ms.  A device created again under the same name
shows the port LIVE again but the datapath keeps reading the vanished one: the
agent must delete and re-add the port (two separate ``ovs-vsctl`` calls).

Before the device goes up its IPv6 is switched off, so the kernel never emits
neighbour discovery or MLD frames of its own into the port (there is no IPv4
address either): every frame on a worker port is a Typhoon frame.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import struct

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_UP = 0x1
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
SIOCSIFMTU = 0x8922
SIOCSIFHWADDR = 0x8924
SIOCSIFTXQLEN = 0x8943
ARPHRD_ETHER = 1
IFNAMSIZ = 16

DEFAULT_MTU = 9000
# Frames the switch may queue toward the worker before the kernel drops them (the
# tun driver's default is 500).  Credit-based flow control bounds what is in flight
# to every receiver at (upstream senders x window) frames; 4096 leaves room for
# 32 upstream senders at the default window of 128 (more when, as with large frames,
# the byte budget keeps a sender below its window).
DEFAULT_TXQUEUELEN = 4096

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}")


def tap_name(app_id: int, worker_id: int) -> str:
    """Default device name of a worker's port: ``ty`` + app id + worker id in hex (10 chars)."""
    if not 0 <= app_id <= 0xFFFF or not 0 <= worker_id <= 0xFFFF:
        raise ValueError(f"app_id and worker_id must be u16, got {app_id}, {worker_id}")
    return f"ty{app_id:04x}{worker_id:04x}"


def check_name(name: str) -> str:
    """A valid Linux interface name (≤ 15 chars, no '/', not '.' or '..')."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"not a valid interface name: {name!r}")
    return name


def _ifreq(name: str, fmt: str = "", *values: object) -> bytes:
    """A ``struct ifreq``: the name padded to 16 bytes, then the union (24 bytes)."""
    body = struct.pack(fmt, *values) if fmt else b""
    return struct.pack("16s", name.encode()) + body.ljust(24, b"\0")


def _disable_ipv6(name: str) -> None:
    path = f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6"
    try:
        with open(path, "w") as f:
            f.write("1")
    except FileNotFoundError:  # kernel without IPv6
        pass


class Tap:
    """An open TAP device; non-blocking; closed (and removed) with :meth:`close`."""

    def __init__(
        self,
        name: str,
        mtu: int = DEFAULT_MTU,
        txqueuelen: int | None = DEFAULT_TXQUEUELEN,
        mac: bytes | None = None,
    ) -> None:
        self.name = check_name(name)
        self.mtu = mtu
        self.fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
        try:
            # TUNSETIFF creates the device (or attaches to an idle persistent one; a
            # device held by another process makes this fail with EBUSY)
            fcntl.ioctl(self.fd, TUNSETIFF, _ifreq(name, "H", IFF_TAP | IFF_NO_PI))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                if mac is not None:
                    if len(mac) != 6:
                        raise ValueError("mac must be 6 bytes")
                    fcntl.ioctl(s, SIOCSIFHWADDR, _ifreq(name, "H6s", ARPHRD_ETHER, bytes(mac)))
                fcntl.ioctl(s, SIOCSIFMTU, _ifreq(name, "i", mtu))
                if txqueuelen is not None:
                    fcntl.ioctl(s, SIOCSIFTXQLEN, _ifreq(name, "i", txqueuelen))
                _disable_ipv6(name)
                flags = struct.unpack_from("H", fcntl.ioctl(s, SIOCGIFFLAGS, _ifreq(name)), 16)[0]
                fcntl.ioctl(s, SIOCSIFFLAGS, _ifreq(name, "H", flags | IFF_UP))
            os.set_blocking(self.fd, False)
        except BaseException:
            os.close(self.fd)
            self.fd = -1
            raise

    def fileno(self) -> int:
        return self.fd

    def read(self, size: int | None = None) -> bytes | None:
        """One frame, or None when nothing is waiting (the fd is non-blocking)."""
        try:
            return os.read(self.fd, size or self.mtu + 64)
        except BlockingIOError:
            return None

    def write(self, frame: bytes) -> int:
        """Hand one frame to the switch port."""
        return os.write(self.fd, frame)

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self) -> None:
        """Close the descriptor; the kernel removes the device."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Tap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
