"""Framing of the ``tcp`` engine's byte streams: ``u32 length, u8 type, body``.

Type 0 is a wire-encoded control tuple, type 1 a msgpack map used for bootstrap
(``challenge`` from whoever accepted the connection, ``hello`` or ``peer`` from
whoever connected, ``peers`` from the coordinator).  Data connections carry the
wire frames themselves, each preceded by a u32 length.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from typhoon import wire
from typhoon.wire import ControlTuple, WireError

U32 = struct.Struct(">I")
MSG_CONTROL = 0
MSG_BOOT = 1
READ_CHUNK = 1 << 18
MAX_MESSAGE = 1 << 26
MAX_BOOT = 1 << 16  # what a connection may send before it is authenticated


def encode_message(mtype: int, body: bytes) -> bytes:
    return U32.pack(len(body) + 1) + bytes((mtype,)) + body


def encode_boot(msg: dict[str, Any]) -> bytes:
    return encode_message(MSG_BOOT, msgpack.packb(msg, use_bin_type=True))


def encode_control_message(ct: ControlTuple) -> bytes:
    return encode_message(MSG_CONTROL, wire.encode_control(ct))


class MessageReader:
    """Splits a byte stream into u32-length-prefixed messages."""

    def __init__(self, limit: int = MAX_MESSAGE) -> None:
        self.buf = bytearray()
        self.limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        buf = self.buf
        buf += data
        out = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (size,) = U32.unpack_from(buf, pos)
            if size > self.limit:
                raise WireError(f"message of {size} bytes exceeds the limit of {self.limit}")
            if n - pos - 4 < size:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out
