"""Crafted hostile frames for every decoder that runs on received bytes.

``python tests/unit/wire_corpus.py`` (re)writes the seed corpus in
``fixtures/wire_corpus/``; tests/unit/test_wire_hostile.py replays every ``*.bin``
file there, so a frame that once broke a decoder can be dropped in and stays tested.
Each file is one whole Ethernet frame (app 7: worker 1 -> worker 2, the
controller -> worker 2, or worker 2 -> the controller).
"""

from __future__ import annotations

import struct
from pathlib import Path

from typhoon import wire
from typhoon.wire import Kind

CORPUS = Path(__file__).parent / "fixtures" / "wire_corpus"
APP, SRC, DST = 7, 1, 2
TS32 = b"\xd6\xff" + struct.pack("!I", 1)  # a msgpack timestamp (ext type -1, 4 bytes)


def nested(depth: int, leaf: bytes = TS32, head: bytes = b"\x91") -> bytes:
    """``depth`` containers one inside the other around ``leaf`` (built byte by byte:
    msgpack's own Packer refuses to nest this deep)."""
    return head * depth + leaf


def deep_metrics(depth: int, leaf: bytes = b"\x01") -> bytes:
    """A METRIC_RESP whose metrics are ``depth`` maps deep."""
    body = b"\x83" + b"\xaarequest_id\x01" + b"\xa6worker\x02" + b"\xa7metrics"
    return b"\x92\x04" + body + nested(depth, leaf, b"\x81\xa1a")


def data_frame(payload: bytes, stream: int = 1) -> bytes:
    src, dst = wire.worker_mac(APP, SRC), wire.worker_mac(APP, DST)
    return wire.pack_frames(dst, src, Kind.DATA, stream, 0, [payload], 64000)[0]


def control_frame(payload: bytes) -> bytes:
    """A control frame from the controller to worker 2."""
    dst, src = wire.worker_mac(APP, DST), wire.controller_mac(APP)
    return wire.pack_frames(dst, src, Kind.CONTROL, 0, 0, [payload], 64000)[0]


def reply_frame(payload: bytes) -> bytes:
    """A control frame from worker 2 to the controller (what the packet-in handler reads)."""
    dst, src = wire.controller_mac(APP), wire.worker_mac(APP, DST)
    return wire.pack_frames(dst, src, Kind.CONTROL, 0, 0, [payload], 64000)[0]


def seed_corpus() -> dict[str, bytes]:
    """name -> frame.  The deep ones are the issue's case: ~400 levels and ``d6 ff``."""
    ext5 = b"\xd4\x05\x00"  # fixext 1 of type 5
    return {
        "data_deep400_timestamp": data_frame(nested(400)),
        "data_rows_then_deep400": data_frame(b"\x93\x91\x01\x91\x02" + nested(398)),
        "data_deep150_plain": data_frame(nested(150, b"\x01")),
        "data_deep150_maps": data_frame(b"\x91\x91" + nested(150, b"\x01", b"\x81\xa1k")),
        "data_deep1100": data_frame(nested(1100, b"\x01")),
        "data_row_timestamp": data_frame(b"\x91\x92\x01" + TS32),
        "data_row_ext5": data_frame(b"\x91\x92\x01" + ext5),
        "data_row_ext_empty": data_frame(b"\x91\x91\xc7\x00\xff"),
        "data_truncated": data_frame(b"\x92\x91\x01\x93"),
        "data_not_rows": data_frame(b"\x93\x01\x02\x91\x03"),
        "control_deep400_timestamp": control_frame(nested(400)),
        "control_deep_metrics_timestamp": control_frame(deep_metrics(400, TS32)),
        "control_deep_metrics_plain": control_frame(deep_metrics(400)),
        "reply_deep_metrics_timestamp": reply_frame(deep_metrics(400, TS32)),
        "reply_deep_metrics_plain": reply_frame(deep_metrics(400)),
        "reply_deep400_timestamp": reply_frame(nested(400)),
    }


def write_corpus() -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    for name, frame in seed_corpus().items():
        (CORPUS / f"{name}.bin").write_bytes(frame)


if __name__ == "__main__":
    write_corpus()
