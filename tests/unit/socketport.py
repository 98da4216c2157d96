"""A worker's "TAP" made of one end of a socketpair, for transport tests without OVS."""

from __future__ import annotations

import socket


class Port:
    """The worker's end of its "TAP": non-blocking, one frame per read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self, size: int | None = None) -> bytes | None:
        try:
            return self.sock.recv(size or 65536)
        except BlockingIOError:
            return None

    def write(self, frame: bytes) -> int:
        return self.sock.send(frame)

    def close(self) -> None:
        self.sock.close()
