"""Typhoon MAC addresses: what a flow rule matches on (layout in ``typhoon/wire/__init__.py``).

The switch routes on the Ethernet addresses alone, so a worker, the controller,
a load-balancer slot and a one-to-many group each get an address of their own
that names the application too.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from enum import IntEnum

from typhoon.wire.checks import MAX_ID, U16_MAX, WireError, check_int

LB_SLOTS = 256


class AddrClass(IntEnum):
    WORKER = 0
    CONTROLLER = 1
    LOAD_BALANCER = 2
    MULTICAST = 3


_CLASSES = tuple(AddrClass)
_MAC = struct.Struct("!BHBH")


def _mac(first: int, app_id: int, cls: AddrClass, value: int) -> bytes:
    check_int("app_id", app_id, 1, MAX_ID)
    return _MAC.pack(first, app_id, cls, value)


def worker_mac(app_id: int, worker_id: int) -> bytes:
    """Address of one worker's TAP port."""
    return _mac(0x02, app_id, AddrClass.WORKER, check_int("worker_id", worker_id, 1, MAX_ID))


def controller_mac(app_id: int) -> bytes:
    """Address the switch sends to OFPP_CONTROLLER (worker -> controller tuples)."""
    return _mac(0x02, app_id, AddrClass.CONTROLLER, 0)


def lb_mac(app_id: int, node_index: int, slot: int) -> bytes:
    """Virtual address of one load-balancer slot of a node (``sdn`` grouping)."""
    check_int("node_index", node_index, 0, 0xFF)
    check_int("slot", slot, 0, LB_SLOTS - 1)
    return _mac(0x02, app_id, AddrClass.LOAD_BALANCER, node_index << 8 | slot)


def multicast_mac(app_id: int, stream_id: int) -> bytes:
    """One-to-many group address: one frame, the switch copies it (``all`` grouping)."""
    return _mac(0x03, app_id, AddrClass.MULTICAST, check_int("stream_id", stream_id, 0, U16_MAX))


@dataclass(frozen=True)
class Address:
    """A parsed Typhoon MAC address."""

    app_id: int
    cls: AddrClass
    value: int


def parse_mac(mac: bytes) -> Address:
    """Split a Typhoon MAC into its parts; anything else is a :class:`WireError`."""
    if not isinstance(mac, (bytes, bytearray, memoryview)) or len(mac) != 6:
        raise WireError(f"not a 6-byte MAC: {mac!r}")
    first, app_id, cls, value = _MAC.unpack(bytes(mac))
    if first not in (0x02, 0x03):
        raise WireError(f"not a Typhoon address (first byte {first:#04x})")
    if not 1 <= app_id <= MAX_ID:
        raise WireError(f"reserved application id {app_id:#06x}")
    if cls >= len(_CLASSES):
        raise WireError(f"unknown address class {cls}")
    if (first == 0x03) != (cls == AddrClass.MULTICAST):
        raise WireError("multicast bit does not match the address class")
    if cls == AddrClass.WORKER and not 1 <= value <= MAX_ID:
        raise WireError(f"reserved worker id {value:#06x}")
    if cls == AddrClass.CONTROLLER and value != 0:
        raise WireError("controller address must have value 0")
    return Address(app_id, _CLASSES[cls], value)


_MAC_RE = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}")


def mac_str(mac: bytes) -> str:
    """Colon notation, as OVS and Ryu print addresses."""
    if len(mac) != 6:
        raise ValueError(f"MAC must be 6 bytes, got {len(mac)}")
    return bytes(mac).hex(":")


def mac_bytes(s: str) -> bytes:
    """Inverse of :func:`mac_str`."""
    if not isinstance(s, str) or not _MAC_RE.fullmatch(s):
        raise ValueError(f"not a MAC address: {s!r}")
    return bytes.fromhex(s.replace(":", ""))
